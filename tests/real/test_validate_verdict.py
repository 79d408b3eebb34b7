"""`flashsim calibrate` ends with a verdict a device owner can act on (issue 55 item 4): the verdict
line and next step, warnings kept for the summary, the profile recording mode / verdict / date, replay
and plan printing them beside the device inputs, third-party progress bars silenced. Unit tests of the
pieces: no real calibrate run here (tests/real/test_calibrate.py runs one)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from devices import load_profile
from devices.achievable import inputs
from devices.schema import BUNDLED_DIR
from flashsim.commands.calibrate import WarningTee, quiet_third_party
from flashsim.commands.replay import inputs_line
from real.validation.profile_writer import record_calibration, write_profile
from real.validation.verdict import calibration_verdict, verdict_line


def _floor(ok: bool) -> dict:
    m = {"sim_error_p50": 0.04 if ok else 0.15, "sim_error_p90": 0.08 if ok else 0.22, "limit_p50": 0.05,
         "limit_p90": 0.10, "pass": ok}
    io_ = {**m, "sim_error_p50": 0.03, "sim_error_p90": 0.06, "pass": True}
    return {"n_configs": 80, "pass": ok, "metrics": {"latency_s": m, "io_s": io_}}


def test_pass_quick_says_use_it_and_to_run_full() -> None:
    v = calibration_verdict({"floor": _floor(True)}, quick=True, profile_path="my.yaml")
    assert v["verdict"] == "PASS" and v["mode"] == "quick"
    assert "--device my.yaml" in v["next_step"] and "without --quick" in v["next_step"]
    line = verdict_line(v)
    assert line.startswith("verdict: PASS (quick calibration): ") and "\n" not in line


def test_fail_names_the_failing_metric_against_its_limit() -> None:
    v = calibration_verdict({"floor": _floor(False)}, quick=False, profile_path="p.yaml")
    assert v["verdict"] == "FAIL"
    assert v["detail"].startswith("total per token sim 15.0% / 22.0% vs limit 5.0% / 10.0%")
    assert "I/O" not in v["detail"]          # only the failing metrics
    assert "estimates" in v["next_step"]


def test_fail_on_a_busy_host_says_rerun_idle_and_keeps_the_warning() -> None:
    rep = {"floor": _floor(False), "load_warning": "WARNING: 1-minute load average was 12.7 on 2 core(s)"}
    v = calibration_verdict(rep, quick=True, profile_path="p.yaml")
    assert "idle host" in v["next_step"] and v["warnings"] == [rep["load_warning"]]


def test_nothing_scored_is_not_validated() -> None:
    assert calibration_verdict({"floor": {"metrics": {}}}, quick=True, profile_path="p")["verdict"] == "not validated"


def _measured_copy(tmp_path: Path) -> Path:
    p = tmp_path / "this-host.yaml"
    shutil.copy(BUNDLED_DIR / "this-host.yaml", p)
    return p


def test_profile_records_mode_verdict_date_and_replay_prints_them(tmp_path: Path) -> None:
    """Before: the profile said `source: measured` and replay printed 'device inputs: measured: ...'."""
    path = _measured_copy(tmp_path)
    record_calibration(path, "quick", "FAIL", detail="total per token sim 15.0% / 22.0% vs limit 5.0% / 10.0%",
                       next_step="rerun without --quick", date="2026-12-05")
    p = load_profile(path)
    cal = p.source.calibration
    assert (cal.mode, cal.verdict, cal.date) == ("quick", "FAIL", "2026-12-05")
    line = inputs_line(inputs(p, "achievable"))
    assert line.startswith("device inputs: measured: ")
    assert line.endswith("; quick calibration on 2026-12-05, verdict FAIL") and "\n" not in line
    row = next(r for r in inputs(p) if r["input"] == "calibration")
    assert "rerun without --quick" in row["source"]


def test_measured_profile_without_a_record_says_so() -> None:
    line = inputs_line(inputs(load_profile("this-host")))
    assert line.endswith("; no verdict recorded")


def test_a_bench_rewriting_a_section_drops_the_old_verdict(tmp_path: Path) -> None:
    path = _measured_copy(tmp_path)
    record_calibration(path, "full", "PASS", date="2026-12-05")
    flash = load_profile(path).model_dump(mode="json", exclude_none=True)["flash"]
    written = write_profile(path, "this-host", flash=flash, command="flashsim bench flash (test)")
    assert written.source.calibration is None


def test_a_bad_verdict_is_refused(tmp_path: Path) -> None:
    from devices.errors import FlashsimError

    with pytest.raises(FlashsimError, match="source.calibration.verdict"):
        record_calibration(_measured_copy(tmp_path), "quick", "OK")


def test_warning_tee_passes_through_and_keeps_warnings() -> None:
    sink = io.StringIO()
    tee = WarningTee(sink)
    tee.write("[1/4] bench flash\nWARNING: the host is not as ")
    tee.write("profiled (disk 2.1x)\n/x.py:3: UserWarning: threads differ\nplain\n")
    assert sink.getvalue().count("\n") == 4
    assert tee.lines == ["WARNING: the host is not as profiled (disk 2.1x)", "/x.py:3: UserWarning: threads differ"]


def test_third_party_progress_bars_are_silenced(monkeypatch, capsys) -> None:
    """Before: the GGUF reader's tqdm bar drew ~30 redraws into calibrate's log."""
    import os

    from tqdm import std
    from tqdm.auto import tqdm

    for k in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE", "TRANSFORMERS_VERBOSITY"):
        monkeypatch.delenv(k, raising=False)
    init = std.tqdm.__dict__["__init__"]
    with quiet_third_party():
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and os.environ["TQDM_DISABLE"] == "1"
        for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
            pass
    assert "Converting" not in capsys.readouterr().err
    assert std.tqdm.__dict__["__init__"] is init and "TQDM_DISABLE" not in os.environ     # restored afterwards


def test_replay_header_names_the_units_and_the_calibration(tmp_path: Path, capsys) -> None:
    """replay on a calibrated profile: the header says which size/rate convention it prints, and the
    device-inputs line says how the profile was calibrated and what validation found."""
    from devices.units import UNITS_NOTE
    from flashsim.main import main

    path = _measured_copy(tmp_path)
    record_calibration(path, "quick", "FAIL", detail="total per token sim 15.0% / 22.0% vs limit 5.0% / 10.0%",
                       date="2026-12-05")
    trace = Path(__file__).resolve().parents[2] / "traces" / "data" / "smollm2-135m-builtin"
    assert main(["replay", "--trace", str(trace), "--device", str(path), "--preset", "naive", "--tokens", "2",
                 "--engine", "fast"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == UNITS_NOTE
    inputs = next(line for line in out if line.startswith("device inputs: "))
    assert inputs.endswith("; quick calibration on 2026-12-05, verdict FAIL")
