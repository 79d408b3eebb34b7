"""`flashsim calibrate`: bench flash -> bench compute -> profile -> validate --quick in one verb (the
real benchmarks on a small file; the validation grid shrunk to a tiny shape), and bad input."""

from __future__ import annotations

import json

import pytest

from devices.schema import load_profile
from flashsim.main import main
from real.validation import validate_grid as G

pytest.importorskip("torch")


@pytest.mark.slow   # the benches and a validation for real, in one verb (each is tested on its own in the default run)
def test_calibrate_end_to_end_quick(monkeypatch, tmp_path, capsys):
    from tests.real.test_validate import tiny_grids

    tiny_grids(monkeypatch, tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--path", str(disk), "--out", str(out), "--name", "calib-test", "--quick",
                 "--size", "4MiB", "--modes", "shape", "--json", "--workdir", str(tmp_path), "--device", "cpu"]) == 0
    rep = json.loads(capsys.readouterr().out)
    prof = load_profile(out)
    assert prof.name == "calib-test" and prof.source.kind == "measured"
    assert str(prof.flash.source).startswith("measured by flashsim bench")
    assert str(prof.compute.source).startswith("measured by flashsim bench")
    # the profile holds what the benches measured
    assert prof.flash.sequential_read_bytes_per_s == pytest.approx(rep["flash"]["sequential_bytes_per_s"], rel=1e-2)
    assert prof.compute.flops_per_s("fp32") == pytest.approx(rep["compute"]["fp32_gemv_flops_per_s"], rel=1e-2)
    assert rep["compute"]["threads"] == 1
    # and validate ran against it
    v = rep["validate"]
    assert v["profile"] == "calib-test" and v["n_configs"] == 2 and v["modes"] == ["shape"]
    # bytes agree exactly in every pass; the mean over validate's 3 passes may differ in its last bit
    assert v["per_metric"]["bytes_read"]["max"] == pytest.approx(0.0, abs=1e-12)
    assert list(disk.iterdir()) == []          # the bench file is removed
    # the CPU cost of one read request, and what was measured vs carried over
    assert prof.flash.request_cpu_s is not None and prof.flash.request_cpu_s > 0
    assert rep["flash"]["request_cpu_s"] == prof.flash.request_cpu_s
    assert rep["profile"]["measured"] == ["flash", "compute", "memory.capacity_bytes", "memory.bandwidth_bytes_per_s"]
    assert rep["profile"]["carried_over"] == ["memory.reserved_bytes", "memory.unified", "description"]
    assert prof.source.notes.startswith("measured here by flashsim bench: flash, compute, memory.capacity_bytes")
    assert prof.source.host and prof.source.tool and prof.source.date
    assert rep["cuda_profile"] is None
    # the verdict (validate's pass rule) and the next step, recorded in the profile with mode and date
    assert rep["verdict"]["verdict"] in ("PASS", "FAIL") and rep["verdict"]["next_step"]
    cal = prof.source.calibration
    assert (cal.mode, cal.verdict, cal.date) == ("quick", rep["verdict"]["verdict"], prof.source.date)


def test_calibrate_bad_input_exits_2(tmp_path, capsys):
    assert main(["calibrate", "--path", str(tmp_path / "nowhere"), "--out", str(tmp_path / "p.yaml")]) == 2
    assert main(["calibrate", "--path", str(tmp_path), "--threads", "0", "--out", str(tmp_path / "p.yaml")]) == 2
    assert main(["calibrate", "--path", str(tmp_path), "--modes", "both", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "does not exist" in err and "--threads 0" in err and "--modes" in err
    assert not (tmp_path / "p.yaml").exists()


def test_calibrate_is_registered():
    from flashsim.main import COMMAND_MODULES

    assert "flashsim.commands.calibrate" in COMMAND_MODULES
    assert G.parse_modes("model") == ("model",)


def test_calibrate_refuses_a_bad_path_before_any_work(tmp_path, capsys, monkeypatch):
    """Missing, not a directory, not writable, no room for the test file: one line, exit 2, and
    nothing measured or written."""
    import errno
    import tempfile

    import real.validation.calibration

    monkeypatch.setattr(real.validation.calibration, "calibrate", lambda *a, **k: pytest.fail("measured despite a bad --path"))
    out = tmp_path / "p.yaml"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    disk = tmp_path / "disk"
    disk.mkdir()
    base = ["calibrate", "--out", str(out), "--quick", "--device", "cpu"]
    assert main([*base, "--path", str(tmp_path / "nowhere")]) == 2
    assert main([*base, "--path", str(a_file)]) == 2
    assert main([*base, "--path", str(disk), "--size", "1000TiB"]) == 2      # more than any disk here holds
    real_mkstemp = tempfile.mkstemp

    def read_only(*a, dir=None, **k):   # a read-only mount: EROFS on create (root ignores mode bits)
        if str(dir) == str(disk):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkstemp(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    assert main([*base, "--path", str(disk)]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 4 and "Traceback" not in "".join(lines)
    assert "does not exist" in lines[0] and "not a directory" in lines[1]
    assert "free, calibration needs" in lines[2] and "smaller --size" in lines[2]
    assert "cannot write in" in lines[3] and "Read-only file system" in lines[3]
    assert list(disk.iterdir()) == [] and not out.exists()


def test_calibrate_refuses_an_unwritable_out_before_any_work(tmp_path, capsys, monkeypatch):
    import errno
    import tempfile

    import real.validation.calibration

    monkeypatch.setattr(real.validation.calibration, "calibrate", lambda *a, **k: pytest.fail("measured despite a bad --out"))
    ro = tmp_path / "ro"
    ro.mkdir()
    real_mkstemp = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, dir=None, **k: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system")) if str(dir) == str(ro) else real_mkstemp(*a, dir=dir, **k))
    assert main(["calibrate", "--path", str(tmp_path), "--out", str(ro / "sub" / "p.yaml"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write in" in err and "Traceback" not in err


def test_profile_notes_say_what_was_measured_and_where_the_rest_came_from(tmp_path):
    """Two writes (bench flash, then bench compute) into a new file: the notes keep naming the
    bundled base the carried-over fields came from, and list the measured sections."""
    from real.validation.profile_writer import MEASURED_PREFIX, measured_fields, write_profile

    base = load_profile("jetson-orin-nano-8gb").model_dump(mode="json", exclude_none=True)
    here = load_profile("this-host").model_dump(mode="json", exclude_none=True)
    out = tmp_path / "orin.yaml"
    flash = {**here["flash"], "source": f"{MEASURED_PREFIX} flash (test)"}
    p1 = write_profile(out, "jetson-orin-nano-8gb", flash=flash, command="flashsim bench flash (test)")
    assert p1.source.kind == "mixed"
    assert p1.source.notes == ("measured here by flashsim bench: flash; carried over from jetson-orin-nano-8gb (their "
                               "sources say where they come from): compute, memory.capacity_bytes, "
                               "memory.bandwidth_bytes_per_s, memory.reserved_bytes, memory.unified, description")
    assert p1.compute.model_dump(mode="json", exclude_none=True) == base["compute"]
    compute = {**here["compute"], "source": f"{MEASURED_PREFIX} compute (test)"}
    memory = {"capacity_bytes": 8 << 30, "bandwidth_bytes_per_s": 5e10, "source": f"{MEASURED_PREFIX} compute (test)"}
    p2 = write_profile(out, "jetson-orin-nano-8gb", compute=compute, memory=memory, command="flashsim bench compute (t)")
    assert p2.source.kind == "measured" and "carried over from jetson-orin-nano-8gb (" in p2.source.notes
    assert measured_fields(p2.model_dump(mode="json")) == (
        ["flash", "compute", "memory.capacity_bytes", "memory.bandwidth_bytes_per_s"],
        ["memory.reserved_bytes", "memory.unified", "description"])
    assert p2.memory.reserved_bytes == base["memory"]["reserved_bytes"] and p2.memory.unified == base["memory"]["unified"]
