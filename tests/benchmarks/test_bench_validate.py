"""Benchmarks of the real backend (printed, never asserted on time; `make bench`):

* the simulator's error against the real backend over the full validation grid (`flashsim validate`);
* the real backend's speedup over the mmap baseline at a DRAM budget of half the FFN, SmolLM2-135M
  (fp32 store, model mode, oracle top-25% active sets, window k=4 + delta prefetch + bundling) and
  optionally a Llama-2-7B shape (fp16 random store, ~13 GB of disk: FLASHSIM_BENCH_7B=1).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from devices import load_profile
from sim.config import RunConfig

pytest.importorskip("torch")
pytestmark = pytest.mark.slow   # minutes each: only `make bench` (-m "") runs them


def _cfg(budget: int) -> RunConfig:
    return RunConfig().with_overrides([
        "residency=window", "window.k=4", "predictor=oracle", "bundling.bundled=true", "prefetch=delta",
        "workload.prompt_tokens=0", f"memory.dram_budget_bytes={budget}"])


THREADS = 1   # both sides compute with one PyTorch thread (on shared cores a
              # multi-threaded op waits for a descheduled worker)


def _mmap_ffn_s(store, budget_ffn: int, tokens: int) -> float:
    import torch

    from real.runtime.mmap_baseline import MmapFfnBaseline

    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    with MmapFfnBaseline(store, budget_ffn) as mm:
        recs = mm.run(tokens, seed=0, cold=True)
    torch.set_num_threads(before)
    return float(np.median([r.seconds for r in recs[1:]]))


def test_bench_validate_full_grid(tmp_path):
    import time

    from real.validation.validate import run_validation
    from real.validation.validate_keep import rescore

    profile = load_profile("this-host")
    r = run_validation(profile, quick=False, keep=tmp_path / "kept")
    print(f"\nvalidate: {r['n_configs']} configs, latency error median {r['latency_error_median']:.1%} "
          f"p90 {r['latency_error_p90']:.1%} max {r['latency_error_max']:.1%}")
    for m, v in r["per_metric"].items():
        print(f"  {m:12s} median {v['median']:.1%}  p90 {v['p90']:.1%}  max {v['max']:.1%}")
    t = time.perf_counter()
    again = rescore(tmp_path / "kept", profile)
    rescore_s = time.perf_counter() - t
    print(f"rescore of the kept grid: {rescore_s:.1f} s against the validation's {r['wall_s']:.0f} s "
          f"({r['wall_s'] / rescore_s:.0f}x); latency error median {again['latency_error_median']:.1%} (same runs, same profile)")


def test_bench_smollm2_vs_mmap(tmp_path):
    from real.runtime.model_mode import run_model
    from real.weights.convert import convert_model
    from real.weights.store import open_store
    from traces.capture.models import load_hf_model

    loaded = load_hf_model("smollm2-135m")
    spec = loaded.spec
    store = open_store(convert_model("smollm2-135m", tmp_path / "store", dtype="fp32", layout="both"))
    ffn_bytes = spec.n_layers * spec.d_ff * store.bundle_bytes
    half = ffn_bytes // 2
    text = ("Flash memory holds the weights; DRAM holds a window of recently used neurons, and the "
            "rest is read on demand. ") * 4
    ids = np.asarray(loaded.tokenizer(text)["input_ids"])[:32]
    budget = int(store.spec.non_ffn_bytes + (len(ids) + 1) * spec.kv_bytes_per_token + half)
    run, q = run_model(loaded.model, spec, store, ids, load_profile("this-host"), _cfg(budget), keep_fraction=0.25,
                       workdir=tmp_path, threads=THREADS)
    real_ffn = float(np.median(run.ffn_s[2:]))
    mm = _mmap_ffn_s(store, half, 8)
    print(f"\nSmolLM2-135M fp32, FFN budget {half / 2**20:.0f} MiB (half of {ffn_bytes / 2**20:.0f} MiB): "
          f"real backend FFN {real_ffn * 1e3:.2f} ms/token vs mmap dense FFN {mm * 1e3:.2f} ms/token -> "
          f"speedup {mm / real_ffn:.2f}x; quality at top-25%: greedy agreement {q['greedy_agreement']:.2f}, "
          f"ppl {q['perplexity']:.2f} vs dense {q['dense_perplexity']:.2f}")


@pytest.mark.skipif(not os.environ.get("FLASHSIM_BENCH_7B"), reason="set FLASHSIM_BENCH_7B=1 (writes ~13 GB)")
def test_bench_7b_shape_vs_mmap(tmp_path):
    from devices import load_model
    from real.runtime.shape_mode import run_shape, shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from traces.format import open_trace

    spec = load_model("llama-2-7b")
    store = open_store(write_shape_store(spec, tmp_path / "store", seed=0, dtype="fp16", layout="both"))
    trace = open_trace(shape_trace_like(store.spec, tmp_path / "trace", 12, seed=0, active_fraction=0.1, hot_skew=0.3))
    ffn_bytes = spec.n_layers * spec.d_ff * store.bundle_bytes
    half = ffn_bytes // 2
    budget = int(store.spec.non_ffn_bytes + 13 * store.spec.kv_bytes_per_token + half)
    run = run_shape(store, trace, load_profile("this-host"), _cfg(budget), threads=THREADS)
    real_ffn = float(np.median(run.ffn_s[2:]))
    mm = _mmap_ffn_s(store, half, 4)
    print(f"\nLlama-2-7B shape fp16: real FFN {real_ffn:.3f} s/token vs mmap {mm:.3f} s/token -> {mm / real_ffn:.2f}x")


def test_bench_validate_quick_wall_time(capsys):
    """`flashsim validate --quick` must finish in under 3 minutes (issue 5): printed, not asserted."""
    import json
    import time

    from flashsim.main import main

    t0 = time.perf_counter()
    assert main(["validate", "--quick", "--json"]) == 0
    wall_s = time.perf_counter() - t0
    out = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        print(f"\nvalidate --quick: {out['n_configs']} configurations in {wall_s:.1f} s "
              f"(target < 180 s: ratio {wall_s / 180:.2f}); latency error median "
              f"{out['latency_error_median']:.3f}, p90 {out['latency_error_p90']:.3f}")


def _without(profile, *fields: str):  # type: ignore[no-untyped-def]
    """`profile` with these flash fields dropped (their terms off)."""
    from devices.schema import DeviceProfile

    data = profile.model_dump(mode="json", exclude_none=True)
    for k in fields:
        data["flash"].pop(k, None)
    return DeviceProfile.model_validate(data)


PROBE_FIELDS = ("framework_probe_op_s", "kernel_probe_op_s", "long_kernel_probe_op_s",
                "long_kernel_compute_lost_s_per_read", "long_kernel_compute_lost_s_per_batch",
                "long_kernel_read_delay_s_per_read", "long_kernel_read_delay_s_per_batch")
HOST_CPU_FIELDS = ("host_cpu_s_per_read", "compute_lost_s_per_read", "read_delay_s_per_read",
                   "compute_lost_s_per_batch", "read_delay_s_per_batch", "framework_compute_lost_s_per_read",
                   "framework_compute_lost_s_per_batch", "framework_read_delay_s_per_read",
                   "framework_read_delay_s_per_batch", *PROBE_FIELDS)


def test_bench_host_cpu_terms(tmp_path):
    """What each host-CPU term of the profile contributes: the validation grid's real runs once, each
    replayed with profile variants (no host CPU terms; compute lost per read only; the full model; the
    full model without compute after a read wait, or without the cache index work), so real-run
    noise is the same for every variant. Quick grid; FLASHSIM_BENCH_FULL=1 for the full one."""
    from devices.schema import DeviceProfile
    from real.runtime.run_outputs import write_executed_trace
    from real.runtime.shape_mode import run_shape, shape_config, shape_trace_like
    from real.validation.validate_grid import grid, validation_spec
    from real.validation.validate_score import compare, summarize
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from sim.engine import simulate
    from traces.format import open_trace

    base = load_profile("this-host")

    def variant(**flash: float) -> DeviceProfile:
        data = base.model_dump(mode="json", exclude_none=True)
        for k in HOST_CPU_FIELDS:
            data["flash"].pop(k, None)
        data["flash"].update(flash)
        return DeviceProfile.model_validate(data)

    f = base.flash
    variants = {"no host CPU terms": variant(),
                "+ compute_lost_s_per_read": variant(host_cpu_s_per_read=f.host_cpu_s_per_read,
                                                     compute_lost_s_per_read=f.compute_lost_s_per_read or 0.0,
                                                     compute_lost_s_per_batch=f.compute_lost_s_per_batch,
                                                     read_delay_s_per_read=0.0),
                "+ read_delay_s_per_read (full)": base,
                "full - the loop's seconds per call": _without(base, *PROBE_FIELDS)}
    quick = os.environ.get("FLASHSIM_BENCH_FULL") != "1"
    spec = validation_spec(quick)
    n_tokens = 12 if quick else 24
    store = open_store(write_shape_store(spec, tmp_path / "store", seed=0, dtype="fp32", layout="both"))
    trace = open_trace(shape_trace_like(spec, tmp_path / "trace", n_tokens, 0))
    rows: dict[str, list] = {k: [] for k in variants}
    load0 = os.getloadavg()[0]
    for i, gp in enumerate(grid(quick)):
        _, cfg = gp.run_config(store, n_tokens, 0)
        cfg = shape_config(cfg)
        run = run_shape(store, trace, base, cfg, seed=0, threads=base.compute.threads or THREADS)
        executed = open_trace(write_executed_trace(tmp_path / f"ex-{i}", run, run.view, spec))
        for name, prof in variants.items():
            res = simulate(executed, spec, prof, cfg, fast=False)
            rows[name].append({"config": gp.label, "metrics": compare(run.tokens, res.tokens)})
    print(f"\nhost CPU terms ({len(rows['no host CPU terms'])} configs, load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; median / p90 / max relative error)")
    for name, r in rows.items():
        pm = summarize(r)["per_metric"]
        print(f"  {name:32s} " + "  ".join(f"{m} {pm[m]['median']:.0%}/{pm[m]['p90']:.0%}/{pm[m]['max']:.0%}"
                                           for m in ("latency_s", "io_s", "compute_s")))
