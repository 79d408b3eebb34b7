"""The host's load around a timing run: load averages and the cores other work keeps busy
(/proc/stat), and the warning when the timing cannot be trusted (`flashsim validate`)."""

from __future__ import annotations

import os
import time
from typing import Any

BUSY_SAMPLE_S = 0.5      # host_load: how long /proc/stat is sampled for other work's busy cores
BUSY_WARN_CORES = 0.5    # ... and how many busy cores make the timing untrustworthy (a quarter of this 2-core host)


def host_load(sample_s: float = BUSY_SAMPLE_S) -> dict[str, Any]:
    """1-, 5- and 15-minute load averages, the usable cores, and `busy_cores`: the cores other work
    kept busy over `sample_s` seconds while this process slept (/proc/stat; None where the OS has no
    such file or sample_s is 0). None where the OS gives none."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"load_avg": load, "cores": cores, "busy_cores": busy_cores(sample_s) if sample_s > 0 else None}


def _cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, total, CPUs) jiffies summed over the CPUs this process may run on (/proc/stat's cpuN
    lines; all CPUs where the OS gives no affinity); None without /proc/stat. Busy is all but idle
    and iowait: a thread waiting for I/O holds no core."""
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    busy = total = n = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *vals = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if mine is not None and int(name[3:]) not in mine:
                    continue
                v = [int(x) for x in vals[:8]]   # user nice system idle iowait irq softirq steal (guest is in user)
                busy += sum(v) - v[3] - v[4]
                total += sum(v)
                n += 1
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total, n) if n else None


def busy_cores(sample_s: float) -> float | None:
    """Cores busy with other work: busy / all jiffies of this process's CPUs x their count, over
    sample_s seconds of this process sleeping; None without /proc/stat."""
    a = _cpu_jiffies()
    time.sleep(sample_s)
    b = _cpu_jiffies()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return round((b[0] - a[0]) / (b[1] - a[1]) * b[2], 2)


def load_warning(start: dict[str, Any], end: dict[str, Any]) -> str | None:
    """A warning when other work kept more than BUSY_WARN_CORES busy at the start (where /proc/stat
    says; else when the 1-minute load at start exceeded the core count). None otherwise.

    Only the start counts: during the run the grid's own reader threads raise the load by themselves,
    so the end value is recorded but measures validate as much as other work. And the measured busy
    cores come first: Linux counts a thread in uninterruptible I/O wait in the load average, so right
    after `bench flash` (32 reads in flight for minutes) an idle host reads a 1-minute load of 7-10
    on 2 cores for a minute or two, while /proc/stat finds no core busy."""
    cores = start["cores"]
    busy = start.get("busy_cores")
    if busy is not None:
        if busy <= BUSY_WARN_CORES:
            return None
        return (f"WARNING: other work kept {busy:.1f} of {cores} core(s) busy when validation started: the "
                "timing errors measure the load as much as the model; re-run on an idle host")
    first = start["load_avg"][0] if start["load_avg"] else None
    if first is None or not cores or first <= cores:
        return None
    return (f"WARNING: 1-minute load average was {first:.1f} on {cores} core(s) when validation started: other "
            "work shares the cores, so the timing errors measure the load as much as the model; re-run on an "
            "idle host")
