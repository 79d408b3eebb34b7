"""Long commands report progress on stderr when it is not a terminal (a log, CI): one plain line per
stage, no carriage-return redraws, and stdout left to the result (`--json` parses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashsim.main import main


def _stderr_lines(err: str) -> list[str]:
    assert "\r" not in err, err
    return err.splitlines()


def test_trace_synth_prints_one_line_per_stage(tiny_trace_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "syn"
    assert main(["trace", "synth", "--like", str(tiny_trace_dir), "--tokens", "16", "--seed", "1",
                 "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_tokens"] == 16
    lines = _stderr_lines(captured.err)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"flashsim: trace synth: fit to {tiny_trace_dir}: done in ")
    assert lines[1].startswith("flashsim: trace synth: ") and ", 16 tokens: 2/2 layers in " in lines[1]


def test_sweep_prints_one_line_and_no_progress_silences_it(write_spec, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    spec = write_spec("devices: [apple-m1-max]\npresets: [naive, mmap]\n")
    out = tmp_path / "o"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_run"] == 2
    lines = _stderr_lines(captured.err)
    assert len(lines) == 1 and lines[0].startswith(f"flashsim: sweep {out}: 2/2 points in "), lines
    assert main(["sweep", str(spec), "--out", str(tmp_path / "quiet"), "--workers", "1", "--no-progress",
                 "--json"]) == 0
    assert capsys.readouterr().err == ""


def test_real_convert_json_keeps_stdout_clean_and_reports_on_stderr(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tiny.yaml").write_text(
        "name: tiny\nsource: test shape\nconfig: {model_type: llama, hidden_size: 64, intermediate_size: 128, "
        "num_hidden_layers: 3, num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 100}\n")
    assert main(["real", "convert", "--shape", str(tmp_path / "tiny.yaml"), "--random", "--seed", "1",
                 "--out", str(tmp_path / "s"), "--dtype", "fp32", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    lines = _stderr_lines(captured.err)
    assert len(lines) == 1 and lines[0].startswith("flashsim: write random FFN weights: 3/3 layers in "), lines
