"""The planner's typed results and bounds (issues 51.1, 53.3, 55.1): failures are typed, never read
from their text; `Plan` is built by keyword; every row carries expected, ideal-policy and (from
plan_model) peak-bound speeds; the spec-only resident-weights check runs before any trace exists;
synthetic planning traces come from a content-hashed cache."""

from __future__ import annotations

import pytest

from analysis.plan_eval import CANNOT_RUN, DOES_NOT_FIT, Planner, resident_floor_bytes
from analysis.plan_setup import cache_dir, planning_trace
from analysis.planner import Plan, plan
from devices import load_model, load_profile
from devices.model_spec import ModelSpec
from sim.policies.presets import preset_config
from traces.data import shipped_trace_path
from traces.format import open_trace

MIB = 2**20


@pytest.fixture(scope="module")
def smol():
    return open_trace(shipped_trace_path())


@pytest.fixture(scope="module")
def nano():
    return load_profile("jetson-orin-nano-8gb")


def test_resident_weights_checked_from_the_spec_before_any_trace(nano) -> None:
    spec = load_model("llama-3.2-3b")
    budget = 1024 * MIB                    # 3B in fp16: ~1.2 GiB of embeddings and attention alone

    def no_trace():
        raise AssertionError("the trace was asked for although nothing can fit")

    grid = (("dense", ()), ("naive", ()), ("llm-in-a-flash", ("window.k=5",)))
    p = plan(no_trace, spec, nano, budget_bytes=budget, grid=grid)
    assert resident_floor_bytes(preset_config("naive"), spec) == spec.non_ffn_bytes > budget
    assert not p.feasible and p.runs == 0
    for r in p.rows:
        assert r["reasons"][0].startswith("does not fit: DRAM budget 1.00 GiB is too small: the resident non-FFN "
                                          "weights alone are"), r["reasons"]
    assert p.to_json()["trace"]["path"] is None


def test_paging_has_no_spec_floor() -> None:
    spec = load_model("llama-3.2-3b")
    assert resident_floor_bytes(preset_config("mmap"), spec) == 0     # the page cache holds what fits
    q4 = preset_config("quantized").with_overrides(["quantized.bits=4"])
    assert resident_floor_bytes(q4, spec) == spec.with_dtype("int4").non_ffn_bytes < spec.non_ffn_bytes


def test_failures_are_typed_not_read_from_text(smol, nano) -> None:
    pl = Planner(smol, smol.spec, nano)
    small = pl.evaluate("dense", (), 64 * MIB)                    # the simulator's BudgetError
    assert small.failure == DOES_NOT_FIT and not small.ran
    # "--dram-budget ... exceeds the DRAM of the device" names the budget but is not a shortfall
    over = pl.evaluate("dense", (), 2 * nano.memory.capacity_bytes)
    assert over.failure == CANNOT_RUN and "budget" in over.error.lower()


def test_plan_is_built_by_keyword() -> None:
    with pytest.raises(TypeError):
        Plan("m", "d", 1, None, None, {}, [], None, None, [], {}, "compute")  # type: ignore[misc]


def test_rows_carry_the_ideal_policy_bound(smol, nano) -> None:
    grid = (("naive", ()), ("llm-in-a-flash", ("window.k=1",)))
    p = plan(smol, smol.spec, nano, grid=grid, tolerance_bytes=2**30)     # a coarse bisection: few runs
    rows = {r["label"]: r for r in p.rows}
    # naive has no predictor or prefetch: its ideal-policy bound is its own run, not another one
    assert rows["naive"]["ideal_policy_tokens_per_s"] == rows["naive"]["tokens_per_s"]
    # llm-in-a-flash's ideal is the oracle predictor at the same rank: a separate run
    oracle = Planner(smol, smol.spec, nano).evaluate("llm-in-a-flash", ("window.k=1", "predictor=oracle",
                                                                        "oracle.rank=128"), nano.available_bytes)
    assert rows["llm-in-a-flash window.k=1"]["ideal_policy_tokens_per_s"] == pytest.approx(oracle.metric("tokens_per_s"))
    pl = Planner(smol, smol.spec, nano)
    assert pl.evaluate("naive", (), 10**9, ideal=True) is pl.evaluate("naive", (), 10**9) and pl.n_runs == 1


def test_synthetic_planning_traces_are_cached_by_content(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLASHSIM_CACHE_DIR", str(tmp_path))
    keep = tmp_path / "plan-traces" / "not-ours.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("a file the cache did not write")
    spec = ModelSpec.from_hf_config({"model_type": "opt", "hidden_size": 64, "ffn_dim": 256, "num_hidden_layers": 2,
                                     "num_attention_heads": 4, "vocab_size": 128, "activation_function": "relu"},
                                    "tiny-opt")
    a, info_a, _ = planning_trace(spec, tokens=4, seed=1)
    b, info_b, _ = planning_trace(spec, tokens=4, seed=1)
    c, info_c, _ = planning_trace(spec, tokens=4, seed=2)
    assert not info_a["cached"] and info_b["cached"] and not info_c["cached"]
    assert a.path == b.path != c.path and a.path.parent == cache_dir() / "plan-traces"
    assert keep.read_text() == "a file the cache did not write"
    assert not [p for p in a.path.parent.iterdir() if p.name.startswith(".tmp-")]   # no temporary left


def test_progress_is_one_line_per_stage_in_a_log(capsys) -> None:
    """stderr is not a terminal here: one line per stage as it ends, with its simulated runs."""
    from flashsim.main import main

    assert main(["plan", "--model", "smollm2-135m", "--device", "jetson-orin-nano-8gb", "--trace",
                 str(shipped_trace_path()), "--dram-free", "64MiB", "--native-only", "--json"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split(":")[2].strip() for line in err] == [
        "loading model and device", "checking resident weights against the budget (model spec)", "loading trace",
        "simulating"]
    assert all(line.startswith("flashsim: plan: ") and "\r" not in line for line in err)


def test_the_runtime_prices_every_configuration_and_is_reported(smol, nano) -> None:
    """`plan --runtime`: every configuration is priced with that runtime's kernels (eager PyTorch's 24 + 9
    per layer at 15 us dispatch decode slower than llama.cpp's), and the plan says which it used."""
    grid = (("naive", ()),)
    fused = plan(smol, smol.spec, nano, grid=grid, tolerance_bytes=2**30)
    eager = plan(smol, smol.spec, nano, grid=grid, tolerance_bytes=2**30, runtime="eager-pytorch")
    assert fused.runtime == "llama.cpp" and eager.to_json()["runtime"] == "eager-pytorch"
    assert eager.rows[0]["tokens_per_s"] < fused.rows[0]["tokens_per_s"]
