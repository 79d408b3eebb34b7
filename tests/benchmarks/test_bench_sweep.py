"""Speed of sweeps (issue 6): a 1,000-point sweep of 256-token 7B-shape traces in under 2 minutes on
2 cores. Prints points/s for the process pool and, side by side, for the same points run serially
in one process (the pool's speed-up); asserts no wall-clock time.

Run with `make bench` (or `.venv/bin/python -m pytest -s tests/benchmarks/test_bench_sweep.py -m ""`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from pathlib import Path

import pytest

from analysis.sweep import default_workers, run_sweep
from analysis.tables import load_results

# 2 traces x 4 devices x 5 budgets x 25 configurations = 1,000 points
DEVICES = ["jetson-agx-orin-32gb", "jetson-agx-orin-64gb", "apple-m1-max", "rtx4090-nvme"]
BUDGETS = ["6GiB", "8GiB", "10GiB", "12GiB", "16GiB"]
PRESETS = """  - naive
  - hybrid
  - mmap
  - dense
  - quantized
  - {name: llm-in-a-flash, set: {window.k: [1, 2, 3, 4, 5, 6, 8, 10, 12, 16]}}
  - {name: neuroprefetcher, set: {window.k: [2, 4, 8, 16, inf]}}
  - {name: selectinfer, set: {selective.load_ratio: [0.5, 0.6, 0.7, 0.8, 0.9]}}
"""


def _simulator_missing() -> str | None:
    if importlib.util.find_spec("sim.engine") is None:
        return "the simulator (sim.engine) is not in this checkout yet"
    return None


@pytest.mark.slow  # ~10 minutes on 2 shared cores: `make bench` (-m "") runs it, the default run does not
@pytest.mark.skipif(_simulator_missing() is not None, reason=str(_simulator_missing()))
def test_bench_sweep_1000_points_of_7b_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sim.engine as engine
    from analysis.sweep_point import run_config
    from analysis.sweep_spec import expand, load_spec
    from devices import load_model, load_profile
    from devices.errors import FlashsimError
    from traces.format import open_trace
    from traces.synthetic import synthesize

    spec7b = load_model("llama-2-7b")
    traces = [synthesize(tmp_path / f"t{s}", spec7b, 256, seed=s, active_fraction=0.1, overlap=0.6,
                         hot_skew=0.4) for s in (0, 1)]
    sweep = tmp_path / "bench.yaml"
    sweep.write_text(f"traces: [{', '.join(map(str, traces))}]\ndevices: [{', '.join(DEVICES)}]\n"
                     f"dram_budgets: [{', '.join(BUDGETS)}]\npresets:\n{PRESETS}")
    workers = min(2, default_workers())
    t0 = time.perf_counter()
    o = run_sweep(sweep, tmp_path / "pool", workers=workers, progress=False)
    pool_s = time.perf_counter() - t0
    assert o.n_points == 1000 and o.n_run == 1000
    assert len(load_results(tmp_path / "pool").table) == 1000

    # Side by side, one process: 50 of those points as a serial sweep and as a bare loop of
    # simulate() calls (no sweep machinery): their ratio is what the sweep itself costs.
    small = tmp_path / "small.yaml"
    small.write_text(f"traces: [{traces[0]}]\ndevices: [{DEVICES[0]}]\ndram_budgets: [{BUDGETS[0]}, {BUDGETS[-1]}]\n"
                     f"presets:\n{PRESETS}")
    monkeypatch.setattr(engine, "DEFAULT_CACHE", engine.SetAlgebraCache())  # both start cold
    t0 = time.perf_counter()
    s = run_sweep(small, tmp_path / "serial", workers=1, progress=False)
    serial_s = time.perf_counter() - t0
    points = expand(load_spec(small))
    monkeypatch.setattr(engine, "DEFAULT_CACHE", engine.SetAlgebraCache())
    t0 = time.perf_counter()
    trace = open_trace(points[0].trace)
    for p in points:
        with contextlib.suppress(FlashsimError):  # a point that does not fit: the sweep records it
            engine.simulate(trace, None, load_profile(p.device), run_config(p))
    bare_s = time.perf_counter() - t0
    pool_rate, serial_rate = o.n_run / pool_s, s.n_run / serial_s
    print(f"\nsweep: {o.n_run} points of 256-token Llama-2-7B-shape traces with {workers} workers in "
          f"{pool_s:.1f} s = {pool_rate:.2f} points/s (target: 1,000 points in < 120 s, i.e. > 8.3 points/s; "
          f"{o.n_errors} points did not fit their budget and were recorded as such)")
    print(f"serial sweep of {s.n_run} of them: {serial_s:.1f} s = {serial_rate:.2f} points/s; "
          f"pool / serial = {pool_rate / serial_rate:.2f}x")
    print(f"bare simulate() loop over the same {len(points)} points: {bare_s:.1f} s; "
          f"serial sweep / bare loop = {serial_s / bare_s:.3f}x (the sweep machinery's own cost)")
