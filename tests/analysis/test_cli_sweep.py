"""`flashsim sweep` through the CLI: bad input gives one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashsim.main import main


@pytest.mark.parametrize(("body", "expect"), [
    ("devices: [apple-m1-max]\npresets: [naive]\nbogus: 1\n", "key 'bogus' (line 4): unknown key"),
    ("devices: [apple-m1-max]\npresets: [naive\n", "invalid YAML at line 4"),
    ("devices: [no-such-device]\npresets: [naive]\n", "unknown device 'no-such-device'"),
    ("models: [no-such-model]\ndevices: [apple-m1-max]\npresets: [naive]\n", "no-such-model"),
    ("devices: [apple-m1-max]\ndram_budgets: [1GiB, 1024MiB]\npresets: [naive]\n", "same point"),
])
def test_bad_sweep_files_are_one_line_errors(write_spec, tmp_path: Path, capsys: pytest.CaptureFixture,
                                             body: str, expect: str) -> None:
    assert main(["sweep", str(write_spec(body)), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()  # nothing written for a spec that does not resolve


def test_bad_flags(write_spec, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    spec = str(write_spec("devices: [apple-m1-max]\npresets: [naive]\n"))
    assert main(["sweep", spec, "--out", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["sweep", spec, "--out", str(tmp_path / "o"), "--engine", "spark"])
    assert e.value.code == 2
    assert main(["sweep", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "sweep file not found" in capsys.readouterr().err
