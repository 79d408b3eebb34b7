"""Running sweeps: results and manifest, resume, determinism across engines and worker counts,
failed points, incompatible directories, and kill -9 in the middle of a sweep."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from analysis import sweep_store as store
from analysis.sweep import POINT_COLUMNS, run_sweep
from analysis.sweep_spec import expand, load_spec
from analysis.tables import load_results
from devices.errors import FlashsimError
from tests.analysis.sweep_helpers import fake_point

H = "tests.analysis.sweep_helpers:"
BASE = "devices: [apple-m1-max, jetson-orin-nano-8gb]\n"
REPO = Path(__file__).resolve().parents[2]


def _grid(write_spec, n_k: int = 4, name: str = "s.yaml"):
    ks = ", ".join(str(k) for k in range(1, n_k + 1))
    return write_spec(BASE + f"dram_budgets: [null, 2GiB]\npresets: [naive, {{name: w, set: {{k: [{ks}]}}}}]\n",
                      name)


def _metrics(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["point_id", "point_index", "status", "ms_per_token", "flash_bytes_per_token", "label_text"]
    return df[cols].reset_index(drop=True)


def test_sweep_writes_one_row_per_point_with_manifest(write_spec, tmp_path: Path) -> None:
    spec = _grid(write_spec)
    out = tmp_path / "out"
    o = run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    points = expand(load_spec(spec))
    assert (o.n_points, o.n_skipped, o.n_run, o.n_errors) == (len(points), 0, 20, 0) == (20, 0, 20, 0)
    rs = load_results(out)
    t = rs.table
    assert list(t["point_id"]) == [p.point_id for p in points]
    assert set(POINT_COLUMNS) <= set(t.columns)
    for p, (_, row) in zip(points, t.iterrows()):
        assert row["ms_per_token"] == fake_point(p)["ms_per_token"]
        assert row["device"] == p.device and row["preset"] == p.preset
    assert list(t["param.k"].dropna()) == [1, 2, 3, 4] * 4 and t["param.k"].dtype.kind == "f"
    assert t["label"].iloc[1] == "w[k=1]"
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == "flashsim-sweep" and m["n_points"] == 20 and m["seed"] == 0
    assert m["flashsim_version"] == store.flashsim_version()
    assert m["spec_sha256"] == load_spec(spec).spec_sha256 and m["spec"]["presets"][0] == "naive"
    sha = store.file_sha256(Path(points[0].trace) / "manifest.json")
    assert list(m["inputs"]["traces"].values()) == [sha]
    assert set(m["inputs"]["devices"]) == {"apple-m1-max", "jetson-orin-nano-8gb"}
    assert "commit" in m["git"]
    # A rerun finds everything done and writes nothing.
    parts = store.part_files(out)
    again = run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    assert (again.n_skipped, again.n_run) == (20, 0) and store.part_files(out) == parts


def test_pool_dask_and_serial_runs_give_identical_tables(write_spec, tmp_path: Path) -> None:
    spec = _grid(write_spec)
    serial = run_sweep(spec, tmp_path / "serial", workers=1, evaluator=H + "fake_point", progress=False)
    pool = run_sweep(spec, tmp_path / "pool", workers=2, evaluator=H + "fake_point", progress=False)
    assert serial.n_run == pool.n_run == 20
    a = load_results(tmp_path / "serial").table
    b = load_results(tmp_path / "pool").table
    pd.testing.assert_frame_equal(a, b)
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        d = run_sweep(spec, tmp_path / "dask", engine="dask", scheduler=cluster.scheduler_address,
                      evaluator=H + "fake_point", progress=False)
    assert d.n_run == 20 and d.engine == "dask"
    pd.testing.assert_frame_equal(a, load_results(tmp_path / "dask").table)


def test_failed_points_are_recorded_and_bugs_stop_the_sweep(write_spec, tmp_path: Path) -> None:
    spec = _grid(write_spec)
    o = run_sweep(spec, tmp_path / "f", workers=1, evaluator=H + "failing_point", progress=False)
    t = load_results(tmp_path / "f").table
    bad = t[t["status"] == "error"]
    assert o.n_errors == len(bad) == 4 and set(bad["param.k"]) == {3}
    assert bad["error"].iloc[0] == "budget too small for k=3 on apple-m1-max"
    assert bad["ms_per_token"].isna().all()
    with pytest.raises(ZeroDivisionError):
        run_sweep(spec, tmp_path / "b", workers=1, evaluator=H + "buggy_point", progress=False)
    # The points finished before the bug are kept (flushed on the way out).
    assert load_results(tmp_path / "b").table["point_index"].tolist() == [0, 1]


def test_incompatible_or_foreign_directories_are_refused(write_spec, tmp_path: Path) -> None:
    spec = _grid(write_spec)
    out = tmp_path / "out"
    run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    bigger = _grid(write_spec, n_k=5, name="bigger.yaml")
    with pytest.raises(FlashsimError, match="incompatible sweep \\(spec_sha256 differs"):
        run_sweep(bigger, out, workers=1, evaluator=H + "fake_point", progress=False)
    with pytest.raises(FlashsimError, match="evaluator differs"):
        run_sweep(spec, out, workers=1, evaluator=H + "slow_point", progress=False)
    m = json.loads((out / "manifest.json").read_text())
    m["flashsim_version"] = "0.0.1"
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FlashsimError, match="flashsim_version differs: \"0.0.1\" there"):
        run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("x")
    with pytest.raises(FlashsimError, match="not empty and not a sweep directory"):
        run_sweep(spec, foreign, workers=1, evaluator=H + "fake_point", progress=False)


def test_a_second_sweep_on_the_same_directory_is_refused(write_spec, tmp_path: Path) -> None:
    spec = _grid(write_spec)
    out = tmp_path / "out"
    with store.locked(out), pytest.raises(FlashsimError, match="another sweep is writing"):
        run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)


def test_empty_results_and_stale_temporaries(write_spec, tmp_path: Path) -> None:
    spec = _grid(write_spec)
    out = tmp_path / "out"
    run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    for f in store.part_files(out):
        f.unlink()
    with pytest.raises(FlashsimError, match="no results yet \\(0 of 20 points finished\\)"):
        load_results(out)
    (out / "results" / ".part-deadbeef.parquet.tmp").write_bytes(b"PAR1 half a file")
    o = run_sweep(spec, out, workers=1, evaluator=H + "fake_point", progress=False)
    assert o.n_run == 20 and not list((out / "results").glob(".part-*"))


def _session_processes(sid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # fields[3]: session id
                pids.append(int(d.name))
    return pids


def test_issue6_kill_9_mid_sweep_then_rerun_loses_and_duplicates_nothing(
        write_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _grid(write_spec, n_k=14)  # 2 devices x 2 budgets x 15 = 60 points
    ids = [p.point_id for p in expand(load_spec(spec))]
    reference = load_results(run_sweep(spec, tmp_path / "ref", workers=1, evaluator=H + "fake_point",
                                       progress=False).out_dir).table
    out = tmp_path / "killed"
    code = ("from analysis.sweep import run_sweep; "
            f"run_sweep({str(spec)!r}, {str(out)!r}, workers=2, evaluator={H + 'slow_point'!r}, progress=False)")
    env = {**os.environ, "FLASHSIM_TEST_POINT_S": "0.1", "PYTHONPATH": str(REPO)}
    finished = 0
    for _ in range(2):  # kill twice, at different stages
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, start_new_session=True,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while len(store.finished_point_ids(out) if (out / "results").is_dir() else ()) < finished + 4:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the sweep made no progress"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # the sweep process only: its workers must follow it
        proc.wait()
        proc.stderr.close()
        finished = len(store.finished_point_ids(out))
        assert 4 <= finished < len(ids), "the kill did not land mid-sweep"
        deadline = time.monotonic() + 20
        while _session_processes(proc.pid):
            assert time.monotonic() < deadline, f"orphaned workers: {_session_processes(proc.pid)}"
            time.sleep(0.05)
    monkeypatch.setenv("FLASHSIM_TEST_POINT_S", "0")
    o = run_sweep(spec, out, workers=1, evaluator=H + "slow_point", progress=False)
    assert o.n_skipped == finished and o.n_skipped + o.n_run == len(ids)
    t = load_results(out).table
    assert sorted(t["point_id"]) == sorted(ids) and t["point_id"].is_unique
    pd.testing.assert_frame_equal(_metrics(t), _metrics(reference))


@pytest.mark.slow  # worker processes take seconds to start; the engine itself is tested above
def test_dask_engine_starts_its_own_local_cluster(write_spec, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    spec = _grid(write_spec)
    serial = load_results(run_sweep(spec, tmp_path / "serial", workers=1, evaluator=H + "fake_point",
                                    progress=False).out_dir).table
    o = run_sweep(spec, tmp_path / "dask", workers=2, engine="dask", evaluator=H + "fake_point", progress=False)
    assert (o.engine, o.workers, o.n_run) == ("dask", 2, 20)
    pd.testing.assert_frame_equal(serial, load_results(tmp_path / "dask").table)


def test_engine_flags_are_checked(write_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("analysis.sweep.DASK_CONNECT_S", 1.0)
    spec = _grid(write_spec)
    with pytest.raises(FlashsimError, match="--scheduler needs --engine dask"):
        run_sweep(spec, tmp_path / "o", scheduler="tcp://x:1", evaluator=H + "fake_point")
    with pytest.raises(FlashsimError, match="--workers must be >= 1"):
        run_sweep(spec, tmp_path / "o", workers=0, evaluator=H + "fake_point")
    with pytest.raises(FlashsimError, match="cannot import it"):
        run_sweep(spec, tmp_path / "o", evaluator="tests.analysis.sweep_helpers:nothing")
    with pytest.raises(FlashsimError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        run_sweep(spec, tmp_path / "o", engine="dask", scheduler="tcp://127.0.0.1:9", evaluator=H + "fake_point")


def test_missing_values_read_the_same_from_any_part_file(tmp_path: Path) -> None:
    """A column that is all-null in one part file and text in another loads as None, not NaN."""
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "flashsim-sweep", "n_points": 3}))
    w = store.ResultWriter(tmp_path)
    base = {"preset": "p", "status": "ok", "dram_budget_bytes": None}
    w.add({**base, "point_id": "a", "point_index": 0, "error": None})
    w.flush()
    w.add({**base, "point_id": "b", "point_index": 1, "error": "no", "dram_budget_bytes": 2**30})
    w.add({**base, "point_id": "c", "point_index": 2, "error": None})
    w.flush()
    t = load_results(tmp_path).table
    assert t["error"].tolist() == [None, "no", None]
    assert t["dram_budget_bytes"].isna().tolist() == [True, False, True] and t["dram_budget_bytes"].dtype == float
