"""`flashsim calibrate`: bench flash -> bench compute -> profile -> validate --quick in one verb (the
real benchmarks on a small file; the validation grid shrunk to a tiny shape), and bad input."""

from __future__ import annotations

import json

import pytest

from devices.schema import load_profile
from real import validate as V
from sim.cli.main import main

pytest.importorskip("torch")


def test_calibrate_end_to_end_quick(monkeypatch, tmp_path, capsys):
    from tests.real.test_validate import tiny_grids

    tiny_grids(monkeypatch, tmp_path)
    disk = tmp_path / "disk"
    disk.mkdir()
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--path", str(disk), "--out", str(out), "--name", "calib-test", "--quick",
                 "--size", "4MiB", "--modes", "shape", "--json", "--workdir", str(tmp_path)]) == 0
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


def test_calibrate_bad_input_exits_2(tmp_path, capsys):
    assert main(["calibrate", "--path", str(tmp_path / "nowhere"), "--out", str(tmp_path / "p.yaml")]) == 2
    assert main(["calibrate", "--path", str(tmp_path), "--threads", "0", "--out", str(tmp_path / "p.yaml")]) == 2
    assert main(["calibrate", "--path", str(tmp_path), "--modes", "both", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "not a directory" in err and "--threads 0" in err and "--modes" in err
    assert not (tmp_path / "p.yaml").exists()


def test_calibrate_is_registered():
    from sim.cli.main import COMMAND_MODULES

    assert "sim.cli.cmd_calibrate" in COMMAND_MODULES
    assert V.parse_modes("model") == ("model",)
