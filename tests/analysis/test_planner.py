"""The what-if planner: hand-checkable cases on the shipped SmolLM2 trace, the bisection, the
trace it synthesizes, the JSON contract and bad input through `flashsim plan`."""

from __future__ import annotations

import json

import pytest

from analysis.plan_setup import native_grid, planning_trace
from analysis.planner import (
    COMPUTE,
    DRAM_BW,
    FLASH,
    MEM_CAP,
    MEM_MGMT,
    Evaluation,
    Planner,
    binding_constraint,
    bisect_min_budget,
    plan,
    reasons,
)
from devices import load_profile
from devices.model_spec import ModelSpec
from flashsim.main import main
from traces.data import shipped_trace_path
from traces.format import open_trace

MIB = 2**20
SMALL_GRID = (("dense", ()), ("naive", ()), ("hybrid", ("hybrid.fraction=0.5",)),
              ("llm-in-a-flash", ("window.k=5",)))


@pytest.fixture(scope="module")
def smol():
    return open_trace(shipped_trace_path())


@pytest.fixture(scope="module")
def nano():
    return load_profile("jetson-orin-nano-8gb")


def test_tiny_model_that_fits_gets_dense(smol, nano) -> None:
    # SmolLM2-135M (~270 MB fp16) in 6.5 GiB: dense reads nothing from flash and computes every
    # neuron; naive/hybrid re-read FFN weights every token and LLM in a flash pays reads and gathers.
    p = plan(smol, smol.spec, nano, grid=SMALL_GRID)
    assert p.feasible and p.best is not None
    assert p.best["label"] == "dense"
    assert p.best["flash_bytes_per_token"] == 0 and p.best["activation_mass_kept"] == 1.0
    # batch 1: ~270 MB of weights per token at the DRAM bandwidth take far longer than 2 x 135M FLOPs
    # at the GPU's rate, so the compute time is weight streaming: DRAM bandwidth, not compute
    assert p.best["binding_constraint"] == DRAM_BW
    assert p.best["compute_dram_ms_per_token"] > 10 * p.best["compute_flop_ms_per_token"]
    rows = {r["label"]: r for r in p.rows}
    assert rows["naive"]["binding_constraint"] == FLASH  # 152 MiB read per token
    assert all(r["feasible"] for r in p.rows)
    # dense dominates naive and hybrid (faster, full quality) but needs more DRAM than they do
    labels = [r["label"] for r in p.pareto]
    assert "dense" in labels and "naive" in labels
    # no target: the smallest DRAM the best (dense) runs in = its constant footprint, rounded up to the grid
    tol = p.min_dram["tolerance_bytes"]
    assert p.min_dram["configuration"] == "dense"
    assert p.to_json()["min_dram_bytes"] == -(-int(p.best["dram_peak_bytes"]) // tol) * tol


def test_budget_below_resident_minimum_is_infeasible(smol, nano) -> None:
    budget = 64 * MIB
    assert smol.spec.non_ffn_bytes > budget  # embeddings + attention alone do not fit
    p = plan(smol, smol.spec, nano, budget_bytes=budget, grid=SMALL_GRID, target_tps=1e9)
    assert not p.feasible and p.best is None and p.closest is None
    assert all(not r["fits"] and r["reasons"][0].startswith("does not fit") for r in p.rows)
    assert p.binding == MEM_CAP and p.pareto == []
    j = p.to_json()
    assert j["feasible"] is False and j["best"] is None and j["min_dram_bytes"] is None  # 1e9 tok/s: never


def test_min_dram_meets_target_and_one_step_less_does_not(smol, nano) -> None:
    tol = 16 * MIB
    grid = (("llm-in-a-flash", ("window.k=5",)),)
    p = plan(smol, smol.spec, nano, target_tps=60.0, grid=grid, tolerance_bytes=tol)
    b = p.min_dram["bytes"]
    assert b is not None and b % tol == 0 and b <= nano.available_bytes
    check = Planner(smol, smol.spec, nano)
    at_b = check.evaluate("llm-in-a-flash", ("window.k=5",), b)
    below = check.evaluate("llm-in-a-flash", ("window.k=5",), b - tol)
    assert not reasons(at_b, 60.0, None)
    assert reasons(below, 60.0, None)


def test_bisect_min_budget_by_hand() -> None:
    calls = []

    def ok(b: int) -> bool:
        calls.append(b)
        return b >= 1000

    assert bisect_min_budget(ok, 4096, 64) == 1024  # 16 * 64: the first multiple of 64 >= 1000
    assert 960 in calls  # 1024 - 64 was evaluated and failed
    assert bisect_min_budget(lambda b: b >= 5000, 4096, 64) is None
    assert bisect_min_budget(ok, 4096, 64, known_bad_bytes=900) == 1024


def test_bisect_hint_narrows_the_search_and_keeps_the_answer() -> None:
    """A likely-passing budget (the DRAM a run at the top used) in the lower half of the bracket is the
    first probe: by hand, 1010 rounds up to 1024 (16 x 64), which passes, so the search runs in (0, 16]
    instead of (0, 64]: 6 probes (the top, the hint, then 8, 12, 14, 15) instead of 7. A hint that
    fails (960) is a lower bound; one in the upper half (3000) or outside the bracket is not probed
    (a halving narrows more): the answer is 1024 every time."""
    calls: list[int] = []

    def ok(b: int) -> bool:
        calls.append(b)
        return b >= 1000

    assert bisect_min_budget(ok, 4096, 64, likely_ok_bytes=1010) == 1024
    assert calls == [4096, 1024, 512, 768, 896, 960]
    for hint in (960, 3000, 5000, 0):
        calls.clear()
        assert bisect_min_budget(ok, 4096, 64, likely_ok_bytes=hint) == 1024
        assert 960 in calls and 1024 in calls
        assert 3008 not in calls                  # the upper-half hint (47 x 64) is never probed


def test_binding_constraint_from_breakdown() -> None:
    s = {"stall_ms_per_token": 5.0, "compute_ms_per_token": 2.0, "memory_mgmt_ms_per_token": 0.5,
         "dram_peak_bytes": 10}
    assert binding_constraint(s, 1000) == FLASH
    assert binding_constraint({**s, "dram_peak_bytes": 990}, 1000) == MEM_CAP  # cache full: more DRAM helps
    assert binding_constraint({**s, "stall_ms_per_token": 1.0}, 1000) == "compute"   # no split known
    # the compute time split by what bounds it (FLOPs at the FLOP rate vs bytes at the DRAM bandwidth)
    streaming = {**s, "stall_ms_per_token": 1.0, "compute_flop_ms_per_token": 0.1, "compute_dram_ms_per_token": 1.9}
    assert binding_constraint(streaming, 1000) == DRAM_BW
    flops = {**streaming, "compute_flop_ms_per_token": 1.9, "compute_dram_ms_per_token": 0.4}
    assert binding_constraint(flops, 1000) == COMPUTE
    assert binding_constraint({**s, "stall_ms_per_token": 0.1, "memory_mgmt_ms_per_token": 3.0}, 1000) == MEM_MGMT
    assert binding_constraint(None, 1000) == MEM_CAP
    ev = Evaluation("dense", (), 10, summary={"tokens_per_s": 3.0, "activation_mass_kept": 0.5})
    assert reasons(ev, 5.0, 0.9) == ["too slow: 3.00 tok/s < 5", "quality too low: activation mass kept 0.500 < 0.9"]


def test_native_grid_has_no_quantized() -> None:
    g = native_grid()
    assert g and all(p != "quantized" and "precision=quantized" not in o for p, o in g)


def test_relu_model_gets_relu_like_synthetic_trace(tmp_path) -> None:
    spec = ModelSpec.from_hf_config({"model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2,
                                     "num_attention_heads": 4, "vocab_size": 128, "activation_function": "relu"},
                                    "tiny-opt")
    assert spec.ffn_kind == "relu"
    tr, info, rescale = planning_trace(spec, str(tmp_path / "t"), tokens=64, seed=0)
    assert info["synthetic"] and info["assumption"]["active_fraction"] == 0.03 and not rescale
    assert "ReLU-like" in info["description"]
    active = sum(int(tr.mask(layer, range(tr.n_tokens)).sum()) for layer in range(tr.n_layers))
    assert 0.01 < active / (tr.n_tokens * tr.n_layers * tr.n_neurons) < 0.06  # ~3% active


def test_plan_cli_json_contract(capsys) -> None:
    rc = main(["plan", "--model", "smollm2-135m", "--device", "jetson-orin-nano-8gb", "--trace",
               str(shipped_trace_path()), "--target-tps", "50", "--native-only", "--json"])
    out = capsys.readouterr().out
    d = json.loads(out)
    assert rc == 0
    assert isinstance(d["feasible"], bool) and d["feasible"]
    assert d["best"]["tokens_per_s"] >= 50 and d["best"]["feasible"]
    assert isinstance(d["pareto"], list) and d["pareto"]
    assert isinstance(d["min_dram_bytes"], int)
    assert d["trace"]["synthetic"] is False and d["binding_constraint"]
    assert all({"label", "feasible", "reasons", "tokens_per_s", "dram_peak_bytes", "activation_mass_kept"}
               <= set(r) for r in d["configurations"])


def test_plan_cli_says_synthetic(capsys) -> None:
    rc = main(["plan", "--model", "smollm2-135m", "--device", "this-host", "--tokens", "8", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["trace"]["synthetic"] is True and "synthetic" in d["trace"]["description"]
    assert d["trace"]["source"].endswith("smollm2-135m-builtin")


@pytest.mark.parametrize("argv, needle", [
    (["--model", "no-such-model", "--device", "jetson-orin-nano-8gb"], "no-such-model"),
    (["--model", "llama-3.2-3b", "--device", "no-such-device"], "no-such-device"),
    (["--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb", "--dram-free=-1GiB"], "--dram-free"),
    (["--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb", "--dram-free", "lots"], "--dram-free"),
    (["--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb", "--dram-free", "64GiB"], "exceeds"),
    (["--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb", "--min-quality", "2"], "--min-quality"),
    (["--model", "llama-3.2-3b", "--device", "jetson-orin-nano-8gb", "--target-tps", "-1"], "--target-tps"),
])
def test_plan_bad_input_exit_2(capsys, argv, needle) -> None:
    rc = main(["plan", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_plan_is_deterministic(smol, nano) -> None:
    grid = (("llm-in-a-flash", ("window.k=5", "predictor=noisy", "noisy.recall=0.9")), ("naive", ()))
    a = plan(smol, smol.spec, nano, grid=grid, target_tps=20.0, seed=3).to_json()
    b = plan(smol, smol.spec, nano, grid=grid, target_tps=20.0, seed=3).to_json()
    for timing in ("plan_seconds", "simulated_run_seconds", "stage_seconds"):
        a.pop(timing), b.pop(timing)
    assert a == b


def test_plan_on_threads_equals_plan_on_one(smol, nano, monkeypatch) -> None:
    """Independent runs on several threads (Planner.evaluate_many) give the answers of one thread,
    run each configuration once, and draw each layer of the noisy predictors once: llm-in-a-flash's
    three windows and NeuroPrefetcher's other recall and precision share one draw per layer."""
    from sim.policies.predictor import NoisyPredictor

    grid = (("llm-in-a-flash", ("window.k=1",)), ("llm-in-a-flash", ("window.k=5",)),
            ("llm-in-a-flash", ("window.k=20",)), ("neuroprefetcher", ()), ("selectinfer", ()), ("naive", ()))
    draws = []
    real_draw = NoisyPredictor._draw_family
    monkeypatch.setattr(NoisyPredictor, "_draw_family", lambda self, family, layer: draws.append(layer) or
                        real_draw(self, family, layer))
    one = plan(smol, smol.spec, nano, grid=grid, target_tps=20.0, workers=1)
    assert sorted(draws) == list(range(smol.n_layers))
    draws.clear()
    many = plan(smol, smol.spec, nano, grid=grid, target_tps=20.0, workers=3)
    assert sorted(draws) == list(range(smol.n_layers))
    assert many.runs == one.runs
    a, b = one.to_json(), many.to_json()
    for timing in ("plan_seconds", "simulated_run_seconds", "stage_seconds"):
        a.pop(timing), b.pop(timing)
    assert a == b


def test_issue46_energy_limit_filters(smol, nano) -> None:
    free = plan(smol, smol.spec, nano, grid=SMALL_GRID)
    jpts = sorted(r["joules_per_token"] for r in free.rows if r["fits"])
    assert len(jpts) >= 2 and jpts[0] < jpts[1]
    limit = (jpts[0] + jpts[1]) / 2
    p = plan(smol, smol.spec, nano, grid=SMALL_GRID, max_jpt=limit)
    for r in (r for r in p.rows if r["fits"]):
        assert r["feasible"] == (r["joules_per_token"] <= limit)
        assert r["feasible"] or any(x.startswith("too much energy") for x in r["reasons"])
    assert p.best is not None and p.best["joules_per_token"] <= limit
    assert p.to_json()["max_joules_per_token"] == limit
    none = plan(smol, smol.spec, nano, grid=SMALL_GRID, max_jpt=jpts[0] / 2)
    assert none.best is None
    # energy is a Pareto axis: the least-energy configuration that ran is on the front
    least = min((r for r in free.rows if r["fits"]), key=lambda r: r["joules_per_token"])
    assert least["label"] in {r["label"] for r in free.pareto}


def test_issue46_energy_limit_bad_input(capsys) -> None:
    rc = main(["plan", "--model", "smollm2-135m", "--device", "jetson-orin-nano-8gb", "--max-joules-per-token", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--max-joules-per-token" in err and len(err.strip().splitlines()) == 1
