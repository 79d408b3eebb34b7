"""MoE simulator speed: the per-layer residency walk batched over a token's layers against the
step-by-step walk, and the whole replay's runs per second, side by side (printed, never asserted).

Run: `make bench` (or `pytest -s -m "" tests/benchmarks/test_bench_moe.py`).
"""

from __future__ import annotations

import time

import numpy as np

from analysis.moe_planner import synthetic_routing
from devices.moe_spec import load_moe_model
from devices.schema import load_profile
from sim.moe.base import build_cache
from sim.moe.residency import walk
from sim.moe.run import MoERunConfig, simulate


def _time(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def test_bench_batched_walk() -> None:
    spec = load_moe_model("qwen3-30b-a3b")
    r = synthetic_routing(spec, 128, 0)
    print()
    print(f"{spec.name}: 128 tokens x {spec.n_moe_layers} MoE layers, 64 slots per layer")
    for name in ("lru", "lfu", "least-stale"):
        a = _time(lambda name=name: walk(r["experts"], spec.n_experts, build_cache(name), 64, "layer"))
        b = _time(lambda name=name: walk(r["experts"], spec.n_experts, build_cache(name), 64, "layer",
                                         batched=False))
        print(f"  {name:12s} batched {a[1] * 1e3:7.1f} ms CPU, step by step {b[1] * 1e3:7.1f} ms CPU: "
              f"{b[1] / max(a[1], 1e-9):5.1f}x")
    prof = load_profile("apple-m1-max")
    cfg = MoERunConfig(policy="lru", capacity=64)
    wall, cpu = _time(lambda: simulate(spec, prof, r["experts"], cfg, weights=r["weights"]))
    tl = 128 * spec.n_layers
    print(f"  one run (walk + fast path): {cpu:.2f} s CPU, {tl / max(cpu, 1e-9):,.0f} token-layers/s")
    assert np.isfinite(cpu)
