"""Issue 52 holes 10 and 12: the environment (full disk, read-only or immutable folder, file-size
limit, out of memory, a path that is not UTF-8, SIGINT, SIGTERM) and out-of-tree policies give one
line and exit 2 (130 / 143 for the signals), leaving no temporary behind."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.robustness.conftest import assert_refused, cli

DEVICE = ["--device", "jetson-orin-nano-8gb"]
REPO = Path(__file__).resolve().parents[2]
SYNTH = ["trace", "synth", "--model", "smollm2-135m", "--tokens", "4", "--active-fraction", "0.1",
         "--overlap", "0.5", "--hot-skew", "0.3"]


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---- hole 10: the environment -----------------------------------------------------------------------
@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EFBIG, errno.EDQUOT])
def test_issue52_trace_write_fails_cleanly(tmp_path, capsys, monkeypatch, err):
    import numpy as np

    def full(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(np.lib.format, "open_memmap", full)
    code, _, msg = cli(capsys, *SYNTH, "--out", tmp_path / "t")
    assert_refused(code, msg, tmp_path / "t")
    assert _leftovers(tmp_path) == []


def test_issue52_out_of_memory_is_one_line(capsys, monkeypatch, trace_dir):
    import sim.engine

    def oom(*a, **k):  # type: ignore[no-untyped-def]
        raise MemoryError()

    monkeypatch.setattr(sim.engine, "build", oom)
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE)
    assert_refused(code, err, contains="out of memory")


def test_issue52_environment_error_keeps_its_traceback_with_debug(capsys, monkeypatch, trace_dir):
    import sim.engine

    monkeypatch.setattr(sim.engine, "build", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(MemoryError):
        cli(capsys, "--debug", "replay", "--trace", trace_dir, *DEVICE)


def test_issue52_immutable_folder_refused(tmp_path, capsys, trace_dir):
    d = tmp_path / "ro"
    d.mkdir()
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i not available here")
    try:
        code, _, err = cli(capsys, "trace", "profile", trace_dir, "--out", d / "p.npz")
        assert_refused(code, err)
        code, _, err = cli(capsys, *SYNTH, "--out", d / "t")
        assert_refused(code, err)
    finally:
        subprocess.run(["chattr", "-i", str(d)])
    assert list(d.iterdir()) == []


NOT_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("verb", ["records", "timeline", "synth", "profile"])
def test_issue52_non_utf8_output_path_refused(tmp_path, capsys, trace_dir, verb):
    target = tmp_path / f"out{NOT_UTF8}"
    argv = {"records": ["replay", "--trace", trace_dir, *DEVICE, "--engine", "fast", "--records", target],
            "timeline": ["replay", "--trace", trace_dir, *DEVICE, "--timeline", target],
            "synth": [*SYNTH, "--out", target],
            "profile": ["trace", "profile", trace_dir, "--out", f"{target}.npz"]}[verb]
    code, _, err = cli(capsys, *argv)
    assert_refused(code, err, contains="UTF-8")
    assert os.listdir(tmp_path) == []


def _child(argv: list[str], preexec=None) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, "-m", "flashsim", *map(str, argv)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    [*SYNTH[:4], "--tokens", "3000", *SYNTH[6:]],
    ["real", "convert", "--shape", "smollm2-135m", "--random"],
], ids=["trace synth", "real convert"])
def test_issue52_file_size_limit_is_one_line(tmp_path, argv):
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    p = _child([*argv, "--out", tmp_path / "o"], limit)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "file-size limit" in err or "too large" in err.lower(), err
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code", "says"), [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_issue52_signal_mid_write_removes_temporaries(tmp_path, sig, code, says):
    p = _child(["real", "convert", "--shape", "smollm2-135m", "--random", "--out", tmp_path / "s"])
    t0 = time.monotonic()
    while not list(tmp_path.glob(".s.tmp-*")) and time.monotonic() - t0 < 120 and p.poll() is None:
        time.sleep(0.01)
    assert p.poll() is None, "the writer ended before it could be interrupted"
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == code, (p.returncode, err)
    assert says in err and "Traceback" not in err, err
    assert os.listdir(tmp_path) == [], "a temporary store folder was left"


# ---- hole 12: out-of-tree policies --------------------------------------------------------------------
POLICIES = textwrap.dedent('''
    from dataclasses import dataclass

    from sim.policies.base import Predictor


    class Abstract(Predictor):
        @dataclass(frozen=True)
        class Params:
            pass


    class RaisesInInit(Predictor):
        @dataclass(frozen=True)
        class Params:
            pass

        def __init__(self, params):
            raise RuntimeError("no GPU here")

        def predict(self, layer, steps, needed):
            return needed


    class RaisesInPredict(Predictor):
        @dataclass(frozen=True)
        class Params:
            pass

        def predict(self, layer, steps, needed):
            raise ValueError("bad shapes in my predictor")


    class NotADataclass(Predictor):
        class Params:
            pass

        def predict(self, layer, steps, needed):
            return needed
''')


@pytest.fixture
def policy_module(tmp_path, monkeypatch) -> str:
    name = f"user_policies_{os.getpid()}_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize(("cls", "contains"), [
    ("Abstract", "Abstract does not implement Predictor.predict, which every backend needs"),
    ("RaisesInInit", "RaisesInInit"),
    ("RaisesInPredict", "RaisesInPredict"),
    ("NotADataclass", "NotADataclass.Params must be a dataclass"),
])
def test_issue52_bad_user_policy_is_one_line(capsys, trace_dir, policy_module, cls, contains):
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast",
                       "--set", f"predictor={policy_module}:{cls}")
    assert_refused(code, err, contains=contains)
    if cls.startswith("Raises"):
        assert ("__init__" if cls == "RaisesInInit" else "predict") in err, err


def test_issue52_policy_path_does_not_run_an_unrelated_module(capsys, trace_dir):
    was = "this" in sys.modules
    code, out, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--set", "predictor=this:X")
    assert_refused(code, err, contains="defines no 'X'")
    assert "Zen of Python" not in out and ("this" in sys.modules) == was


def test_issue52_policy_by_file_path(tmp_path, capsys, trace_dir):
    f = tmp_path / "mine.py"
    f.write_text(POLICIES)
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast",
                       "--set", f"predictor={f}:RaisesInPredict")
    assert_refused(code, err, contains="raised ValueError in predict")


def test_issue52_fifo_as_profile_path_does_not_block(tmp_path, capsys, trace_dir):
    fifo = tmp_path / "dev.yaml"
    os.mkfifo(fifo)
    code, _, err = cli(capsys, "devices", "show", fifo)
    assert_refused(code, err, contains="FIFO")
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, "--device", fifo)
    assert_refused(code, err, contains="FIFO")
