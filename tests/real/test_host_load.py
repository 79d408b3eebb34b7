"""The host's load around a timing run (real/bench/host_load.py), by hand."""

from __future__ import annotations

import os
from pathlib import Path

from real.bench import host_load as H


def test_load_warning_by_hand():
    idle = {"load_avg": [0.5, 0.4, 0.3], "cores": 2}
    busy = {"load_avg": [2.5, 1.0, 1.0], "cores": 2}
    assert H.load_warning(idle, idle) is None
    assert H.load_warning(idle, {"load_avg": [2.0, 0, 0], "cores": 2}) is None       # equal to the cores: fine
    assert H.load_warning(idle, busy) is None      # the end load includes validate's own reader threads
    w = H.load_warning(busy, idle)
    assert w.startswith("WARNING: 1-minute load average was 2.5 on 2 core(s) when validation started")
    assert H.load_warning({"load_avg": None, "cores": 2}, {"load_avg": None, "cores": 2}) is None
    # measured busy cores come first: right after bench flash the load average counts its I/O-blocked
    # reader threads while no core is busy
    assert H.load_warning({**busy, "load_avg": [9.0, 5.0, 3.0], "busy_cores": 0.1}, idle) is None
    w = H.load_warning({**idle, "busy_cores": 0.8}, idle)
    assert w.startswith("WARNING: other work kept 0.8 of 2 core(s) busy when validation started")
    h = H.host_load(0.05)
    assert h["cores"] >= 1 and len(h["load_avg"]) == 3
    if Path("/proc/stat").exists():
        assert 0.0 <= h["busy_cores"] <= (os.cpu_count() or 1)
    assert H.host_load(0)["busy_cores"] is None


def test_busy_cores_by_hand(monkeypatch):
    """busy / total jiffies between two /proc/stat reads, times the CPUs; None without the file."""
    reads = iter([(100, 1000, 2), (150, 1100, 2)])      # 50 of 100 jiffies busy on 2 CPUs
    monkeypatch.setattr(H, "_cpu_jiffies", lambda: next(reads))
    assert H.busy_cores(0.0) == 1.0
    monkeypatch.setattr(H, "_cpu_jiffies", lambda: None)
    assert H.busy_cores(0.0) is None
