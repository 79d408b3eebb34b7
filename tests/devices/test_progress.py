"""devices/progress.py: a live bar on a terminal, one plain line per stage (no carriage return) in a
log, nothing left behind by a stage that failed, and the model-loading libraries' bars turned off."""

from __future__ import annotations

import io
import os
import sys

import pytest

from devices.progress import HEARTBEAT_S, Stage, Stages, note, phase, quiet_third_party, track


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert "\r" not in text
    return text.splitlines()


def test_a_stage_in_a_log_is_one_line_at_its_end() -> None:
    log = io.StringIO()
    with Stage("capture m", 50, "tokens", stream=log) as stage:
        for _ in range(50):
            stage.update()
            stage.set_postfix("prompt p0")   # shown on a bar only
    lines = _lines(log)
    assert len(lines) == 1 and lines[0].startswith("flashsim: capture m: 50/50 tokens in ") \
        and lines[0].endswith(" s")


def test_a_long_stage_in_a_log_says_it_is_alive_without_a_line_per_item() -> None:
    log = io.StringIO()
    with Stage("sweep", 3, "points", stream=log, heartbeat_s=0.0) as stage:
        stage.update()
        stage.update()
        stage.update()
    lines = _lines(log)
    assert [ln.split(",")[0] for ln in lines[:3]] == [f"flashsim: sweep: {i}/3 points so far" for i in (1, 2, 3)]
    assert lines[3].startswith("flashsim: sweep: 3/3 points in ") and len(lines) == 4
    assert HEARTBEAT_S >= 30   # the default: a line per item only for items slower than that


def test_a_stage_on_a_terminal_is_a_redrawn_bar_removed_at_the_end() -> None:
    tty = _Terminal()
    with Stage("convert", 4, "layers", stream=tty) as stage:
        for _ in range(4):
            stage.update()
    text = tty.getvalue()
    assert "\r" in text and "convert:" in text and "/4 " in text
    assert "in 0." not in text   # the log's end line is not written on a terminal


def test_a_failed_stage_writes_no_end_line_and_a_disabled_one_nothing() -> None:
    log = io.StringIO()
    with pytest.raises(ValueError), Stage("synth", 10, "layers", stream=log) as stage:
        stage.update()
        raise ValueError("boom")
    with Stage("quiet", 2, stream=log, enabled=False) as stage:
        stage.update(2)
    assert log.getvalue() == ""


def test_phase_is_one_line_at_the_end_in_a_log_and_at_the_start_on_a_terminal() -> None:
    log, tty = io.StringIO(), _Terminal()
    with phase("loading m", stream=log):
        assert log.getvalue() == ""
    with phase("loading m", stream=tty):
        assert tty.getvalue() == "flashsim: loading m ...\n"
    assert _lines(log)[0].startswith("flashsim: loading m: done in ")
    with pytest.raises(KeyError), phase("fit", stream=log):
        raise KeyError("x")
    assert len(_lines(log)) == 1


def test_named_stages_give_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    with Stages("plan m", "simulated runs") as stages:
        stages("synthesizing trace")
        stages("simulating")
        for _ in range(5):
            stages(None)
    assert [ln.split(" in ")[0] for ln in _lines(log)] == [
        "flashsim: plan m: synthesizing trace: done", "flashsim: plan m: simulating: 5 simulated runs"]


def test_track_and_note_write_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert list(track(range(3), "write", "layers")) == [0, 1, 2]
    note("loading m")
    lines = _lines(log)
    assert lines[0].startswith("flashsim: write: 3/3 layers in ") and lines[1] == "flashsim: loading m"


def test_third_party_bars_are_off_in_a_log_and_a_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    quiet_third_party(_Terminal())
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ   # download bars stay on a terminal
    quiet_third_party(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    quiet_third_party(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
