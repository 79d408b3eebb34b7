"""`flashsim bench compute`'s table of the sparse FFN's kernels: seconds per call of the gather, one
input-side GEMV (gate or up), the down rows' transposed copy and the down GEMV, per dtype, over a
grid of model widths (d_model) and computed neurons (k).

Why a table, not one rate per kernel. The real backend's sparse FFN (real.runtime.sparse_ffn `SparseFFN.compute`)
gathers k whole cache rows (gate | up | down, a padded store's stride) into a scratch, runs the
gate and up GEMVs on strided views of it, copies the down segment transposed ([k, d] -> [d, k]) and
runs the down GEMV on that copy. What each kernel costs per byte depends on its size and dtype far
more than one measured point says (an Intel Xeon VM, one thread):
  * the transposed copy ran at 4.5 GB/s at 409 x 1024 fp32 (where the profile's single
    `transpose_bytes_per_s` was measured), 2.9 GB/s at 1100 x 4096 fp32 and 1.9-2.5 GB/s in fp16
    at every size (and, while each copy was a fresh allocation, 0.6 GB/s past 32 MiB: see
    real.runtime.cache_matrices.TransposeScratch);
  * the input-side GEMVs over the strided fp16 rows streamed at 3-7 GB/s against 13-17 GB/s in
    fp32 (this CPU has no fp16 arithmetic: torch converts), where the dense fp16 GEMV the profile's
    `gemv_flops_per_s` comes from runs at 22 GB/s.
A Llama-2-7B fp16 layer's sparse FFN (1100 of 11008 neurons) took 10.6 ms, against the 6.3 ms the
single rates gave: the 22% by which a real 7B-shape run's compute exceeded a simulator priced
with single rates.

Each point runs the backend's own sequence on its own kind of memory: the rows sit in an
AlignedBuffer (the neuron cache's memory) of CACHE_SLACK x k rows, a seeded random k of them are
gathered with `real.runtime.cache_matrices.gather_rows` into a `gather_scratch`, after an untimed sweep that evicts
the CPU caches (as a layer's other work does between two of its FFNs); then the two input GEMVs
(`F.linear` on the strided views), the transposed copy (real.runtime.cache_matrices.TransposeScratch, as the backend)
and the down GEMV, each timed on its own. The means (real/bench/call_time.py) of at least MIN_REPS
repetitions (after one warm-up) are kept.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from devices.kernel_table import table_row_bytes
from real.bench.call_time import mean_call_s
from real.io.buffers import AlignedBuffer
from real.runtime.cache_matrices import TransposeScratch, gather_rows, gather_scratch

# the grid: model widths x computed neurons per layer (SmolLM2 576 .. a 70B's 8192; a layer's
# tens to thousands of computed neurons). --quick: the corners of a smaller square.
D_MODEL = (512, 1024, 2048, 4096, 8192)
NEURONS = (64, 128, 256, 512, 1024, 2048, 4096)
QUICK_D_MODEL = (512, 2048)
QUICK_NEURONS = (64, 1024)
CACHE_SLACK = 1.5       # the cache holds 1.5 k rows; a random k of them are gathered
MIN_REPS = 3
# swept before each gather, as bench compute's gather: twice the L3 of the host first measured. On a host
# whose L3 holds more, the real runs' cache rows stay partly cached too: the sparse FFN priced from this
# table agreed with the real runs' on a 480 MiB L3, so it is not sized by the cache
EVICT_BYTES = 64 << 20
KERNELS = ("gather_s", "input_gemv_s", "transpose_s", "down_gemv_s")


def bench_cache_rows(torch: Any, k: int, row_bytes: int, tdt: Any, seed: int) -> tuple[AlignedBuffer, np.ndarray]:
    """A neuron cache of CACHE_SLACK x k rows of `row_bytes` in an AlignedBuffer, as the backend's:
    (the buffer, its uint8 [rows, row_bytes] view). Real values (no denormals): one random row of
    `tdt`, repeated."""
    n = int(k * CACHE_SLACK)
    mem = AlignedBuffer(n * row_bytes)
    rows = mem.array[: n * row_bytes].reshape(n, row_bytes)
    es = torch.empty((), dtype=tdt).element_size()
    one = (torch.randn(row_bytes // es, generator=torch.Generator().manual_seed(seed)) * 0.02).to(tdt)
    rows[:] = one.view(torch.uint8).numpy()[None, :]
    return mem, rows


def sparse_ffn_table(torch: Any, dtypes: dict[str, Any], quick: bool = False, seed: int = 0,
                     min_time_s: float = 0.2) -> dict[str, Any]:
    """{dtype: {d_model, neurons, gather_s, input_gemv_s, transpose_s, down_gemv_s ([i][j] at
    d_model[i], neurons[j])}}, measured with torch on the CPU."""
    F = torch.nn.functional
    ds, ks = (QUICK_D_MODEL, QUICK_NEURONS) if quick else (D_MODEL, NEURONS)
    rng = np.random.default_rng(seed)
    sweep = np.ones(EVICT_BYTES, np.uint8)
    out: dict[str, Any] = {}
    for name, tdt in dtypes.items():
        es = torch.empty((), dtype=tdt).element_size()
        table = {k: [[0.0] * len(ks) for _ in ds] for k in KERNELS}
        for i, d in enumerate(ds):
            row_bytes = table_row_bytes(d, es)
            for j, k in enumerate(ks):
                mem, rows = bench_cache_rows(torch, k, row_bytes, tdt, seed)
                scratch = gather_scratch(k, row_bytes)
                down_scratch = TransposeScratch(torch)
                x = (torch.randn(1, d, generator=torch.Generator().manual_seed(seed + 1))).to(tdt)
                h = (torch.randn(1, k, generator=torch.Generator().manual_seed(seed + 2))).to(tdt)
                times: list[tuple[float, float, float, float]] = []
                t_all = time.perf_counter()
                with torch.no_grad():
                    while len(times) < MIN_REPS + 1 or time.perf_counter() - t_all < min_time_s:
                        slots = np.sort(rng.choice(len(rows), k, replace=False))
                        sweep[::64] += 1
                        t0 = time.perf_counter()
                        g = gather_rows(rows, slots, scratch, tdt)
                        t1 = time.perf_counter()
                        F.linear(x, g[:, :d])
                        F.linear(x, g[:, d:2 * d])
                        t3 = time.perf_counter()
                        down_t = down_scratch.transposed(g[:, 2 * d:3 * d], k, d, es)
                        t4 = time.perf_counter()
                        F.linear(h, down_t)
                        t5 = time.perf_counter()
                        times.append((t1 - t0, (t3 - t1) / 2, t4 - t3, t5 - t4))
                        if len(times) > 10000:
                            break
                per_call = mean_call_s(times[1:], axis=0)    # the first call: warm-up
                for key, v in zip(KERNELS, per_call):
                    table[key][i][j] = float(v)
                del rows, g, down_t, down_scratch
        out[name] = {"d_model": list(ds), "neurons": list(ks), **table}
    return out
