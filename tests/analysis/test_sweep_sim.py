"""Sweeps that run the real simulator: the seam (analysis.sweep_point) passes each point's preset,
overrides, budget and seed, so every row equals a direct `simulate` call with the same inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis.sweep_point import flatten_summary
from analysis.tables import load_results
from devices import load_profile
from flashsim.main import main
from traces.format import open_trace

engine = pytest.importorskip("sim.engine", reason="the simulator is not in this checkout yet")
presets = pytest.importorskip("sim.policies.presets")

SPEC = """devices: [apple-m1-max, jetson-orin-nano-8gb]
dram_budgets: [null, 1GiB]
seed: 3
presets: [naive, mmap, {name: llm-in-a-flash, set: {window.k: [1, 4]}}]
"""


def _direct(row) -> dict:
    settings = [f"{k}={v}" for k, v in json.loads(row["overrides_json"]).items()]
    if not (isinstance(row["dram_budget_bytes"], float) and math.isnan(row["dram_budget_bytes"])) \
            and row["dram_budget_bytes"] is not None:
        settings.append(f"memory.dram_budget_bytes={int(row['dram_budget_bytes'])}")
    cfg = presets.preset_config(row["preset"]).with_overrides([*settings, "sim.seed=3"])
    return engine.simulate(open_trace(row["trace"]), None, load_profile(row["device"]), cfg).summary()


def test_sweep_cli_rows_equal_direct_simulator_runs(write_spec, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    spec = write_spec(SPEC)
    out = tmp_path / "out"
    # in-process (one worker): pool and serial runs give identical tables (tests/analysis/test_sweep.py)
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["n_points"], summary["n_run"]) == (16, 16)
    t = load_results(out).table
    assert len(t) == 16 and t["point_id"].is_unique
    for _, row in t.iterrows():
        if row["status"] != "ok":
            continue
        direct = flatten_summary(_direct(row))
        for key in ("ms_per_token", "io_ms_per_token", "flash_bytes_per_token", "dram_peak_bytes",
                    "activation_mass_kept", "config_json"):
            assert row[key] == direct[key], (row["label"], key)
    assert json.loads(t["config_json"].iloc[0])["sim"]["seed"] == 3
    # Rerun: nothing left to do.
    assert main(["sweep", str(spec), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["n_skipped"] == 16
    # A changed spec into the same directory: one line, exit 2.
    bigger = write_spec(SPEC.replace("[null, 1GiB]", "[null, 1GiB, 2GiB]"), "bigger.yaml")
    assert main(["sweep", str(bigger), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds results of an incompatible sweep (spec_sha256 differs" in err and err.count("\n") == 1
    # And the report of it draws the breakdown from these rows.
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "figures" / "breakdown.png").is_file()  # 2 devices x 2 budgets: 4 panels


def test_settings_the_sweep_file_owns_are_refused(write_spec, tmp_path: Path, capsys) -> None:
    for body, expect in [
        ("devices: [apple-m1-max]\npresets: [naive]\nset: {seed: 4}\n", "set: seed: give DRAM budgets"),
        ("devices: [apple-m1-max]\npresets: [naive]\nset: {memory.dram_budget_bytes: 4GiB}\n",
         "set: memory.dram_budget_bytes"),
        ("devices: [apple-m1-max]\npresets: [nope]\n", "unknown preset 'nope'"),
        ("devices: [apple-m1-max]\npresets: [{name: llm-in-a-flash, set: {window.k: [-1]}}]\n", "window.k"),
        ("devices: [apple-m1-max]\npresets: [{name: naive, set: {window.k: [2]}}]\n", "window.k"),
    ]:
        assert main(["sweep", str(write_spec(body)), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert expect in err and err.count("\n") == 1, err
        assert not (tmp_path / "o").exists()


def test_flatten_summary() -> None:
    flat = flatten_summary({"ms_per_token": 2.0, "device": "x", "notes": ["a"], "prefill": {"ms": 1.0},
                            "config": {"b": 1, "a": [1, 2]}, "empty": None})
    assert flat == {"ms_per_token": 2.0, "notes": '["a"]', "prefill.ms": 1.0,
                    "config_json": '{"a":[1,2],"b":1}', "empty": None}


@pytest.mark.slow
def test_issue6_kill_9_of_the_cli_with_the_simulator(tmp_path: Path) -> None:
    """The real command on the shipped trace, killed with SIGKILL mid-sweep, then rerun: one row per
    point, equal to an uninterrupted sweep."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from analysis import sweep_store as store
    from analysis.sweep import run_sweep

    repo = Path(__file__).resolve().parents[2]
    spec = repo / "examples" / "sweeps" / "smollm2-window-budget.yaml"
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "flashsim", "sweep", str(spec), "--out", str(out),
                             "--workers", "2", "--no-progress"], cwd=repo, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "results").is_dir() or len(store.finished_point_ids(out)) < 8:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(store.finished_point_ids(out))
    assert 8 <= done < 88
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 0
    ref = run_sweep(spec, tmp_path / "ref", workers=1, progress=False)
    a, b = load_results(out).table, load_results(ref.out_dir).table
    assert len(a) == 88 and a["point_id"].is_unique
    cols = ["point_id", "status", "error", "ms_per_token", "flash_bytes_per_token", "config_json"]
    import pandas as pd

    pd.testing.assert_frame_equal(a[cols], b[cols])
