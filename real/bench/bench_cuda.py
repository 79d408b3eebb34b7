"""`flashsim bench compute --device cuda`: the compute benches on a CUDA GPU (a desktop GPU or a
Jetson), through the same path the real backend's CUDA branch takes (real/runtime/sparse_ffn.py
`SparseFFN.compute`, real/runtime/device.py): seconds, bytes/s, FLOP/s.

* Dense GEMV per dtype: y = W x for one token, W [M, K] resident in GPU memory (DENSE_SHAPE, a
  Llama-2-7B FFN matrix; --quick QUICK_SHAPE), each call on the next of enough distinct copies that
  together hold POOL_L2_MULTIPLE x the GPU's L2 (at least MIN_POOL_BYTES), so every call streams its
  weights from DRAM as a decode does layer after layer. dtypes: fp32 and fp16 everywhere, bf16 from
  compute capability 8.0 on (Ampere, Orin's sm_87; Volta/Xavier's sm_72 has no bf16 arithmetic).
  Calls are issued back to back between two `torch.cuda.synchronize()`s, as a decode queues its
  kernels: the per-call time is the GPU's, with the launches overlapped.
* Dense GEMV table per dtype over in_features x out_features (real/bench/bench_dense_gemv.py's grid), from
  a pool on the GPU the same way.
* Sparse FFN table per dtype (real/bench/bench_sparse_ffn.py's grid and kernels) on the backend's CUDA
  path: the cache rows in host memory (AlignedBuffer, the neuron cache's kind), the gather on the CPU
  (real.runtime.cache_matrices.gather_rows) into a page-locked scratch (real.runtime.device.HostScratch, cudaHostRegister),
  the segments copied to the GPU with non_blocking=True, the two input GEMVs, the transposed down
  copy (real.runtime.cache_matrices.TransposeScratch on the GPU) and the down GEMV on the GPU. Each phase is timed
  to a synchronize, so gather_s holds the host gather and the transfer; each phase also holds one
  synchronize's latency (a few microseconds) that the backend pays once per layer.
* GPU memory bandwidth: STREAM-style copy (2 x bytes / time) and triad a = b + s c (3 x bytes /
  time) on device tensors; host-to-device bandwidth from a page-locked buffer. On a Jetson (unified
  memory) the GPU's copy bandwidth is the DRAM's as batch-1 decode on the GPU sees it.
* Per-op overhead: back-to-back 1-element adds on the GPU between two synchronizes: the launch cost
  per kernel that a decode pays when its kernels are short.

Tensors are made on the host and moved with `.to(device)`: the tests run this module on a CPU build
with torch.cuda replaced at the torch boundary (tests/real/test_bench_cuda.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.bench.call_time import mean_call_s
from real.runtime.device import ComputeDevice, HostScratch, pin_host_buffer, unpin_host_buffer

DENSE_SHAPE = (11008, 4096)
QUICK_SHAPE = (4096, 2048)
GATHER_FRACTION = 0.10
MIN_POOL_BYTES = 256 << 20
QUICK_MIN_POOL_BYTES = 64 << 20
POOL_L2_MULTIPLE = 4
COPY_BYTES = 256 << 20
QUICK_COPY_BYTES = 32 << 20
OP_REPS = 2000
CACHE_SLACK = 1.5      # as real/bench/bench_sparse_ffn.py: the cache holds 1.5 k rows, a random k are gathered


def cuda_dtypes(torch: Any, capability_major: int) -> dict[str, Any]:
    """The dtypes measured on a GPU of this compute capability (module docstring)."""
    out = {"fp32": torch.float32, "fp16": torch.float16}
    if capability_major >= 8:
        out["bf16"] = torch.bfloat16
    return out


def sync_batch_s(torch: Any, fn: Callable[[int], Any], reps: int) -> float:
    """Seconds per call of `reps` calls fn(0), fn(1), ... issued back to back between two
    synchronizes (after one synchronized warm-up call)."""
    fn(0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for r in range(reps):
        fn(r)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def _reps_for(torch: Any, fn: Callable[[int], Any], min_time_s: float, min_reps: int = 5) -> int:
    """Enough calls for about min_time_s, from one synchronized trial call after a warm-up call
    (the first call of a kernel pays its library's lazy set-up)."""
    fn(0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t, 1e-6)
    return int(min(max(min_reps, math.ceil(min_time_s / one)), 10000))


def _pool_bytes(l2_bytes: int, quick: bool) -> int:
    return max(QUICK_MIN_POOL_BYTES if quick else MIN_POOL_BYTES, POOL_L2_MULTIPLE * l2_bytes)


def _copies(torch: Any, tdt: Any, m: int, k: int, pool_bytes: int, dev: Any) -> list[Any]:
    """Distinct [m, k] matrices on the GPU that together hold at least pool_bytes (at least 2)."""
    es = torch.empty((), dtype=tdt).element_size()
    n = max(2, math.ceil(pool_bytes / (m * k * es)))
    return [torch.full((m, k), 0.02, dtype=tdt).to(dev) for _ in range(n)]


def _gemv_s(torch: Any, mats: list[Any], x: Any, min_time_s: float) -> float:
    """Seconds per y = W x on the GPU, W cycling over `mats` (so the L2 holds none of them)."""
    F = torch.nn.functional

    def call(r: int) -> Any:
        return F.linear(x, mats[r % len(mats)])
    with torch.no_grad():
        return sync_batch_s(torch, call, _reps_for(torch, call, min_time_s))


def _dense(torch: Any, dev: Any, dtypes: dict[str, Any], shape: tuple[int, int], pool_bytes: int,
           min_time_s: float) -> dict[str, dict[str, float]]:
    M, K = shape
    out: dict[str, dict[str, float]] = {}
    for name, tdt in dtypes.items():
        ws = _copies(torch, tdt, M, K, pool_bytes, dev)
        x = torch.randn(1, K).to(tdt).to(dev)
        t = _gemv_s(torch, ws, x, min_time_s)
        out[name] = {"dense_gemv_s": t, "dense_gemv_flops_per_s": 2.0 * M * K / t, "pool_matrices": len(ws)}
        del ws
    return out


def _dense_table(torch: Any, dev: Any, dtypes: dict[str, Any], quick: bool, pool_bytes: int,
                 min_time_s: float) -> dict[str, Any]:
    from real.bench.bench_dense_gemv import (
        IN_FEATURES,
        OUT_FEATURES,
        QUICK_IN_FEATURES,
        QUICK_OUT_FEATURES,
    )

    ks, ms = (QUICK_IN_FEATURES, QUICK_OUT_FEATURES) if quick else (IN_FEATURES, OUT_FEATURES)
    out = {}
    for name, tdt in dtypes.items():
        es = torch.empty((), dtype=tdt).element_size()
        flat = torch.full((pool_bytes // es,), 0.02, dtype=tdt).to(dev)
        table = [[0.0] * len(ms) for _ in ks]
        for i, k in enumerate(ks):
            x = torch.randn(1, k).to(tdt).to(dev)
            for j, m in enumerate(ms):
                n = max(1, flat.numel() // (m * k))
                mats = ([flat[q * m * k:(q + 1) * m * k].view(m, k) for q in range(n)] if m * k <= flat.numel()
                        else [torch.full((m, k), 0.02, dtype=tdt).to(dev)])
                table[i][j] = _gemv_s(torch, mats, x, min_time_s)
        out[name] = {"in_features": list(ks), "out_features": list(ms), "gemv_s": table}
        del flat
    return out


def _sparse_table(torch: Any, device: ComputeDevice, dtypes: dict[str, Any], quick: bool, seed: int,
                  min_time_s: float) -> dict[str, Any]:
    from devices.kernel_table import table_row_bytes
    from real.bench.bench_sparse_ffn import (
        D_MODEL,
        KERNELS,
        MIN_REPS,
        NEURONS,
        QUICK_D_MODEL,
        QUICK_NEURONS,
        bench_cache_rows,
    )
    from real.runtime.cache_matrices import GATHER_ROW_PAD_BYTES, TransposeScratch, gather_rows

    F = torch.nn.functional
    dev = device.torch_device()
    ds, ks = (QUICK_D_MODEL, QUICK_NEURONS) if quick else (D_MODEL, NEURONS)
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    scratch = HostScratch(device)           # page-locked on CUDA, as the backend's
    try:
        for name, tdt in dtypes.items():
            es = torch.empty((), dtype=tdt).element_size()
            table = {key: [[0.0] * len(ks) for _ in ds] for key in KERNELS}
            for i, d in enumerate(ds):
                row_bytes = table_row_bytes(d, es)
                w = d                         # elements per segment (gate | up | down, 4 KiB-aligned rows)
                for j, k in enumerate(ks):
                    mem, rows = bench_cache_rows(torch, k, row_bytes, tdt, seed)
                    buf = scratch.get(k, row_bytes + GATHER_ROW_PAD_BYTES)
                    down_t = TransposeScratch(torch, dev)
                    x = torch.randn(1, d).to(tdt).to(dev)
                    times: list[tuple[float, float, float, float]] = []
                    t_all = time.perf_counter()
                    with torch.no_grad():
                        while len(times) < MIN_REPS + 1 or time.perf_counter() - t_all < min_time_s:
                            slots = np.sort(rng.choice(len(rows), k, replace=False))
                            torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            g = gather_rows(rows, slots, buf, tdt)
                            t_gather = time.perf_counter() - t0
                            t1 = time.perf_counter()
                            segs = [g[:, s * w:(s + 1) * w].to(dev, non_blocking=True) for s in range(3)]
                            torch.cuda.synchronize()
                            t2 = time.perf_counter()
                            h = F.linear(x, segs[0]) * F.linear(x, segs[1])
                            torch.cuda.synchronize()
                            t3 = time.perf_counter()
                            down = down_t.transposed(segs[2], k, d, es)
                            torch.cuda.synchronize()
                            t4 = time.perf_counter()
                            F.linear(h, down)
                            torch.cuda.synchronize()
                            t5 = time.perf_counter()
                            times.append((t_gather + t2 - t1, (t3 - t2) / 2, t4 - t3, t5 - t4))
                            if len(times) > 10000:
                                break
                    for key, v in zip(KERNELS, mean_call_s(times[1:], axis=0)):
                        table[key][i][j] = float(v)
                    del rows, mem
            out[name] = {"d_model": list(ds), "neurons": list(ks), **table}
    finally:
        scratch.close()
    return out


def _memory(torch: Any, device: ComputeDevice, nbytes: int, min_time_s: float) -> dict[str, Any]:
    """GPU copy and triad (STREAM counting) and the page-locked host-to-device rate."""
    from real.io.buffers import AlignedBuffer

    dev = device.torch_device()
    n = nbytes // 4
    a, b, c = (torch.full((n,), v).to(dev) for v in (0.0, 1.0, 2.0))

    def copy(_r: int) -> Any:
        return a.copy_(b)

    def triad(_r: int) -> Any:
        return torch.add(b, c, alpha=3.0, out=a)

    t_copy = sync_batch_s(torch, copy, _reps_for(torch, copy, min_time_s, 3))
    t_triad = sync_batch_s(torch, triad, _reps_for(torch, triad, min_time_s, 3))
    host = AlignedBuffer(nbytes)
    host.array[:] = 1
    handle = pin_host_buffer(host.array, device)
    try:
        src = torch.from_numpy(host.array[:nbytes])

        def h2d(_r: int) -> Any:
            return src.to(dev, non_blocking=True)

        t_h2d = sync_batch_s(torch, h2d, _reps_for(torch, h2d, min_time_s, 3))
    finally:
        unpin_host_buffer(handle)
    return {"copy_bytes": nbytes, "copy_s": t_copy, "memcpy_bytes_per_s": nbytes / t_copy,
            "stream_copy_bytes_per_s": 2.0 * nbytes / t_copy,
            "triad_s": t_triad, "stream_triad_bytes_per_s": 3.0 * nbytes / t_triad,
            "h2d_bytes_per_s": nbytes / t_h2d,
            "how": (f"GPU memory bandwidth = STREAM-style copy traffic on the GPU (2 x {nbytes >> 20} MiB / time; "
                    f"triad {3.0 * nbytes / t_triad / 1e9:.1f} GB/s, pinned host-to-device {nbytes / t_h2d / 1e9:.1f} GB/s)")}


def run_cuda_compute_bench(torch: Any, device: ComputeDevice, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """All CUDA compute measurements (JSON-ready), in the shape of real.bench.bench_compute's result."""
    import os

    props = torch.cuda.get_device_properties(0)
    dtypes = cuda_dtypes(torch, int(getattr(props, "major", 0)))
    dev = device.torch_device()
    pool = _pool_bytes(int(getattr(props, "L2_cache_size", 0) or 0), quick)
    min_time_s = 0.05 if quick else 0.3
    M, K = QUICK_SHAPE if quick else DENSE_SHAPE
    torch.manual_seed(seed)
    per = _dense(torch, dev, dtypes, (M, K), pool, min_time_s)
    sparse = _sparse_table(torch, device, dtypes, quick, seed, 0.02 if quick else 0.1)
    # the single gather rate: the backend's gather + transfer of GATHER_FRACTION of [M, K] fp32 rows,
    # read off the sparse table's corner nearest that many rows
    s32 = sparse["fp32"]
    rows = int(M * GATHER_FRACTION)
    j = int(np.argmin([abs(k - rows) for k in s32["neurons"]]))
    from devices.kernel_table import table_row_bytes
    i = len(s32["d_model"]) - 1
    gather_bytes = s32["neurons"][j] * table_row_bytes(s32["d_model"][i], 4)
    for v in per.values():
        v["gather_bytes_per_s"] = gather_bytes / s32["gather_s"][i][j]
    a, b, c = (torch.ones(1).to(dev) for _ in range(3))
    t_op = sync_batch_s(torch, lambda _r: torch.add(a, b, out=c), OP_REPS)
    memory = _memory(torch, device, QUICK_COPY_BYTES if quick else COPY_BYTES, min_time_s)
    capacity = int(props.total_memory) if not device.unified_memory else \
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "framework": f"torch {torch.__version__}, CUDA on {device.name}"
                     + (" (unified memory)" if device.unified_memory else ""),
        "device": {"kind": "cuda", "name": device.name, "unified_memory": device.unified_memory,
                   "capability": [int(getattr(props, "major", 0)), int(getattr(props, "minor", 0))],
                   "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0), "pool_bytes": pool},
        "threads": torch.get_num_threads(), "dense_shape": [M, K], "gather_fraction": GATHER_FRACTION,
        "per_dtype": per, "op_overhead_s": t_op, "memory": memory, "memory_capacity_bytes": capacity,
        "memory_capacity_how": ("capacity = physical RAM (sysconf), shared with the GPU" if device.unified_memory
                                else "capacity = the GPU's memory (cudaDeviceProp.totalGlobalMem)"),
        "sparse_ffn": sparse,
        "dense_gemv": _dense_table(torch, dev, dtypes, quick, pool, 0.01 if quick else 0.04),
        "dense_gemv_pool_bytes": pool,
    }


def run_on(device: str, quick: bool = False, framework: str = "auto", seed: int = 0,
           threads: int | None = None) -> dict[str, Any]:
    """`flashsim bench compute --device`: on "cpu", or "auto" without a GPU, real.bench.bench_compute's
    benches; on CUDA (real.runtime.device.choose_device) this module's, with the host gather at `threads`."""
    from real.bench.bench_compute import run_compute_bench
    from real.runtime.device import choose_device

    dev = choose_device(device)
    if dev.kind != "cuda":
        return run_compute_bench(quick=quick, framework=framework, seed=seed, threads=threads)
    if framework == "numpy":
        raise FlashsimError("--device cuda measures with torch; drop --framework numpy")
    if threads is not None and threads < 1:
        raise FlashsimError(f"--threads {threads}: must be >= 1")
    import torch

    from real.runtime.torch_threads import torch_threads

    with torch_threads(torch, threads):
        return run_cuda_compute_bench(torch, dev, quick=quick, seed=seed)


# the compute section's fields the CUDA bench measures; any other field of the CPU bench's section
# prices work that runs on the host CPU on a CUDA host too, and is kept from it (none today: every
# compute field the simulator has is the GPU's)
GPU_FIELDS = ("gemv_flops_per_s", "gather_bytes_per_s", "op_overhead_s", "gemv_row_s", "sparse_ffn", "dense_gemv",
              "transpose_bytes_per_s")


def cuda_compute_sections(result: dict[str, Any], cpu_compute: dict[str, Any] | None, date: str, command: str,
                          old_memory_source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(compute section, memory updates) from a CUDA result: real.bench.bench_compute.compute_sections'
    GPU fields, and the host-side fields of `cpu_compute` (the CPU bench's section of the same
    host) where given."""
    from real.bench.bench_compute import compute_sections

    compute, memory = compute_sections(result, date, command, old_memory_source)
    compute.pop("transpose_bytes_per_s", None)   # the sparse table holds the GPU's transposed copy
    # whether the GPU shares the DRAM is the device's own answer (cudaDeviceProp.integrated)
    memory["unified"] = bool(result["device"]["unified_memory"])
    memory["source"] = memory["source"].replace("reserved_bytes and unified kept from",
                                                "unified from cudaDeviceProp.integrated; reserved_bytes kept from")
    if cpu_compute:
        kept = {k: v for k, v in cpu_compute.items() if k not in GPU_FIELDS and k not in ("source", "threads")}
        compute.update(kept)
        if kept:
            compute["source"] += ("; host-side terms (" + ", ".join(sorted(kept)) + ") from the CPU bench of the same "
                                  "host: " + str(cpu_compute.get("source", "")).split(":", 1)[0])
    return compute, memory


def measured_cpu_compute(profile: Any) -> dict[str, Any] | None:
    """The compute section of `profile` as a mapping when the CPU bench of flashsim measured it (the
    host-side terms a CUDA section keeps); None for a datasheet or a CUDA section."""
    from real.validation.profile_writer import MEASURED_PREFIX

    src = str(profile.compute.source)
    if not src.startswith(f"{MEASURED_PREFIX} compute") or "CUDA on" in src:
        return None
    return profile.compute.model_dump(mode="json", exclude_none=True)
