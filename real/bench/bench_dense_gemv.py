"""`flashsim bench compute`'s table of dense GEMVs: seconds per call of y = W x for one token, W
[out_features, in_features] resident in DRAM, per dtype, over a grid of both sizes.

Why a table, not one rate per dtype. The profile's `gemv_flops_per_s` comes from one shape (a
Llama-2-7B FFN matrix, [11008, 4096]) and `gemv_row_s` from two fp32 shapes; the attention
projections, the lm_head and a dense FFN are priced from them. On an Intel Xeon VM (one thread)
that holds in fp32 (matrices of 16 MiB and more within 0-7%), not in the dtypes
the CPU has no arithmetic for, where torch's kernel converts as it goes and its speed follows the
shape:
  * fp16: a [4096, 11008] GEMV (a dense Llama-2-7B down projection) took 7.6 ms, [11008, 4096] of
    the same bytes 4.3 ms, and the single rate priced both at 3.2-3.9 ms; a small matrix
    ([1536, 576], SmolLM2's FFN) takes 0.12 ms in the table against 0.21 ms from the rate;
  * bf16: every matrix of 16 MiB and more ran at 1.9-2.3x the single rate's speed.

Each point times `F.linear(x, W)` back to back, each call on the next W of a pool (filled once,
with constant values: a GEMV's time does not depend on them) of POOL_LLC_MULTIPLE times the
last-level cache or MIN_POOL_BYTES, whichever is larger (`pool_bytes`), so that every call streams
its weights from DRAM, as a decode does layer after layer. A fixed pool fails on large caches: a
64 MiB one stayed in a 480 MiB L3 and priced a SmolLM2 layer's four projections at 152 us where the
real runs took 350. Twice the L3 is not enough either: on an AMD EPYC VM (32 MiB L3, a victim cache whose replacement keeps part of a working set
cycled through it) a [1024, 1024] fp32 GEMV over a 64 MiB pool took 207-320 us where pools of
128-512 MiB, and the validation shape's layers, read it at DRAM speed (240-340 us, the host's
own drift between the two measurements), so the table priced shape mode's attention 7-30% short.
(An untimed
sweep over the caches before each call instead made fp32 [1024, 1024] 15-20% slower: the kernel's
code and page-table entries go cold too, which the simulator's compute-after-a-read-wait term
covers where a run has such a wait.) A cell is the median over PASSES passes through the dtype's
whole grid of each pass's mean of at least MIN_REPS calls (after one warm-up; real/bench/call_time.py
says why the mean): on the first host a cell measured twice a minute apart moved by up to 20%.
One dtype's pool is freed before the next one's is filled; a matrix larger than the pool (16384 x
16384 fp32: 1 GiB) gets its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from real.bench.call_time import mean_call_s

# the grid: in_features (model widths 576 .. 8192 and a 7B's d_ff 11008 as the down GEMV's width)
# x out_features (a GQA k/v projection's 128-256 rows .. a vocabulary's tens of thousands; beyond
# the largest, the table's edge rate per element: a GEMV that big streams)
IN_FEATURES = (512, 1024, 2048, 4096, 8192, 16384)
OUT_FEATURES = (128, 512, 2048, 8192, 16384)
QUICK_IN_FEATURES = (512, 2048)
QUICK_OUT_FEATURES = (128, 2048)
MIN_REPS = 3
PASSES = 3       # whole-grid passes; a cell's median over them (the host's state drifts over seconds)
MIN_POOL_BYTES = 256 << 20
POOL_LLC_MULTIPLE = 4   # 2x left a victim L3 partly hit (module docstring); 4x read at DRAM speed
LLC_FALLBACK_BYTES = 32 << 20   # where the OS does not say (sysfs): the largest L3 of the hosts first measured


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The CPU's last-level cache in bytes, from sysfs (Linux); LLC_FALLBACK_BYTES where unreadable."""
    best: tuple[int, int] = (0, 0)
    for d in sysfs.glob("index*"):
        try:
            level = int((d / "level").read_text())
            size = (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        n = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size) if size.isdigit() else 0
        best = max(best, (level, n))
    return best[1] or LLC_FALLBACK_BYTES


def pool_bytes() -> int:
    """Bytes of distinct weights a cell cycles through: POOL_LLC_MULTIPLE times the last-level
    cache, at least MIN_POOL_BYTES (module docstring)."""
    return max(MIN_POOL_BYTES, POOL_LLC_MULTIPLE * last_level_cache_bytes())


def dense_gemv_table(torch: Any, dtypes: dict[str, Any], quick: bool = False, seed: int = 0,
                     min_time_s: float = 0.04, passes: int = PASSES) -> dict[str, Any]:
    """{dtype: {in_features, out_features, gemv_s ([i][j] seconds at in_features[i],
    out_features[j])}}, measured with torch on the CPU on the current thread setting: per cell, the
    median over `passes` passes through the whole grid of each pass's mean call."""
    ks, ms = (QUICK_IN_FEATURES, QUICK_OUT_FEATURES) if quick else (IN_FEATURES, OUT_FEATURES)
    runs = {name: np.zeros((passes, len(ks), len(ms))) for name in dtypes}
    pool_b = pool_bytes()
    for name, tdt in dtypes.items():
        pool = WeightPool(torch, tdt, pool_b)
        for p in range(passes):
            for i, k in enumerate(ks):
                x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed)).to(tdt)
                for j, m in enumerate(ms):
                    runs[name][p, i, j] = _mean_call_s(torch, pool, m, k, x, min_time_s)
        del pool
    return {name: {"in_features": list(ks), "out_features": list(ms),
                   "gemv_s": np.median(r, axis=0).tolist()} for name, r in runs.items()}


class WeightPool:
    """Distinct [m, k] matrices, each the next slice of one buffer of `nbytes` (filled once), handed
    out round robin: a slice is read again only after the rest of the buffer was (module docstring).
    A matrix larger than the buffer gets its own (it streams from DRAM by its size alone)."""

    ALIGN = 64   # elements: slices start on cache lines

    def __init__(self, torch: Any, tdt: Any, nbytes: int):
        self.torch, self.tdt = torch, tdt
        es = torch.empty((), dtype=tdt).element_size()
        self.buf = torch.empty(nbytes // es, dtype=tdt).fill_(0.02)
        self.pos = 0

    def warm(self) -> None:
        """Read the whole buffer once, untimed: its page-table entries are then as recent as in a
        table cell, whose calls cycle through the pool every few tens of milliseconds. (A pool last
        touched seconds ago made the first GEMVs over it 1.2-1.5x slower here: real/validation/drift.py.)"""
        self.buf.sum()

    def next(self, m: int, k: int) -> Any:
        n = m * k
        if n > self.buf.numel():
            return self.torch.empty(m, k, dtype=self.tdt).fill_(0.02)
        if self.pos + n > self.buf.numel():
            self.pos = 0
        w = self.buf[self.pos:self.pos + n].view(m, k)
        self.pos += -(-n // self.ALIGN) * self.ALIGN
        return w


def _mean_call_s(torch: Any, pool: WeightPool, m: int, k: int, x: Any, min_time_s: float) -> float:
    """One cell in one pass: the mean F.linear call, each on the pool's next [m, k] matrix."""
    F = torch.nn.functional
    times: list[float] = []
    t_all = time.perf_counter()
    with torch.no_grad():
        while len(times) < MIN_REPS + 1 or time.perf_counter() - t_all < min_time_s:
            w = pool.next(m, k)
            t0 = time.perf_counter()
            F.linear(x, w)
            times.append(time.perf_counter() - t0)
            if len(times) > 10000:
                break
    return float(mean_call_s(times[1:]))   # the first call: warm-up
