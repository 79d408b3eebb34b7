"""What a prefetch's read batches cost the real decoder loop, by the model's shape, next to the
simulator's terms for that loop (sim/components/compute.py `HostCpu.at`). The loop runs shape mode's decode step (`real.runtime.shape_mode.decode_step`: attention stand-in,
the backend's FFN step, lm_head) with every neuron resident (`hybrid`, fraction 1.0: no reads of
its own) while batches of 64 reads run back to back at the profile's depth on a background thread
(`bench flash`'s probe), and each torch call is counted; the three probes run under the same
batches. Printed, not asserted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from devices import load_profile
from devices.model_spec import ModelSpec
from sim.components.compute import LOOP_ATTENTION_OPS, LOOP_FFN_OPS, HostCpu
from sim.config import RunConfig

torch = pytest.importorskip("torch")

# (d_model, d_ff, layers, dtype): from SmolLM2's width to a Llama-2-7B layer
SHAPES = ((256, 512, 8, "fp32"), (1024, 2048, 8, "fp32"), (2048, 5504, 4, "fp32"), (4096, 11008, 2, "fp16"))
BATCH_READS = (64, 256)
SLICES = 8


def _loop(tmp_path, d: int, d_ff: int, layers: int, dtype: str):  # type: ignore[no-untyped-def]
    """run(until) -> tokens of the all-resident loop (shape mode's decode step), the loop's seconds
    per torch call and its calls per layer."""
    from real.bench.bench_host_cpu import calls_per_iteration
    from real.runtime.backend import RealExecutor
    from real.runtime.shape_mode import decode_step, shape_config, shape_trace_like
    from real.weights.convert import write_shape_store
    from real.weights.store import open_store
    from traces.format import open_trace

    heads = max(2, d // 128)
    spec = ModelSpec(name=f"d{d}", family="llama", n_layers=layers, d_model=d, d_ff=d_ff, dtype=dtype,
                     n_heads=heads, n_kv_heads=max(1, heads // 2), head_dim=d // heads, vocab_size=4096,
                     ffn_kind="swiglu")
    store = open_store(write_shape_store(spec, tmp_path / f"s{d}", seed=1, dtype=dtype))
    trace = open_trace(shape_trace_like(store.spec, tmp_path / f"t{d}", 32, seed=2))
    cfg = RunConfig().with_overrides(["residency=hybrid", "hybrid.fraction=1.0", "predictor=oracle", "prefetch=none",
                                      "workload.prompt_tokens=0", "memory.dram_budget_bytes=12GiB"])
    ex = RealExecutor(store, trace, load_profile("this-host"), shape_config(cfg), threads=1)
    step, _ = decode_step(ex, 0)
    next_step = [0]

    def token() -> None:
        if next_step[0] == ex.n_steps:        # every neuron resident: the steps can run again
            ex.step, next_step[0] = -1, 0
        step(next_step[0])
        next_step[0] += 1

    def run(until: float) -> int:
        n = 0
        with torch.no_grad():
            while time.perf_counter() < until:
                token()
                n += 1
        return n

    run(time.perf_counter() + 0.05)          # warm-up
    t0 = time.perf_counter()
    n = run(t0 + 0.5)
    token_s = (time.perf_counter() - t0) / n
    calls = calls_per_iteration(run, 0.2)
    return run, token_s / calls, calls / layers


def test_bench_loop_loss_by_shape(tmp_path):
    from real.bench.bench_host_cpu import PROBE_CHUNK_BYTES, probe_samples, probe_summary
    from real.bench.bench_io import BenchFile

    profile = load_profile("this-host")
    host = HostCpu.of(profile, python_loop=True)
    q = int(profile.flash.max_in_flight)
    bf = BenchFile(tmp_path / "bench.bin", 1 << 30, 0, None, False)
    rows = []
    try:
        for kind in ("framework", "host", "long"):
            s = probe_summary([probe_samples(bf, PROBE_CHUNK_BYTES, q, slices=SLICES, slice_s=0.2,
                                             batch_reads=BATCH_READS, kind=kind)])
            rows.append((f"probe: {kind}", s["op_s"], s["per_batch_size"]["64"]["compute_lost_s"]))
        for d, d_ff, layers, dtype in SHAPES:
            run, op_s, calls = _loop(tmp_path, d, d_ff, layers, dtype)
            s = probe_summary([probe_samples(bf, PROBE_CHUNK_BYTES, q, slices=SLICES, slice_s=0.2,
                                             batch_reads=BATCH_READS, probe=run)])
            rows.append((f"loop d_model {d} ({calls:.0f} calls/layer)", op_s, s["per_batch_size"]["64"]["compute_lost_s"]))
    finally:
        bf.close()
    print(f"\ncompute lost per 64-read batch ({PROBE_CHUNK_BYTES // 1024} KiB, {q} in flight), measured | the "
          f"committed profile's terms at that seconds per call (loop calls/layer modelled: shape mode "
          f"{LOOP_FFN_OPS + LOOP_ATTENTION_OPS['kernels']})")
    for name, op_s, lost in rows:
        model = ""
        if host is not None and host.probes and op_s:
            lr, lb, _, _ = host.at(op_s)
            model = f" | model {(64 * lr + lb) * 1e3:.2f} ms"
        print(f"  {name:36s} {op_s * 1e6 if op_s else float('nan'):8.1f} us/call  lost {lost * 1e3:.2f} ms{model}")
    assert all(np.isfinite(r[2]) for r in rows)
