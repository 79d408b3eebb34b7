"""`flashsim bench compute`: dense and gathered GEMV per dtype, DRAM bandwidth and per-op overhead
(FLOP/s, bytes/s, seconds), with torch when installed, NumPy otherwise.

* Dense GEMV: y = W x with W [M, K] = [11008, 4096] (one Llama-2-7B FFN matrix; --quick uses
  [4096, 2048]), one token, on `threads` compute threads (default: the framework's own setting).
  FLOPs = 2 M K per call. The thread count is written to the profile (`compute.threads`): on a
  host whose cores are shared, 1 and 2 threads differ by far more than 2x (per-op barriers wait for
  descheduled workers), so real runs use the profile's count and warn when they run another.
* Gathered GEMV: copy a seeded random 10% of W's rows into a preallocated buffer (torch: the real
  backend's own `real.runtime.cache_matrices.gather_rows` from rows held in an AlignedBuffer, its neuron cache's
  memory; NumPy: `np.take(..., out=)`), then multiply: the sparse-FFN pattern. The
  gather's bytes/s is what the profile's `gather_bytes_per_s` models. Successive repetitions
  rotate through GATHER_SETS different index sets, as successive tokens do, and each runs after an
  untimed sweep over EVICT_BYTES (64 MiB: twice the L3 of the host first measured; see
  real/bench/bench_sparse_ffn.py for a larger L3): in a decode every layer's
  gather follows its attention, its reads and the other layers' work, so neither its rows nor its
  destination scratch are in the caches (a 384 x 8 KiB SmolLM2 gather here: 16 GB/s into a warm
  scratch, 11.5 GB/s after a sweep).
* DRAM bandwidth: a copy of a 512 MiB buffer (--quick: 128 MiB), counted
  as STREAM does, bytes read + bytes written per second (2 x size / time). The neuron cache's
  `bytes_moved` is one side of a copy, so a move costs 2 x bytes_moved / bandwidth.
* Per-op overhead: an elementwise add of 1-element tensors into a preallocated output.
* GEMV row cost (torch): two GEMVs of the same bytes (64 MiB fp32; --quick 16 MiB), one with
  ROW_SHAPES' many short rows, one with few long rows. Both stream their weights from DRAM (far
  beyond any L3), so the difference is the per-row work (the kernel's inner-loop setup and the
  hardware prefetcher restarting at each row): gemv_row_s = (t_many - t_few) / (rows_many -
  rows_few). Measured here: 70 ns per row, which makes a 1024-wide fp32 GEMV stream at 20 GB/s
  against 25 GB/s for 4096-wide rows. The GEMV rates written to the profile are the dense GEMV's
  with its rows' share removed, so rate + row cost reproduce the dense measurement.
* Transposed copy (torch): the real backend's sparse FFN gathers cache rows
  (`real.runtime.cache_matrices.gather_rows`) and copies the down segment transposed ([k, d] -> [d, k], the layout
  the dense kernel reads); measured on TRANSPOSE_SHAPE's padded rows with the backend's own gather.
* Sparse-FFN kernel table (torch): the real backend's gather, gate/up GEMV on the gathered rows,
  transposed down copy and down GEMV, per dtype over a grid of widths and computed neurons
  (real/bench/bench_sparse_ffn.py: one measured rate per kernel was 1.7x off at a 7B fp16 layer).
* Dense GEMV table (torch): y = W x per dtype over in_features x out_features, weights streamed
  from DRAM (real/bench/bench_dense_gemv.py: in fp16 and bf16 the single rate was 0.4-2.3x off by shape).
Every figure is the mean over repetitions (at least 5, for at least `min_time_s` in total; why the
mean: real/bench/call_time.py); the JSON also gives the minima, whose gap to the means shows contention
from other work on the host.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from devices.errors import FlashsimError
from real.bench.bench_dense_gemv import dense_gemv_table, pool_bytes
from real.bench.bench_sparse_ffn import sparse_ffn_table
from real.bench.call_time import mean_call_s
from real.io.buffers import AlignedBuffer
from real.runtime.cache_matrices import TransposeScratch, gather_rows, gather_scratch
from real.runtime.torch_threads import torch_threads
from real.validation.profile_writer import sig4

DENSE_SHAPE = (11008, 4096)
QUICK_SHAPE = (4096, 2048)
GATHER_FRACTION = 0.10
GATHER_SETS = 8
EVICT_BYTES = 64 << 20        # swept (one byte per 64 B line) before each timed gather: caches cold
COPY_BYTES = 512 << 20
# (many short rows, few long rows) of the same bytes, fp32: 64 MiB each (--quick: 16 MiB)
ROW_SHAPES = ((16384, 1024), (1024, 16384))
QUICK_ROW_SHAPES = ((4096, 1024), (256, 16384))
# cache rows of a d_model 1024 fp32 bundle (gate | up | down = 12 KiB, a padded store's stride),
# 10% of 4096 gathered, the down segment transposed
TRANSPOSE_SHAPE = (4096, 1024)
# the tiny llama of the host CPU probe's framework compute (real/bench/bench_host_cpu.py): hidden 64, 2 heads
# of 32 (1 KV head), FFN 128, vocab 256
FRAMEWORK_DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
                  "head_dim": 32, "vocab_size": 256}
QUICK_COPY_BYTES = 128 << 20


def _times_s(fn: Callable[[], Any], min_time_s: float, min_reps: int = 5,
             before: Callable[[], Any] | None = None) -> np.ndarray:
    """Wall times of repeated calls (after one warm-up call); `before` runs untimed before each."""
    fn()  # warm-up: first-touch page faults, lazy init
    times: list[float] = []
    t_total = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - t_total < min_time_s:
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if len(times) > 100000:
            break
    return np.asarray(times)


def _call_s(fn: Callable[[], Any], min_time_s: float, min_reps: int = 5) -> float:
    """Seconds per call of `fn` (real.bench.call_time: the mean of the timed calls)."""
    return float(mean_call_s(_times_s(fn, min_time_s, min_reps)))


def _have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def run_compute_bench(quick: bool = False, framework: str = "auto", seed: int = 0,
                      threads: int | None = None) -> dict[str, Any]:
    """All compute measurements (JSON-ready); `threads`: compute threads (torch), None = default.
    (On a GPU: real/bench/bench_cuda.py.)"""
    use_torch = framework == "torch" or (framework == "auto" and _have_torch())
    if threads is not None and threads < 1:
        raise FlashsimError(f"--threads {threads}: must be >= 1")
    if threads is not None and not use_torch:
        raise FlashsimError("--threads needs torch (NumPy's BLAS threads are fixed at start-up: set "
                            "OMP_NUM_THREADS instead)")
    if use_torch:
        import torch

        with torch_threads(torch, threads):
            return _run(quick, use_torch, seed)
    return _run(quick, use_torch, seed)


def _run(quick: bool, use_torch: bool, seed: int) -> dict[str, Any]:
    M, K = QUICK_SHAPE if quick else DENSE_SHAPE
    min_time_s = 0.1 if quick else 0.5
    rng = np.random.default_rng(seed)
    w32 = (rng.random((M, K), dtype=np.float32) - 0.5) * 0.04
    x32 = rng.standard_normal(K, dtype=np.float32)
    sets = [np.sort(rng.choice(M, int(M * GATHER_FRACTION), replace=False)) for _ in range(GATHER_SETS)]
    turn = itertools.cycle(range(GATHER_SETS))
    idx = sets[0]
    per_dtype: dict[str, dict[str, float]] = {}
    sweep = np.ones(EVICT_BYTES, np.uint8)

    def evict() -> None:
        sweep[::64] += 1
    if use_torch:
        import torch

        threads = torch.get_num_threads()
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        # the gathers read rows of the kind of memory the neuron cache is (AlignedBuffer: huge pages advised)
        cache_mem = AlignedBuffer(M * K * 4)
        for name, tdt in dtypes.items():
            w = torch.from_numpy(w32).to(tdt)
            x = torch.from_numpy(x32).to(tdt)
            buf = torch.empty((len(idx), K), dtype=tdt)
            out = torch.empty(M, dtype=tdt)
            out_g = torch.empty(len(idx), dtype=tdt)
            es = w.element_size()
            rows = cache_mem.array[: M * K * es].reshape(M, K * es)
            rows[:] = w.view(torch.uint8).numpy().reshape(M, K * es)
            scratch = gather_scratch(len(idx), K * es)
            with torch.no_grad():
                t_dense = _times_s(lambda w=w, x=x, out=out: torch.mv(w, x, out=out), min_time_s)
                # the real backend's gather (real.runtime.cache_matrices.gather_rows) from the cache's kind of memory
                t_gather = _times_s(lambda rows=rows, scratch=scratch, tdt=tdt:
                                    gather_rows(rows, sets[next(turn)], scratch, tdt), min_time_s, before=evict)
                t_mv = _times_s(lambda buf=buf, x=x, out_g=out_g: torch.mv(buf, x, out=out_g), min_time_s)
            per_dtype[name] = _entry(M, K, len(idx), w.element_size(), t_dense, t_gather, t_mv)
        a, b, c = torch.ones(1), torch.ones(1), torch.empty(1)
        t_op = _call_s(lambda: torch.add(a, b, out=c), min_time_s, min_reps=1000)
        fw = f"torch {torch.__version__}"
        extra = {"gemv_rows": _row_cost(torch, QUICK_ROW_SHAPES if quick else ROW_SHAPES, min_time_s),
                 "transpose": _transpose_rate(torch, rng, min_time_s),
                 "sparse_ffn": sparse_ffn_table(torch, dtypes, quick=quick, seed=seed,
                                                min_time_s=0.05 if quick else 0.2),
                 "dense_gemv": dense_gemv_table(torch, dtypes, quick=quick, seed=seed,
                                                min_time_s=0.01 if quick else 0.04),
                 "dense_gemv_pool_bytes": pool_bytes()}
    else:
        threads = int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count() or 1
        for name, ndt in {"fp32": np.float32, "fp16": np.float16}.items():
            w, x = w32.astype(ndt), x32.astype(ndt)
            buf = np.empty((len(idx), K), ndt)
            t_dense = _times_s(lambda w=w, x=x: w @ x, min_time_s)
            t_gather = _times_s(lambda w=w, buf=buf: np.take(w, sets[next(turn)], axis=0, out=buf), min_time_s,
                                before=evict)
            t_mv = _times_s(lambda buf=buf, x=x: buf @ x, min_time_s)
            per_dtype[name] = _entry(M, K, len(idx), w.itemsize, t_dense, t_gather, t_mv)
        a, b, c = np.ones(1), np.ones(1), np.empty(1)
        t_op = _call_s(lambda: np.add(a, b, out=c), min_time_s, min_reps=1000)
        fw = f"numpy {np.__version__}"
        extra = {}
    copy = _copy_bandwidth(QUICK_COPY_BYTES if quick else COPY_BYTES, min_time_s)
    return {
        "framework": fw, "threads": threads, "dense_shape": [M, K], "gather_fraction": GATHER_FRACTION,
        "per_dtype": per_dtype, "op_overhead_s": t_op, "memory": copy,
        "memory_capacity_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "load_average_1min": os.getloadavg()[0],   # other work on the host: compare means with minima
        **extra,
    }


def _row_cost(torch: Any, shapes: tuple[tuple[int, int], ...], min_time_s: float) -> dict[str, Any]:
    """Per-row GEMV cost from two cold GEMVs of equal bytes (module docstring)."""
    (m1, _), (m2, _) = shapes
    F = torch.nn.functional
    times = []
    for m, k in shapes:
        w, x = torch.randn(m, k), torch.randn(1, k)
        with torch.no_grad():
            times.append(_call_s(lambda w=w, x=x: F.linear(x, w), min_time_s))
    row_s = max(0.0, (times[0] - times[1]) / (m1 - m2))
    return {"shapes": [list(s) for s in shapes], "gemv_s": times, "row_s": row_s}


def tiny_llama(torch: Any, n_layers: int, seed: int) -> tuple[Any, Any, np.ndarray] | None:
    """A random transformers llama of FRAMEWORK_DIMS and `n_layers` layers (seeded), its decode
    step's cache argument and a one-token input, for real.runtime.model_mode's `_decode_step`; None without
    transformers. The framework probes of bench compute and bench flash run it."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    from real.runtime.model_mode import _cache_arg

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=n_layers, **FRAMEWORK_DIMS)).eval()
    return model, _cache_arg(model), np.ones((1, 1), np.int64)


def _transpose_rate(torch: Any, rng: np.random.Generator, min_time_s: float) -> dict[str, Any]:
    """bytes/s of the down segment's transposed copy after the backend's own gather."""
    n, d = TRANSPOSE_SHAPE
    rows = rng.integers(0, 64, (n, 3 * d * 4), dtype=np.uint8)   # small bytes: finite fp32 values
    k = int(n * GATHER_FRACTION)
    slots = [np.sort(rng.choice(n, k, replace=False)) for _ in range(GATHER_SETS)]
    scratch = gather_scratch(k, rows.shape[1])
    turn = itertools.cycle(range(GATHER_SETS))
    gathered = [gather_rows(rows, slots[i], scratch, torch.float32).clone()[:, 2 * d:3 * d] for i in range(2)]
    dst = TransposeScratch(torch)
    t = _call_s(lambda: dst.transposed(gathered[next(turn) % 2], k, d, 4), min_time_s)
    return {"rows": [k, d], "row_bytes": rows.shape[1], "seconds": t, "bytes_per_s": k * d * 4 / t}


def _entry(M: int, K: int, rows: int, es: int, dense: np.ndarray, gather: np.ndarray,
           mv: np.ndarray) -> dict[str, float]:
    """Means (what the profile uses: real.bench.call_time) and minima (the best seen: on a host shared
    with other work, a large mean/min gap shows contention, not the hardware)."""
    t_dense, t_gather, t_mv = (float(mean_call_s(a)) for a in (dense, gather, mv))
    return {
        "dense_gemv_s": t_dense, "dense_gemv_min_s": float(dense.min()), "dense_gemv_flops_per_s": 2.0 * M * K / t_dense,
        "gather_s": t_gather, "gather_min_s": float(gather.min()), "gather_bytes_per_s": rows * K * es / t_gather,
        "gathered_gemv_s": t_gather + t_mv, "gathered_gemv_flops_per_s": 2.0 * rows * K / (t_gather + t_mv),
        "gathered_compute_only_flops_per_s": 2.0 * rows * K / t_mv,
    }


def sig4_rows(table: list[list[float]]) -> list[list[float]]:
    """A table's values to four significant figures (as the profile's other numbers)."""
    return [[sig4(x) for x in row] for row in table]


def _copy_bandwidth(nbytes: int, min_time_s: float) -> dict[str, Any]:
    """STREAM-style copy of nbytes (2 x bytes / time, the profile's bandwidth) and, with torch, the
    triad a = b + s c over three float32 arrays of nbytes / 2 each (3 x bytes / time, one pass:
    torch.add with alpha), reported beside it."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    t = _call_s(lambda: np.copyto(dst, src), min_time_s, min_reps=3)
    out: dict[str, Any] = {"copy_bytes": nbytes, "copy_s": t, "memcpy_bytes_per_s": nbytes / t,
                           "stream_copy_bytes_per_s": 2.0 * nbytes / t}
    src = dst = np.empty(0, np.uint8)   # freed before the triad's arrays
    if _have_torch():
        import torch

        n = nbytes // 2 // 4
        a, b, c = torch.zeros(n), torch.ones(n), torch.full((n,), 2.0)
        t3 = _call_s(lambda: torch.add(b, c, alpha=3.0, out=a), min_time_s, min_reps=3)
        out.update(triad_bytes=3 * n * 4, triad_s=t3, stream_triad_bytes_per_s=3.0 * n * 4 / t3)
    return out


def _table_section(tables: dict[str, Any], prefix: str, command: str, what: str) -> dict[str, Any]:
    """A kernel table's profile section: per dtype, the axes as measured and the seconds at 4
    significant digits, and its source."""
    return {"tables": {k: {a: (sig4_rows(b) if isinstance(b[0], list) else b) for a, b in v.items()}
                       for k, v in tables.items()},
            "source": f"{prefix}: {what}; `{command}`"}


def compute_sections(result: dict[str, Any], date: str, command: str,
                     old_memory_source: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(compute section, memory updates) of the profile from a bench result."""
    per = result["per_dtype"]
    gather_dtype = "fp32" if "fp32" in per else next(iter(per))
    prefix = f"measured by flashsim bench compute ({date}, {result['framework']}, {result['threads']} threads)"
    M, K = result["dense_shape"]
    row_s = float(result.get("gemv_rows", {}).get("row_s", 0.0))
    rates = {}
    for k, v in per.items():   # the dense GEMV's time less its rows' share (kept >= half the time)
        t = v["dense_gemv_s"]
        rates[k] = sig4(2.0 * M * K / max(t - M * row_s, 0.5 * t))
    how = [f"dense GEMV {M}x{K} per dtype less {M} rows x gemv_row_s",
           f"gather of {result['gather_fraction']:.0%} of rows ({gather_dtype})", "1-element add per op"]
    compute = {
        "gemv_flops_per_s": rates,
        "gather_bytes_per_s": sig4(per[gather_dtype]["gather_bytes_per_s"]),
        "op_overhead_s": sig4(result["op_overhead_s"]),
        "gemv_row_s": sig4(row_s),
        "threads": int(result["threads"]),
    }
    if "gemv_rows" in result:
        how.append("gemv_row_s from cold GEMVs {} vs {}".format(*result["gemv_rows"]["shapes"]))
    if "transpose" in result:
        compute["transpose_bytes_per_s"] = sig4(result["transpose"]["bytes_per_s"])
        how.append("transposed copy of {}x{} gathered fp32 rows".format(*result["transpose"]["rows"]))
    if "sparse_ffn" in result:
        first = next(iter(result["sparse_ffn"].values()))
        compute["sparse_ffn"] = _table_section(
            result["sparse_ffn"], prefix, command,
            "the real backend's sparse-FFN kernels (gather, gate/up GEMV on the gathered rows, transposed down "
            f"copy, down GEMV) per dtype at d_model {first['d_model']} x neurons {first['neurons']} "
            "(real/bench/bench_sparse_ffn.py)")
        how.append("sparse-FFN kernel table per dtype")
    if "dense_gemv" in result:
        first = next(iter(result["dense_gemv"].values()))
        compute["dense_gemv"] = _table_section(
            result["dense_gemv"], prefix, command,
            f"dense GEMVs (one token, weights streamed from DRAM: each call on the next matrix of a "
            f"{result.get('dense_gemv_pool_bytes', 64 << 20) >> 20} MiB pool) per dtype at in_features "
            f"{first['in_features']} x out_features {first['out_features']} (real/bench/bench_dense_gemv.py)")
        how.append("dense GEMV table per dtype")
    compute["source"] = f"{prefix}: {'; '.join(how)}; `{command}`"
    mem = result["memory"]
    kept = old_memory_source.split("kept from: ", 1)[-1]  # do not nest earlier runs' text
    how_bw = mem.get("how") or (f"bandwidth = STREAM-style copy traffic (2 x {mem['copy_bytes'] >> 20} MiB / time)"
                                + (f"; triad {mem['stream_triad_bytes_per_s'] / 1e9:.1f} GB/s"
                                   if "stream_triad_bytes_per_s" in mem else ""))
    memory = {
        "capacity_bytes": int(result["memory_capacity_bytes"]),
        "bandwidth_bytes_per_s": sig4(mem["stream_copy_bytes_per_s"]),
        "source": f"{prefix}: {result.get('memory_capacity_how', 'capacity = physical RAM (sysconf)')}; {how_bw}; "
                  f"reserved_bytes and unified kept from: {kept}",
    }
    return compute, memory
