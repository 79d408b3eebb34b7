"""How far the host is from its profile right now: a short disk and CPU check (ratios, no units).

A profile is a measurement of minutes ago. On a shared host the disk has slow spells and the CPU's
speed drifts (on this VM: reads 1.5x slower for a minute, GEMVs 10-30% over tens of minutes), and
`flashsim validate` compares runs against a simulation of the profile, so it reports this check at
its start and end next to the errors:

* **disk**: real.reader reads batches of 4 x in-flight random neurons of a small store
  (`real.bench_reader.bench_store`) for `duration_s`; the ratio is the reads' measured seconds over
  the profile's time for the same reads (read table + batch overhead), summed. 1.0 = as profiled,
  1.3 = the disk is 30% slower than the profile says.
* **cpu**: a cold fp32 GEMV of DRIFT_GEMV_SHAPE (64 MiB of weights, like bench compute's) timed
  against the profile's prediction (FLOPs at compute.gemv_flops_per_s.fp32 + rows x gemv_row_s).

`drift_warning` flags a ratio more than DRIFT_WARN off 1. `profile_at_drift` is the profile as the
check found the host (read table and batch overhead scaled by the disk ratio, GEMV rates by the CPU
ratio): validate replays every configuration with it too and reports those errors apart
(`drift_corrected`), so a reader can tell the model's error from the host's drift.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from real.bench_reader import bench_store, reader_batches, table_time_s

DRIFT_GEMV_SHAPE = (4096, 4096)
DRIFT_WARN = 0.15


def disk_ratio(profile: Any, folder: Path, seed: int, duration_s: float = 0.5) -> float:
    """Measured / profiled seconds of real.reader's batches on a small store written in `folder`."""
    flash = profile.flash
    q = int(flash.max_in_flight)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD41F7]))
    measured = predicted = 0.0
    with bench_store(folder, seed) as store:
        for _, st in reader_batches(store, q, (4 * q,), duration_s, rng):
            measured += st.seconds
            predicted += table_time_s(flash.curve, st.chunk_bytes, q)
            predicted += float(flash.batch_overhead_at(np.array([min(q, st.reads_issued)]))[0])
    return measured / predicted if predicted > 0 else float("nan")


def cpu_ratio(profile: Any, seed: int, repeats: int = 7) -> float | None:
    """Measured / profiled time of a cold fp32 GEMV (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    rows, cols = DRIFT_GEMV_SHAPE
    c = profile.compute
    predicted = 2.0 * rows * cols / c.flops_per_s("fp32") + rows * (c.gemv_row_s or 0.0)
    g = torch.Generator().manual_seed(seed)
    # two matrices, alternated, so each GEMV streams its 64 MiB from DRAM as in bench compute
    ws = [torch.randn(rows, cols, generator=g) for _ in range(2)]
    x = torch.randn(cols, generator=g)
    times = []
    with torch.no_grad():
        for i in range(repeats):
            t = time.perf_counter()
            torch.mv(ws[i % 2], x)
            times.append(time.perf_counter() - t)
    return float(np.median(times)) / predicted


def host_drift(profile: Any, folder: Path, seed: int) -> dict[str, Any]:
    """{"disk": ratio, "cpu": ratio or None, "t_s": perf_counter} (module docstring)."""
    return {"disk": disk_ratio(profile, folder, seed), "cpu": cpu_ratio(profile, seed), "t_s": time.perf_counter()}


def drift_warning(checks: dict[str, dict[str, Any]]) -> str | None:
    """One line naming every check whose disk or CPU ratio is more than DRIFT_WARN off 1; None if none."""
    bad = [f"{when} {what} {r:.2f}x" for when, c in checks.items() for what in ("disk", "cpu")
           if (r := c.get(what)) is not None and np.isfinite(r) and abs(r - 1.0) > DRIFT_WARN]
    if not bad:
        return None
    return ("WARNING: the host is not as profiled (measured / profiled time: " + ", ".join(bad) + "); "
            "the errors include that drift: re-run `flashsim bench flash` and `bench compute` right before validating")


def mean_ratios(checks: dict[str, dict[str, Any]]) -> tuple[float, float] | None:
    """(disk, cpu): the mean of the checks' finite ratios (cpu 1.0 without torch); None without a disk ratio."""
    disk = [c["disk"] for c in checks.values() if c.get("disk") is not None and np.isfinite(c["disk"])]
    cpu = [c["cpu"] for c in checks.values() if c.get("cpu") is not None and np.isfinite(c["cpu"])]
    if not disk:
        return None
    return float(np.mean(disk)), float(np.mean(cpu)) if cpu else 1.0


def profile_at_drift(profile: Any, disk: float, cpu: float) -> Any:
    """The profile with what the drift check measured applied: the read table's throughputs / disk
    and its batch overhead x disk (the check times both together); the GEMV FLOP rates / cpu and
    gemv_row_s x cpu (the check's cold GEMV). Nothing else changes."""
    data = profile.model_dump(mode="json", exclude_none=True)
    flash, compute = data["flash"], data["compute"]
    if "read_table" in flash:
        table = flash["read_table"]
        table["bytes_per_s"] = [[v / disk for v in row] for row in table["bytes_per_s"]]
    else:   # the closed-form model
        flash["sequential_read_bytes_per_s"] /= disk
        flash["iops_max"] /= disk
        flash["read_latency_s"] *= disk
    if "batch_overhead_s" in flash:
        flash["batch_overhead_s"] = [v * disk for v in flash["batch_overhead_s"]]
    compute["gemv_flops_per_s"] = {k: v / cpu for k, v in compute["gemv_flops_per_s"].items()}
    compute["gemv_row_s"] = compute.get("gemv_row_s", 0.0) * cpu
    return type(profile).model_validate(data)
