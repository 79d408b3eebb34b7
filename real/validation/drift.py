"""How far the host is from its profile right now: short disk and CPU checks (ratios, no units).

A profile is a measurement of minutes ago. On a shared host the disk has slow spells and the CPU's
speed drifts (on this VM: small random reads 20% faster or slower from one minute to the next,
GEMVs 10-30% over tens of minutes), and `flashsim validate` compares runs against a simulation of the profile, so it checks the
host at its start, between real runs every CHECK_EVERY_S seconds (`--check-every`; 0: after every
run, so each run sits between two checks, for a host whose state flips within seconds), and at its end:

* **disk**: real.io.reader reads batches of random neurons (alternately DISK_BATCH_NEURONS) of a small
  store (`real.bench.bench_reader.bench_store`) for `duration_s`, the first WARMUP_BATCHES untimed (in a fresh
  process they took 1.2-1.5x the rest: thread start, first touches); the ratio is the reads' measured seconds over
  the profile's time for the same reads (read table + batch overhead), summed. 1.0 = as profiled,
  1.3 = the disk is 30% slower than the profile says.
* **cpu**: a cold fp32 GEMV of DRIFT_GEMV_SHAPE (64 MiB of weights) timed against the profile's
  prediction: its dense GEMV table's call where it has one, else FLOPs at
  compute.gemv_flops_per_s.fp32 + rows x gemv_row_s. Each check's calls take the next matrices of
  the table's own pool (real.bench.bench_dense_gemv.pool_bytes), so the GEMV streams
  from DRAM as the table's did, on the profile's compute.threads (1 without): on other threads, or
  over matrices a large L3 keeps (two 64 MiB ones in a 480 MiB L3), checks of a grid calibrated
  minutes before read 0.57-0.73x. The check reads the whole pool once, untimed, first
  (WeightPool.warm), because a table cell's calls cycle through the pool every few tens of
  milliseconds while checks come seconds apart: a process that slept 5 / 20 / 40 s ran its first
  GEMVs 1.19 / 1.46 / 1.55x the profile's time and 1.04-1.09x right after, so an unwarmed check
  reads its own cold start as host drift (a quick validation's checks: 1.04-1.30x unwarmed,
  1.01-1.12x warmed).
* **cpu_512, cpu_1024** (profiles with an fp32 dense GEMV table): the same check on [2048, 512]
  and [2048, 1024] GEMVs (table cells, so the prediction is a measured point, not an interpolation),
  each over the profile's cell. This host's GEMV drift depends on the matrix's width, so the
  [4096, 4096] check cannot stand for the narrow projections of the validation shape (d_model 1024)
  and SmolLM2 (576): on an AMD EPYC VM one session's table read 1.23-1.42x the calibration's at
  in_features 512 and 1.07-1.37x at 1024 against 0.85-1.06x at 2048-16384, for 6 minutes on end,
  while the [4096, 4096] check read 0.98x.
  `profile_at_drift` scales each dense-table row by the ratio at its in_features (512, 1024 and the
  cpu check's 4096, interpolated in log2 of the width, the nearest measured width's beyond them)
  and the sparse-FFN kernels' GEMVs at theirs (d_model for gate / up, neurons for down).
* **read_4k, read_16k, read_64k** (profiles with a read table): random reads of each of
  READ_CHECK_CHUNKS at the profile's deepest queue, `bench flash`'s own loop for READ_CHECK_S on
  the same small store's file, over the table's time for them. This disk's drift depends on the
  read size: small reads deep in the queue switch between two rates for seconds to a minute (4 KiB
  x 32: 0.49-1.01x one profile 2.5 s apart, 16 KiB x 32 0.96-1.67x) while 64 KiB and larger stay
  within a few percent, so one ratio cannot correct the whole
  table. `profile_at_drift` scales each table row by these ratios interpolated in log2 of the
  chunk size (the nearest measured size's ratio beyond them).

`drift_warning` flags a ratio more than DRIFT_WARN off 1. `profile_at_drift` is the profile as a
check found the host; `DriftLog` keeps a validation's checks and interpolates them in time, so
validate replays every configuration on the profile as the host was while that configuration ran
and reports those errors apart (`drift_corrected`): a reader can tell the model's error from the
host's drift.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np

from real.bench.bench_reader import bench_store, reader_batches, table_time_s
from real.runtime.torch_threads import torch_threads

DRIFT_GEMV_SHAPE = (4096, 4096)
DRIFT_WARN = 0.15
WARN_LISTED = 3         # drift_warning names up to this many checks per ratio, then sums them up
CHECK_EVERY_S = 10.0    # validate checks the host again after a real run ending this long after the last check
# (`--check-every`; 0 checks after every run, so each run sits between two checks: module doc)
DISK_BATCH_NEURONS = (16, 512)   # the disk check's batches: a few reads per thread, and many
WARMUP_BATCHES = 8      # untimed: a fresh reader's first batches start its threads and touch new code and pages
READ_CHECK_CHUNKS = (4096, 16384, 65536)   # the read-size checks (module doc)
READ_CHECK_S = 0.15     # per size: ~3,000-20,000 reads at 32 in flight on this host
READ_KEYS = {c: f"read_{c // 1024}k" for c in READ_CHECK_CHUNKS}   # chunk bytes -> the check's ratio name
WIDTH_CHECK_ROWS = 2048                    # out_features of the width checks: a table column
WIDTH_KEYS = {512: "cpu_512", 1024: "cpu_1024"}   # in_features -> the width check's ratio name (module doc)
RATIOS = ("disk", "cpu", *READ_KEYS.values(), *WIDTH_KEYS.values())


def disk_ratio(profile: Any, folder: Path, seed: int, duration_s: float = 0.5
               ) -> tuple[float, dict[str, float]]:
    """(disk, reads): measured / profiled seconds of real.io.reader's batches (alternately
    DISK_BATCH_NEURONS neurons) on a small store written in `folder`, and the read-size ratios
    (`read_ratios` on the same store; {} without a read table)."""
    flash = profile.flash
    q = int(flash.max_in_flight)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD41F7]))
    measured = predicted = 0.0
    with bench_store(folder, seed) as store:
        batches = reader_batches(store, q, DISK_BATCH_NEURONS, duration_s, rng)
        for i, (_n, st, _call_s) in enumerate(batches):
            if i < WARMUP_BATCHES:
                continue
            measured += st.seconds
            predicted += table_time_s(flash.curve, st.chunk_bytes, q)
            predicted += float(flash.batch_overhead_at(np.array([min(q, st.reads_issued)]))[0])
        reads = read_ratios(profile, store.file_path(0, "bundled"), rng)
    disk = measured / predicted if predicted > 0 else float("nan")
    return disk, reads


def read_ratios(profile: Any, path: Path, rng: np.random.Generator,
                duration_s: float = READ_CHECK_S) -> dict[str, float]:
    """{"read_4k": ratio, ...}: measured / profiled time of random reads of each READ_CHECK_CHUNKS
    size at the profile's max_in_flight (`bench flash`'s loop on the file at `path`, direct I/O
    where the filesystem allows it); {} when the profile has no read table or the file is in RAM
    (a validation on tmpfs: nothing of the disk to measure)."""
    from real.bench.bench_io import BenchFile, random_read_bytes_per_s
    from real.io.fsinfo import RAM_FILESYSTEMS, filesystem_type

    flash = profile.flash
    if flash.read_table is None or filesystem_type(path) in RAM_FILESYSTEMS:
        return {}
    q = int(flash.max_in_flight)
    bf = BenchFile(path, 0, 0, None, keep=True)
    try:
        return {key: flash.bytes_per_s(c, q) / random_read_bytes_per_s(bf, c, q, duration_s, rng)
                for c, key in READ_KEYS.items()}
    finally:
        bf.close()


def cpu_check_predicted_s(profile: Any) -> float:
    """The profile's time for the cpu check's GEMV (module docstring): its fp32 dense GEMV table's
    call (measured as the check measures: F.linear, weights streamed from DRAM), else the rates'."""
    rows, cols = DRIFT_GEMV_SHAPE
    c = profile.compute
    table = c.dense_gemv.tables.get("fp32") if c.dense_gemv is not None else None
    if table is not None:
        return float(table.table().seconds_at(cols, np.array([rows], np.float64))[0])
    return 2.0 * rows * cols / c.flops_per_s("fp32") + rows * (c.gemv_row_s or 0.0)


def cpu_ratio(profile: Any, seed: int, repeats: int = 7) -> float | None:
    """Measured / profiled time of a cold fp32 GEMV (None without torch)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    rows, cols = DRIFT_GEMV_SHAPE
    return _cold_gemv_s(profile, rows, cols, seed, repeats) / cpu_check_predicted_s(profile)


def width_ratios(profile: Any, seed: int, repeats: int = 15) -> dict[str, float]:
    """{"cpu_512": ratio, "cpu_1024": ratio}: measured / profiled time of cold fp32 [WIDTH_CHECK_ROWS,
    width] GEMVs, the profile's time its fp32 dense table's cell there (module docstring); {} without
    torch or without a table that has those cells."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return {}
    c = profile.compute
    table = c.dense_gemv.tables.get("fp32") if c.dense_gemv is not None else None
    if table is None or WIDTH_CHECK_ROWS not in table.out_features:
        return {}
    j = table.out_features.index(WIDTH_CHECK_ROWS)
    cells = {w: table.gemv_s[table.in_features.index(w)][j] for w in WIDTH_KEYS if w in table.in_features}
    # the pool was warmed by the first width's timing: the second's follows it within milliseconds
    return {WIDTH_KEYS[w]: _cold_gemv_s(profile, WIDTH_CHECK_ROWS, w, seed, repeats, warm=i == 0) / s
            for i, (w, s) in enumerate(cells.items())}


def _cold_gemv_s(profile: Any, rows: int, cols: int, seed: int, repeats: int, warm: bool = True) -> float:
    """Median seconds of `repeats` fp32 [rows, cols] GEMVs, each on the next matrix of the check's
    pool (warmed first unless `warm` is False: module docstring), on the threads the profile's GEMVs
    were timed on."""
    import torch

    pool = _gemv_pool()
    x = torch.randn(1, cols, generator=torch.Generator().manual_seed(seed))
    times = []
    with torch_threads(torch, profile.compute.threads or 1), torch.no_grad():
        if warm:
            pool.warm()
        for _ in range(repeats):
            w = pool.next(rows, cols)
            t = time.perf_counter()
            torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - t)
    return float(np.median(times))


@functools.lru_cache(maxsize=1)
def _gemv_pool() -> Any:
    """The cpu check's fp32 weights: one pool the table's size (real.bench.bench_dense_gemv.pool_bytes),
    filled once per process and shared by every check of a validation."""
    import torch

    from real.bench.bench_dense_gemv import WeightPool, pool_bytes

    return WeightPool(torch, torch.float32, pool_bytes())


def host_drift(profile: Any, folder: Path, seed: int) -> dict[str, Any]:
    """{"disk": ratio, "cpu": ratio or None, "read_4k" ... (the read-size
    ratios, absent on a RAM filesystem), "cpu_512" ... (the width ratios, absent without a table),
    "t_s": perf_counter at the check's midpoint} (module docstring). The midpoint, not the end: a
    check takes ~1.2 s, as long as a shape-mode run, and a run checked right before and after
    (`flashsim validate --check-every 0`) sits halfway between them."""
    t = time.perf_counter()
    disk, reads = disk_ratio(profile, folder, seed)
    cpu = cpu_ratio(profile, seed)
    widths = width_ratios(profile, seed)
    return {"disk": disk, "cpu": cpu, **reads, **widths, "t_s": (t + time.perf_counter()) / 2}


def _finite(x: Any) -> bool:
    return x is not None and bool(np.isfinite(x))


def drift_warning(checks: dict[str, dict[str, Any]]) -> str | None:
    """One line naming, per ratio, the checks more than DRIFT_WARN off 1 (at most WARN_LISTED of them
    by name; more are summed up: how many of the checks, their range, and the median of all the
    checks, which says how the calibration's state compares with the grid's); None if none."""
    bad = []
    for what in RATIOS:
        measured = [(when, r) for when, c in checks.items() if _finite(r := c.get(what))]
        off = [(when, r) for when, r in measured if abs(r - 1.0) > DRIFT_WARN]
        if len(off) <= WARN_LISTED:
            bad += [f"{when} {what} {r:.2f}x" for when, r in off]
        else:
            lo, hi = min(r for _, r in off), max(r for _, r in off)
            med = float(np.median([r for _, r in measured]))
            bad.append(f"{what} at {len(off)} of {len(measured)} checks ({lo:.2f}-{hi:.2f}x; median of all {med:.2f}x)")
    if not bad:
        return None
    return ("WARNING: the host is not as profiled (measured / profiled time: " + ", ".join(bad) + "); "
            "the errors include that drift: re-run `flashsim bench flash` and `bench compute` right before validating")


class DriftLog:
    """A validation's host checks: `check()` now, `maybe_check()` when `every_s` (CHECK_EVERY_S by
    default; 0 = at every call) have passed since the last, and `ratios_at(t)`: each ratio
    interpolated linearly between the checks around perf_counter time t (the nearest check's outside
    them; 1.0 where no check measured it)."""

    def __init__(self, profile: Any, folder: Path, seed: int, every_s: float = CHECK_EVERY_S):
        self.profile, self.folder, self.seed, self.every_s = profile, folder, seed, every_s
        self.checks: list[dict[str, Any]] = []

    def check(self) -> dict[str, Any]:
        c = host_drift(self.profile, self.folder, self.seed)
        self.checks.append(c)
        return c

    def maybe_check(self) -> None:
        if self.every_s <= 0 or not self.checks or time.perf_counter() - self.checks[-1]["t_s"] >= self.every_s:
            self.check()

    @property
    def measured_reads(self) -> bool:
        """Did any check time the read sizes (not on a RAM filesystem)?"""
        return any(k in c for c in self.checks for k in READ_KEYS.values())

    def read_ratios_at(self, ratios: dict[str, float]) -> dict[int, float] | None:
        """{chunk bytes: ratio} out of `ratios_at`'s values, for profile_at_drift; None when no
        check timed the read sizes (their 1.0 would undo the disk ratio)."""
        return {c: ratios[k] for c, k in READ_KEYS.items()} if self.measured_reads else None

    def width_ratios_at(self, ratios: dict[str, float]) -> dict[int, float] | None:
        """{in_features: ratio} out of `ratios_at`'s values (the width checks and the cpu check's
        4096), for profile_at_drift; None when no check timed the widths."""
        if not any(k in c for c in self.checks for k in WIDTH_KEYS.values()):
            return None
        return {**{w: ratios[k] for w, k in WIDTH_KEYS.items()}, DRIFT_GEMV_SHAPE[1]: ratios["cpu"]}

    def ratios_at(self, t_s: float) -> dict[str, float] | None:
        """Each of RATIOS at time t_s; None before any check measured the disk."""
        out = {}
        for what in RATIOS:
            pts = [(c["t_s"], c[what]) for c in self.checks if _finite(c.get(what))]
            if not pts:
                if what == "disk":
                    return None
                out[what] = 1.0
                continue
            ts, rs = zip(*pts, strict=True)
            out[what] = float(np.interp(t_s, ts, rs))
        return out


def gemv_ratio_at(in_features: list[int], cpu: float, widths: dict[int, float] | None) -> np.ndarray:
    """The GEMV drift ratio at each of `in_features`: `widths` ({in_features: ratio}) interpolated in
    log2 of the width, the nearest measured width's beyond them; `cpu` everywhere without widths."""
    if not widths:
        return np.full(len(in_features), cpu)
    ws = sorted(widths)
    return np.interp(np.log2(in_features), np.log2(ws), [widths[w] for w in ws])


def profile_at_drift(profile: Any, disk: float, cpu: float,
                     reads: dict[int, float] | None = None, widths: dict[int, float] | None = None) -> Any:
    """The profile with what the drift check measured applied: the read table's throughputs / disk
    and its batch overhead and segment cost x disk (the check times the first two together); the
    GEMV FLOP rates / cpu, gemv_row_s x cpu and the kernel tables' GEMV seconds x cpu (the check's
    cold GEMV).
    `reads` ({chunk bytes: ratio}, the read-size checks): each table row's throughputs / its
    chunk's ratio interpolated in log2 of the chunk size (clamped at the measured sizes) instead
    of / disk. `widths` ({in_features: ratio}, the width checks and the cpu check): each dense-table
    row's seconds x the ratio at its in_features, the sparse-FFN tables' gate / up GEMVs at their
    d_model and down GEMVs at their neurons (interpolated in log2 of the width, clamped), instead of
    x cpu. Nothing else changes."""
    data = profile.model_dump(mode="json", exclude_none=True)
    flash, compute = data["flash"], data["compute"]
    if "read_table" in flash:
        table = flash["read_table"]
        if reads:
            sizes = sorted(reads)
            row_r = np.interp(np.log2(table["chunk_bytes"]), np.log2(sizes), [reads[c] for c in sizes])
        else:
            row_r = np.full(len(table["chunk_bytes"]), disk)
        table["bytes_per_s"] = [[v / float(r) for v in row] for row, r in zip(table["bytes_per_s"], row_r, strict=True)]
    else:   # the closed-form model, and the achievable table measured beside it (the same SSD)
        flash["sequential_read_bytes_per_s"] /= disk
        flash["iops_max"] /= disk
        flash["read_latency_s"] *= disk
        if "read_table_achievable" in flash:
            ach = flash["read_table_achievable"]
            ach["bytes_per_s"] = [[v / disk for v in row] for row in ach["bytes_per_s"]]
    if "batch_overhead_s" in flash:
        flash["batch_overhead_s"] = [v * disk for v in flash["batch_overhead_s"]]
    if "segment_s" in flash:   # device time too
        flash["segment_s"] *= disk
    compute["gemv_flops_per_s"] = {k: v / cpu for k, v in compute["gemv_flops_per_s"].items()}
    compute["gemv_row_s"] = compute.get("gemv_row_s", 0.0) * cpu
    # the measured GEMVs of the kernel tables are GEMVs too (the copies in the sparse table are not)
    for t in compute.get("dense_gemv", {}).get("tables", {}).values():
        by_k = gemv_ratio_at(t["in_features"], cpu, widths)
        t["gemv_s"] = [[v * float(r) for v in row] for row, r in zip(t["gemv_s"], by_k, strict=True)]
    for t in compute.get("sparse_ffn", {}).get("tables", {}).values():
        by_d, by_n = gemv_ratio_at(t["d_model"], cpu, widths), gemv_ratio_at(t["neurons"], cpu, widths)
        t["input_gemv_s"] = [[v * float(r) for v in row] for row, r in zip(t["input_gemv_s"], by_d, strict=True)]
        t["down_gemv_s"] = [[v * float(r) for v, r in zip(row, by_n, strict=True)] for row in t["down_gemv_s"]]
    return type(profile).model_validate(data)
