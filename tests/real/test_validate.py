"""`flashsim validate`: the JSON contract, the error summaries, bad input."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from devices.model_spec import ModelSpec
from flashsim.main import main
from real.validation import validate as V
from real.validation import validate_grid as G
from real.validation import validate_runs as R
from real.validation import validate_score as S

pytest.importorskip("torch")


def test_full_grid_has_at_least_24_configurations():
    assert len(G.grid(quick=False)) >= 24
    assert {p.k for p in G.grid(False)} == {0, 1, 2, 4, 8}
    assert len({p.budget_fraction for p in G.grid(False)}) == 2


def tiny_grids(monkeypatch, tmp_path):
    """A tiny shape-mode spec and a tiny random llama (with its store) in place of SmolLM2."""
    import numpy as np
    import transformers

    from real.weights.convert import convert_state_dict
    from real.weights.store import open_store

    tiny = ModelSpec(name="validate-tiny", family="llama", n_layers=2, d_model=1024, d_ff=256, n_heads=8,
                     n_kv_heads=4, head_dim=128, vocab_size=512, ffn_kind="swiglu", dtype="fp32")
    monkeypatch.setattr(V, "validation_spec", lambda quick: tiny)
    monkeypatch.setattr(V, "grid", lambda quick: [G.GridPoint(0, True, "none", 0.5), G.GridPoint(2, False, "delta", 0.25)])
    monkeypatch.setattr(V, "model_grid", lambda quick: [G.GridPoint(0, True, "none", 0.5), G.GridPoint(2, True, "delta", 0.5)])
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    mspec = ModelSpec.from_hf_config(cfg.to_dict(), name="tiny-llama")
    store = open_store(convert_state_dict(model.state_dict(), mspec, tmp_path / "mstore", dtype="fp32", layout="both"))
    calls = []

    def setup(n_tokens, workdir):
        calls.append(n_tokens)
        return model, mspec, store, np.random.default_rng(0).integers(0, 200, n_tokens)

    monkeypatch.setattr(R, "model_setup", setup)
    return calls


def test_validate_json_contract_on_a_tiny_grid(monkeypatch, tmp_path, capsys):
    calls = tiny_grids(monkeypatch, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    # the dense modes' contract (the moe mode's rows: tests/real/test_validate_moe.py)
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--plot", str(tmp_path / "plots"),
                 "--workdir", str(work), "--repeats", "1", "--modes", "shape,model"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("n_configs", "latency_error_median", "latency_error_p90", "latency_error_max", "per_metric", "per_mode"):
        assert key in out
    assert out["n_configs"] == 4 and len(out["configs"]) == 4 and calls == [6]
    assert sum(g["n_configs"] for g in out["per_group"]) == 4
    assert all(g["drift_corrected_median"] is not None for g in out["per_group"])
    assert [c["mode"] for c in out["configs"]] == ["shape", "shape", "model", "model"]
    # both replay exactly the same reads: shape mode's rows are exactly 4 KiB; the tiny llama's 768 B bundles
    # sit in 4 KiB padded strides, which the real reads move and the replay's layout (align_bytes from the
    # store's manifest) counts: bytes read agree exactly in both modes
    for mode in ("shape", "model"):
        assert out["per_mode"][mode]["per_metric"]["bytes_read"]["max"] == 0.0
    for c in out["configs"]:
        assert c["metrics"]["bytes_read"]["sim"] == c["metrics"]["bytes_read"]["real"] > 0
    model_real = [c["metrics"]["bytes_read"]["real"] for c in out["configs"] if c["mode"] == "model"]
    assert all(b % 4096 == 0 for b in model_real)       # whole padded strides (a useful bundle is 768 B)
    assert set(out["per_metric"]) == set(S.METRICS) | set(S.OPTIONAL_METRICS)
    assert out["threads"] == 1 and out["compute_threads"] == 1 and out["check_every_s"] == 10.0
    for key in ("load_avg_start", "load_avg_end"):
        assert len(out[key]) == 3 and all(x >= 0 for x in out[key])
    assert 0.0 <= out["latency_error_median"] <= out["latency_error_max"]
    # the host against the profile, before and after the grid (real/validation/drift.py)
    assert set(out["drift"]) == {"start", "end"} and "drift_warning" in out
    for check in out["drift"].values():
        assert check["disk"] > 0 and (check["cpu"] is None or check["cpu"] > 0) and check["t_s"] >= 0
    assert out["drift"]["end"]["t_s"] >= out["drift"]["start"]["t_s"]
    checks = out["drift_checks"]
    assert checks[0] == out["drift"]["start"] and checks[-1] == out["drift"]["end"] and len(checks) >= 2
    # the same runs replayed on the profile as the checks found the host during each run: a diagnostic apart
    dc = out["drift_corrected"]
    assert dc["checks"] == len(checks)
    lo, hi = min(c["disk"] for c in checks), max(c["disk"] for c in checks)
    assert all(lo - 1e-12 <= c["drift_corrected"]["disk_ratio"] <= hi + 1e-12 for c in out["configs"])
    assert dc["disk_ratio"] == pytest.approx(np.mean([c["drift_corrected"]["disk_ratio"] for c in out["configs"]]))
    assert 0.0 <= dc["latency_error_median"] <= dc["latency_error_p90"] <= dc["latency_error_max"]
    assert dc["latency_error_max"] == pytest.approx(max(c["drift_corrected"]["latency_error"] for c in out["configs"]))
    for c in out["configs"]:   # one entry per real run: its midpoint, inside the grid, and the host there
        runs = c["drift_corrected"]["runs"]
        assert len(runs) == out["repeats"] == 1
        assert checks[0]["t_s"] <= runs[0]["t_s"] <= checks[-1]["t_s"]
        assert runs[0]["disk"] == pytest.approx(c["drift_corrected"]["disk_ratio"])
    for mode in ("shape", "model"):
        pm = out["per_mode"][mode]
        assert pm["n_configs"] == 2 and set(pm["per_metric"]) == set(S.METRICS) | set(S.OPTIONAL_METRICS)
        errs = [c["metrics"]["latency_s"]["error"] for c in out["configs"] if c["mode"] == mode]
        assert pm["latency_error_max"] == pytest.approx(max(errs))
    assert out["per_mode"]["model"]["model"] == "tiny-llama"
    assert 0.0 <= out["per_mode"]["model"]["quality"]["greedy_agreement"] <= 1.0
    assert (tmp_path / "plots" / "validate_scatter.png").stat().st_size > 0
    assert list(work.iterdir()) == []   # temporary store and traces removed
    # one pass: the floor has no repeat spread, the fixed targets alone apply
    lat = out["floor"]["metrics"]["latency_s"]
    assert lat["real_repeat_p50"] is None and lat["limit_p50"] == 0.05 and lat["limit_p90"] == 0.10
    assert out["calibration"]["grid_configs"] == [] and out["floor"]["excluded_configs"] == []
    # one mode only, the default three passes; and the text report
    assert main(["validate", "--quick", "--tokens", "6", "--modes", "model", "--workdir", str(work)]) == 0
    text = capsys.readouterr().out
    assert "2 configurations (model: 2)" in text and "greedy agreement" in text
    assert "host checks found it during each run" in text
    assert "group (sim - real: > 0 = simulated slow)" in text
    assert "host vs profile (measured / profiled time): start disk " in text and "after I/O" not in text
    assert "sim error p50" in text and "real repeat p50" in text and "excess p50" in text
    assert ("PASS on 2 configurations" in text) != ("FAIL on 2 configurations" in text)
    # two passes over the grid: the real runs' spread is reported next to the errors
    # (and the host checked after every real run: each run sits between two checks)
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--repeats", "2", "--check-every", "0",
                 "--workdir", str(work), "--modes", "shape,model"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["repeats"] == 2 and out["noise_floor"]["latency_s"]["max"] >= 0.0
    assert out["check_every_s"] == 0.0 and len(out["drift_checks"]) == 1 + 2 * 4 + 1   # start, 8 runs, end
    assert all(len(c["metrics"]["latency_s"]["real_runs"]) == 2 for c in out["configs"])
    # each run scored alone: two per configuration, pooled over the grid's 4 configurations
    lat = [c["metrics"]["latency_s"] for c in out["configs"]]
    assert all(len(m["pass_errors"]) == len(m["rest_errors"]) == 2 for m in lat)
    rep = out["repeatability"]["latency_s"]
    assert rep["other_passes"]["max"] == pytest.approx(max(e for m in lat for e in m["rest_errors"]))
    assert rep["simulator"]["max"] == pytest.approx(max(e for m in lat for e in m["pass_errors"]))
    # the floor: the same pooled errors' median and p90, side by side, with their excess
    fl = out["floor"]["metrics"]["latency_s"]
    assert fl["sim_error_p50"] == pytest.approx(np.median([e for m in lat for e in m["pass_errors"]]))
    assert fl["real_repeat_p90"] == pytest.approx(np.percentile([e for m in lat for e in m["rest_errors"]], 90))
    assert fl["excess_p90"] == pytest.approx(fl["sim_error_p90"] - fl["real_repeat_p90"])
    assert set(out["floor"]["metrics"]) == {"latency_s", "io_s", "compute_s"}
    assert out["floor"]["pass"] == all(v["pass"] for v in out["floor"]["metrics"].values())
    assert calls == [6, 6, 6]


def test_store_cache_key_follows_the_source_and_settings(tmp_path, monkeypatch):
    f = tmp_path / "w.gguf"
    f.write_bytes(b"x" * 10)
    k1 = R.store_cache_key("m", str(f))
    assert R.store_cache_key("m", str(f)) == k1 and R.store_cache_key("other", str(f)) != k1
    f.write_bytes(b"x" * 11)
    k2 = R.store_cache_key("m", str(f))
    assert k2 != k1
    monkeypatch.setitem(G.STORE_SETTINGS, "dtype", "fp16")
    assert R.store_cache_key("m", str(f)) != k2


def test_cached_store_converts_once(tmp_path, monkeypatch):
    """The store cache: converted on first use, reused after, converted again when damaged."""
    import real.weights.convert as C

    monkeypatch.setenv("FLASHSIM_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "weights.gguf"
    src.write_bytes(b"w")
    conversions = []

    def fake_convert(model, out, **kw):
        from real.weights.convert import write_shape_store
        from tests.real.conftest import tiny_spec

        conversions.append(kw)
        return write_shape_store(tiny_spec(), out, seed=0, dtype=kw["dtype"], layout=kw["layout"], overwrite=True)

    monkeypatch.setattr(C, "convert_model", fake_convert)
    p1 = R.cached_store("m", str(src))
    assert p1.parent == tmp_path / "cache" / "stores" and len(conversions) == 1
    assert conversions[0]["dtype"] == "fp32" and conversions[0]["layout"] == "both"
    assert R.cached_store("m", str(src)) == p1 and len(conversions) == 1
    (p1 / "manifest.json").write_text("{}")                      # damaged: converted again
    assert R.cached_store("m", str(src)) == p1 and len(conversions) == 2


def test_validate_bad_input_exits_2(capsys):
    assert main(["validate", "--tokens", "2"]) == 2
    assert main(["validate", "--profile", "no-such-device"]) == 2
    assert main(["validate", "--modes", "shape,magic"]) == 2
    assert main(["validate", "--repeats", "0"]) == 2
    assert main(["validate", "--check-every", "-1"]) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_validate_quick_end_to_end(capsys):
    assert main(["validate", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_configs"] >= 24 and out["per_mode"]["model"]["n_configs"] == 8 and out["per_mode"]["moe"]["n_configs"] == 4
    assert out["repeats"] == 3 and out["floor"]["metrics"]["latency_s"]["real_repeat_p50"] is not None  # the < 3 min target of --quick is measured in tests/benchmarks/test_bench_validate.py


def test_model_grid_budgets_hold_more_than_the_computed_set():
    """Model mode computes MODEL_KEEP of every layer: its lower budget must exceed that (at 25% the full grid
    failed: k=0 with delta prefetch keeps every layer's next set plus the layer being computed)."""
    full = G.model_grid(quick=False)
    assert len(full) == 40 and {p.k for p in full} == {0, 1, 2, 4, 8}
    assert {p.budget_fraction for p in full} == set(G.MODEL_BUDGET_FRACTIONS) == {0.375, 0.5}
    assert min(G.MODEL_BUDGET_FRACTIONS) > G.MODEL_KEEP
    quick = G.model_grid(quick=True)
    assert len(quick) == 8 and {p.budget_fraction for p in quick} == {0.5} and {p.k for p in quick} == {0, 4}


def test_threads_default_to_the_profile(monkeypatch, tmp_path, capsys):
    """threads=None: the profile's compute.threads (1 when it has none); the count is in the JSON, and a
    load above the cores prints a warning line on stderr."""
    from devices import load_profile

    seen = []
    monkeypatch.setattr(V, "shape_rows", lambda profile, spec, grid, n, seed, root, threads, rows, prog, tot, reps=1,
                        replays=None, drift=None: seen.append(threads) or {"model": "x"})
    prof = load_profile("this-host")
    monkeypatch.setattr(V, "host_load", lambda: {"load_avg": [9.0, 1.0, 1.0], "cores": 2})
    rep = V.run_validation(prof.model_copy(update={"compute": prof.compute.model_copy(update={"threads": 3})}),
                           quick=True, workdir=tmp_path, modes=("shape",))
    assert seen == [3] and rep["threads"] == rep["compute_threads"] == 3
    assert rep["load_avg_start"] == [9.0, 1.0, 1.0] and rep["load_warning"].startswith("WARNING")
    assert "WARNING: 1-minute load average was 9.0" in capsys.readouterr().err
    V.run_validation(prof.model_copy(update={"compute": prof.compute.model_copy(update={"threads": None})}),
                     quick=True, workdir=tmp_path, modes=("shape",))
    assert seen == [3, 1]


def test_simulated_dram_of_a_padded_store_is_what_the_real_cache_allocates(tmp_path):
    """SmolLM2's FFN rows (d_model 576 fp32): a bundle is 3 x 2304 = 6912 B, held by the real cache
    (real/runtime/cache_matrices.py, rows of BundleReader.dest_row_bytes) in 8192 B rows in BOTH layouts. The replay's memory
    model (bundling.align_bytes from the manifest) charges the same 8192 B per cached neuron, so its cache
    share is exactly what the real per-layer matrices take, and a real run's cache bytes are the simulated
    ones (before: 6912 B per neuron, the real cache held 1.19x the simulated bytes)."""
    from devices import load_profile
    from real.runtime.backend import RealExecutor
    from real.runtime.cache_matrices import LayerCache
    from real.runtime.executor_plan import store_config
    from real.runtime.run_outputs import write_executed_trace
    from real.runtime.shape_mode import run_shape, shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from sim.config import RunConfig
    from sim.engine import build, simulate
    from tests.real.conftest import tiny_spec
    from traces.format import open_trace

    store = open_store(write_shape_store(tiny_spec(d_model=576, d_ff=128, n_layers=2), tmp_path / "store", seed=3,
                                         dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(store.spec, tmp_path / "trace", 8, seed=5, active_fraction=0.2, hot_skew=0.3))
    profile = load_profile("this-host")
    assert store.bundle_bytes == store.spec.ffn_neuron_bytes == 6912
    probe = build(trace, store.spec, profile, RunConfig().with_overrides(["workload.prompt_tokens=0"]))
    # the largest KV cache, then 100 padded neurons per layer (118 at the packed size)
    budget = probe.memory.fixed_bytes + int(probe.memory.kv_bytes.max()) + 2 * 8192 * 100
    # validate's budgets are fractions of the FFN as the caches hold it: 2 layers x 128 neurons x 8192 B
    assert G.budget_for(store.spec, 8, 0.5, 4096) - G.budget_for(store.spec, 8, 0.5) == 0.5 * 256 * (8192 - 6912)
    for bundled, sets in ((True, ["window.k=2", "prefetch=delta"]), (False, ["window.k=1", "prefetch=none"])):
        base = RunConfig().with_overrides(["residency=window", "predictor=oracle", "workload.prompt_tokens=0",
                                           f"memory.dram_budget_bytes={budget}",
                                           f"bundling.bundled={str(bundled).lower()}", *sets])
        cfg, _ = store_config(base, store)
        assert cfg.layout.params.align_bytes == 4096
        ex = RealExecutor(store, trace, profile, cfg, threads=1)
        try:
            nb = ex.sim.memory.neuron_bytes
            assert nb == 8192 and all(c.row_stride_bytes == nb for c in ex.caches)
            assert build(trace, store.spec, profile, base).memory.neuron_bytes == 6912   # packed (the simulator before)
            cap = ex.sim.memory.cap_neurons(budget, 0, ex.n_steps)
            assert int(cap[-1]) == 100
            # the share the simulator budgets is exactly what real matrices of that many rows allocate
            share = int(cap.min()) * nb * len(ex.caches)
            assert share == sum(LayerCache(int(cap.min()), 128, c.row_bytes, c.row_stride_bytes).allocated_bytes
                                for c in ex.caches) <= budget - ex.sim.memory.fixed_bytes - int(ex.sim.memory.kv_bytes.max())
        finally:
            ex.close()
        run = run_shape(store, trace, profile, cfg, seed=1, threads=1)
        replay = simulate(open_trace(write_executed_trace(tmp_path / f"exec-{bundled}", run, run.view, store.spec)),
                          store.spec, profile, cfg, fast=False)
        real_b, sim_b = [t.cache_bytes for t in run.tokens], [t.cache_bytes for t in replay.tokens]
        assert all(b % 8192 == 0 for b in real_b + sim_b) and sum(real_b) > 0
        # the simulated bytes bound the real cache at every step ...
        assert all(r <= s for r, s in zip(real_b, sim_b))
        if bundled:
            # ... and equal it (delta prefetch: the kept window and the prefetch are resident at the step's peak),
            # except the last step, where the real run issues no prefetch for a step that does not exist
            assert real_b[:-1] == sim_b[:-1]


def test_cli_threads_below_one_is_one_line(capsys):
    from flashsim.main import main

    assert main(["validate", "--quick", "--threads", "0"]) == 2
    err = capsys.readouterr().err
    assert "--threads 0" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_drift_warning_by_hand():
    from real.validation.drift import drift_warning

    assert drift_warning({"start": {"disk": 1.1, "cpu": 0.9}, "end": {"disk": 0.86, "cpu": None}}) is None
    w = drift_warning({"start": {"disk": 1.0, "cpu": 1.2}, "at 30 s": {"disk": 1.0, "read_4k": 0.7},
                       "end": {"disk": 1.5, "cpu": float("nan"), "read_4k": None}})
    assert w.startswith("WARNING") and "start cpu 1.20x" in w and "end disk 1.50x" in w and "\n" not in w
    assert "at 30 s read_4k 0.70x" in w
    # a check after every run (--check-every 0) can find the disk off at a hundred checks: one short line
    many = {f"at {i} s": {"disk": 0.8 if i % 2 else 1.5, "cpu": 1.0} for i in range(100)}
    w = drift_warning({"start": {"disk": 1.0, "cpu": 1.3}, **many, "end": {"disk": 1.62, "cpu": 1.0}})
    assert "disk at 101 of 102 checks (0.80-1.62x; median of all 1.25x)" in w and "start cpu 1.30x" in w
    assert len(w) < 300


def test_a_missing_workdir_is_one_line_error_exit_2(tmp_path, capsys):
    """--workdir that does not exist: exit 2 with one line naming it, before anything is measured."""
    from flashsim.main import main

    missing = tmp_path / "nope"
    assert main(["validate", "--quick", "--workdir", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(missing) in err and "no such folder" in err


def test_profile_at_drift_scales_what_the_check_measured():
    """Read table throughputs / disk and batch overhead x disk; GEMV rates / cpu and row cost x cpu;
    nothing else."""
    from devices import load_profile
    from real.validation.drift import profile_at_drift

    p = load_profile("this-host")
    p = p.model_copy(update={"flash": p.flash.model_copy(update={"segment_s": 2e-6})})
    q = profile_at_drift(p, 1.25, 0.8)
    assert q.flash.segment_s == pytest.approx(2.5e-6)
    t0, t1 = p.flash.read_table, q.flash.read_table
    assert np.allclose(np.array(t1.bytes_per_s) * 1.25, t0.bytes_per_s)
    assert p.flash.batch_overhead_s is not None and max(p.flash.batch_overhead_s) > 0   # this-host measured it
    assert np.allclose(np.array(q.flash.batch_overhead_s), np.array(p.flash.batch_overhead_s) * 1.25)
    assert all(q.compute.gemv_flops_per_s[k] == pytest.approx(v / 0.8) for k, v in p.compute.gemv_flops_per_s.items())
    assert q.compute.gemv_row_s == pytest.approx(p.compute.gemv_row_s * 0.8)
    for dt, t in p.compute.dense_gemv.tables.items():
        assert np.allclose(q.compute.dense_gemv.tables[dt].gemv_s, np.array(t.gemv_s) * 0.8)
    for dt, t in p.compute.sparse_ffn.tables.items():
        u = q.compute.sparse_ffn.tables[dt]
        assert np.allclose(u.input_gemv_s, np.array(t.input_gemv_s) * 0.8)
        assert np.allclose(u.down_gemv_s, np.array(t.down_gemv_s) * 0.8)
        assert u.gather_s == t.gather_s and u.transpose_s == t.transpose_s   # copies: not the GEMV check's
    assert q.compute.gather_bytes_per_s == p.compute.gather_bytes_per_s and q.memory == p.memory
    for key in ("host_cpu_s_per_read", "compute_lost_s_per_read", "framework_read_delay_s_per_batch",
                "staged_s_per_read"):   # CPU work around the reads: no check measures it
        assert getattr(q.flash, key) == getattr(p.flash, key)
    # read-size checks: each row / its chunk's ratio, interpolated in log2(chunk), clamped beyond
    r = profile_at_drift(p, 3.0, 1.0, reads={4096: 2.0, 65536: 1.0})
    chunks = p.flash.read_table.chunk_bytes
    want = {4096: 2.0, 8192: 1.75, 16384: 1.5, 32768: 1.25}     # 64 KiB and beyond: 1.0
    for i, c in enumerate(chunks):
        assert np.allclose(np.array(r.flash.read_table.bytes_per_s[i]) * want.get(c, 1.0), p.flash.read_table.bytes_per_s[i])
    assert np.allclose(r.flash.batch_overhead_s, np.array(p.flash.batch_overhead_s) * 3.0)  # still x disk
    # width checks: each dense-table row x the ratio at its in_features, the sparse GEMVs at their
    # d_model (gate / up) and neurons (down), log2-interpolated, clamped; the single rates still / cpu
    w = profile_at_drift(p, 1.0, 0.5, widths={512: 2.0, 1024: 1.5, 4096: 1.0})
    want_w = {512: 2.0, 1024: 1.5, 2048: 1.25}                  # 4096 and beyond: 1.0; below 512: 2.0
    for dt, t in p.compute.dense_gemv.tables.items():
        for i, k in enumerate(t.in_features):
            assert np.allclose(w.compute.dense_gemv.tables[dt].gemv_s[i],
                               np.array(t.gemv_s[i]) * want_w.get(k, 1.0 if k > 512 else 2.0))
    for dt, t in p.compute.sparse_ffn.tables.items():
        u = w.compute.sparse_ffn.tables[dt]
        by = np.interp(np.log2(t.d_model), np.log2([512, 1024, 4096]), [2.0, 1.5, 1.0])
        bn = np.interp(np.log2(t.neurons), np.log2([512, 1024, 4096]), [2.0, 1.5, 1.0])
        assert np.allclose(u.input_gemv_s, np.array(t.input_gemv_s) * by[:, None])
        assert np.allclose(u.down_gemv_s, np.array(t.down_gemv_s) * bn[None, :])
        assert u.gather_s == t.gather_s and u.transpose_s == t.transpose_s
    assert w.compute.gemv_flops_per_s["fp32"] == pytest.approx(p.compute.gemv_flops_per_s["fp32"] / 0.5)
    closed = load_profile("apple-m1-max")
    c = profile_at_drift(closed, 2.0, 1.0)
    assert c.flash.iops_max == closed.flash.iops_max / 2 and c.flash.read_latency_s == closed.flash.read_latency_s * 2


def test_drift_log_interpolates_its_checks_in_time(monkeypatch, tmp_path):
    """ratios_at: linear between checks, the nearest check's outside them, 1.0 for a ratio no check
    measured, None without a disk ratio; maybe_check checks only once CHECK_EVERY_S have passed."""
    import real.validation.drift as D

    seq = iter([{"disk": 1.0, "cpu": 2.0, "t_s": 10.0},
                {"disk": 2.0, "cpu": float("nan"), "t_s": 20.0}])
    monkeypatch.setattr(D, "host_drift", lambda *a: next(seq))
    log = D.DriftLog(None, tmp_path, 0, every_s=5.0)
    assert log.ratios_at(0.0) is None
    log.check()
    clock = iter([12.0, 16.0])
    monkeypatch.setattr(D.time, "perf_counter", lambda: next(clock))
    log.maybe_check()                      # 2 s after the first: not due
    assert len(log.checks) == 1
    log.maybe_check()                      # 6 s after: due
    assert len(log.checks) == 2
    assert log.ratios_at(15.0) == {"disk": 1.5, "cpu": 2.0, "read_4k": 1.0, "read_16k": 1.0,
                                   "read_64k": 1.0, "cpu_512": 1.0, "cpu_1024": 1.0}
    assert log.width_ratios_at(log.ratios_at(15.0)) is None      # no check timed the widths
    assert log.ratios_at(0.0)["disk"] == 1.0 and log.ratios_at(99.0)["disk"] == 2.0
    wide = D.DriftLog(None, tmp_path, 0)
    wide.checks = [{"disk": 1.0, "cpu": 0.9, "cpu_512": 1.4, "cpu_1024": 1.2, "t_s": 1.0}]
    assert wide.width_ratios_at(wide.ratios_at(1.0)) == {512: 1.4, 1024: 1.2, 4096: 0.9}
    # every_s = 0: a check at every call, however soon after the last
    seq = iter({"disk": 1.0, "cpu": 1.0, "t_s": 30.0 + i} for i in range(3))
    monkeypatch.setattr(D, "host_drift", lambda *a: next(seq))
    monkeypatch.setattr(D.time, "perf_counter", lambda: 30.0)
    every = D.DriftLog(None, tmp_path, 0, every_s=0.0)
    for _ in range(3):
        every.maybe_check()
    assert [c["t_s"] for c in every.checks] == [30.0, 31.0, 32.0]


def test_host_check_measures_each_read_size(tmp_path):
    """A check on a real folder: the reader-batch ratios and one read ratio per READ_CHECK_CHUNKS
    size, each finite and positive; on a RAM filesystem (nothing of the disk) no read ratios."""
    from devices import load_profile
    from real.validation.drift import READ_KEYS, WIDTH_KEYS, host_drift, read_ratios

    profile = load_profile("this-host")   # outside the timed span: only the check's own time is bracketed
    before = time.perf_counter()
    c = host_drift(profile, tmp_path, 0)
    after = time.perf_counter()
    assert all(np.isfinite(c[k]) and c[k] > 0 for k in ("disk", *READ_KEYS.values()))
    assert all(np.isfinite(c[k]) and c[k] > 0 for k in ("cpu", *WIDTH_KEYS.values()))   # this-host has the cells
    assert before < c["t_s"] < after and abs(c["t_s"] - (before + after) / 2) < 0.05   # stamped at its midpoint
    if Path("/dev/shm").is_dir():
        f = Path("/dev/shm") / f"flashsim-test-{os.getpid()}"
        f.write_bytes(b"\0" * (1 << 20))
        try:
            assert read_ratios(profile, f, np.random.default_rng(0)) == {}
        finally:
            f.unlink()


def test_the_cpu_check_is_predicted_from_the_dense_gemv_table_where_the_profile_has_one():
    """The cpu check's [4096, 4096] fp32 GEMV against the profile's dense GEMV table (measured the
    way the check measures: weights streamed from DRAM), else against the rates."""
    import yaml

    from devices.schema import BUNDLED_DIR, DeviceProfile
    from real.validation.drift import DRIFT_GEMV_SHAPE, cpu_check_predicted_s

    assert DRIFT_GEMV_SHAPE == (4096, 4096)
    data = yaml.safe_load((BUNDLED_DIR / "this-host.yaml").read_text())
    data["compute"]["dense_gemv"] = {"source": "test", "tables": {"fp32": {
        "in_features": [1024, 8192], "out_features": [1024, 8192],
        "gemv_s": [[1e-4, 8e-4], [8e-4, 6.4e-3]]}}}
    # at (4096, 4096): log-log between the grid's points on a table of constant rate per element
    assert cpu_check_predicted_s(DeviceProfile.model_validate(data)) == pytest.approx(1.6e-3, rel=1e-6)
    data["compute"].pop("dense_gemv")
    data["compute"].update(gemv_flops_per_s={"fp32": 1e10}, gemv_row_s=1e-8)
    assert cpu_check_predicted_s(DeviceProfile.model_validate(data)) == pytest.approx(2 * 4096 * 4096 / 1e10 + 4096e-8)


def test_recalibrated_validation_scores_against_the_calibrations_mean(monkeypatch, tmp_path, capsys):
    """--recalibrate-every: calibrations at the start, between runs when due, at the end; the rows
    scored against their mean (real.validation.profile_merge), the given profile's errors reported too, and
    the kept grid rescores to both. The calibration itself is faked (each call writes the base
    profile with its read table at a known speed): the real benches are test_calibrate.py's."""
    import yaml

    from devices import load_profile
    from real.validation import calibration as C
    from real.validation.profile_writer import write_profile_text
    from real.validation.validate_keep import rescore

    tiny_grids(monkeypatch, tmp_path)
    speeds = iter([1.0, 0.5, 0.5, 0.5, 0.5, 0.5])   # the first calibration as profiled, the others half as fast

    def fake_calibrate(self, target):
        d = yaml.safe_load(target.read_text())
        s = next(speeds)
        d["flash"]["read_table"]["bytes_per_s"] = [[v * s for v in row] for row in d["flash"]["read_table"]["bytes_per_s"]]
        write_profile_text(target, yaml.safe_dump(d, sort_keys=False))

    monkeypatch.setattr(C.Recalibrator, "_calibrate", fake_calibrate)
    work, keep = tmp_path / "work", tmp_path / "kept"
    work.mkdir()
    assert main(["validate", "--quick", "--json", "--tokens", "6", "--modes", "shape", "--recalibrate-every", "1e6",
                 "--workdir", str(work), "--keep", str(keep)]) == 0
    out = json.loads(capsys.readouterr().out)
    rc = out["recalibration"]
    assert rc["every_s"] == 1e6 and len(rc["calibrations"]) == 2       # the start and the end: none was due between
    assert rc["calibrations"][0]["end_s"] <= rc["calibrations"][1]["start_s"]
    assert sorted(p.name for p in (keep / "calibrations").iterdir()) == ["cal-0.yaml", "cal-1.yaml"]
    kept = load_profile(keep / "profile.yaml")     # the mean: harmonic of 1x and 0.5x the read table = 2/3x
    given = load_profile("this-host")
    assert kept.flash.read_table.bytes_per_s[3][2] == pytest.approx(given.flash.read_table.bytes_per_s[3][2] * 2 / 3,
                                                                    rel=1e-3)
    # the errors reported are the mean's; the given profile's are reported apart; a rescore reproduces both
    again = rescore(keep)
    assert again["latency_error_median"] == pytest.approx(out["latency_error_median"])
    assert again["latency_error_max"] == pytest.approx(out["latency_error_max"])
    for m, f in out["floor"]["metrics"].items():     # the floor and its excess from the kept passes alike
        for k in ("sim_error_p50", "sim_error_p90", "real_repeat_p50", "real_repeat_p90", "excess_p50", "excess_p90"):
            assert again["floor"]["metrics"][m][k] == pytest.approx(f[k]), (m, k)
    assert again["floor"]["pass"] == out["floor"]["pass"] and out["repeats"] == 3
    on_given = rescore(keep, given)
    assert on_given["latency_error_max"] == pytest.approx(rc["given_profile"]["latency_error_max"])
    assert out["latency_error_max"] != pytest.approx(rc["given_profile"]["latency_error_max"])
    assert list(work.iterdir()) == []       # the calibrations' folder went with the temporary one
    # due after every run: a calibration before the grid and after each of its 2 runs; the one after the
    # last run is the end's (no second one right after it)
    assert main(["validate", "--quick", "--tokens", "6", "--modes", "shape", "--repeats", "1", "--recalibrate-every", "1e-9",
                 "--workdir", str(work)]) == 0
    text = capsys.readouterr().out
    assert "scored against the mean of 3 calibrations of this host" in text and "against the given profile" in text


def test_recalibrate_every_must_be_positive(capsys):
    assert main(["validate", "--quick", "--recalibrate-every", "0"]) == 2
    assert "--recalibrate-every 0.0: give seconds > 0" in capsys.readouterr().err
    assert main(["validate", "--rescore", "x", "--recalibrate-every", "5"]) == 2
