"""Issue 47, command-line values, output paths and sweeps: refused before any work, in one line,
with nothing left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.robustness.conftest import assert_refused, cli, rehashed_copy
from traces.outputs import remove_stale_temporaries, write_atomic

DEVICE = ["--device", "jetson-orin-nano-8gb"]


@pytest.mark.parametrize(("argv", "contains"), [
    (["--set", "window.k=10000000"], "window.k"),
    (["--set", "window.k=-1"], "window.k"),
    (["--batch", "1000000000"], "workload.batch"),
    (["--tokens", "1000000000000"], "workload.tokens"),
    (["--prompt-tokens", "1000000000000"], "prompt_tokens"),
    (["--dram-budget", "1e30B"], "dram_budget"),
    (["--dram-budget", "inf"], "--dram-budget"),
    (["--seed", "-5"], "seed"),
    (["--set", "workload.batch=nan"], "workload.batch"),
    (["--tokens", "abc"], "--tokens"),
])
def test_issue47_replay_values_refused(tmp_path, capsys, trace_dir, argv, contains):
    out = tmp_path / "r.parquet"
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--records", out, *argv)
    assert_refused(code, err, out, contains=contains)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["window.k", "workload.batch", "workload.tokens", "sim.seed", "memory.dram_budget_bytes"]),
       value=st.one_of(st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True),
                       st.sampled_from(["inf", "nan", "-0", "1e999", "", "x"])))
def test_issue47_replay_set_fuzzed(capsys, trace_dir, key, value):
    """--set KEY=anything: a result or a clean refusal, never a traceback or a hang."""
    code, out, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, "--engine", "fast", "--set", f"{key}={value}")
    if code != 0:
        assert_refused(code, err)


@pytest.mark.parametrize("option", ["--records", "--timeline"])
def test_issue47_output_is_a_directory(tmp_path, capsys, trace_dir, option):
    d = tmp_path / "adir"
    d.mkdir()
    code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, option, d)
    assert_refused(code, err, contains="is a directory")
    assert list(tmp_path.iterdir()) == [d] and not list(d.iterdir())


@pytest.mark.parametrize("option", ["--records", "--timeline"])
def test_issue47_output_folder_missing_or_a_file(tmp_path, capsys, trace_dir, option):
    f = tmp_path / "afile"
    f.write_text("x")
    for target in (tmp_path / "nope" / "out.x", f / "out.x"):
        code, _, err = cli(capsys, "replay", "--trace", trace_dir, *DEVICE, option, target)
        assert_refused(code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_issue47_failed_write_leaves_nothing(tmp_path):
    from devices.errors import FlashsimError

    target = tmp_path / "out.json"

    def fail(tmp: Path) -> None:
        tmp.write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(FlashsimError, match="out.json: cannot write"):
        write_atomic(target, fail)
    assert list(tmp_path.iterdir()) == []


def test_issue47_stale_temporaries_removed(tmp_path):
    out = tmp_path / "trace"
    dead = tmp_path / ".trace.tmp-99999999-0123abcd"        # a pid no process has
    legacy = tmp_path / ".trace.tmp-89abcdef"               # older flashsim: no pid
    live = tmp_path / f".trace.tmp-{os.getppid()}-0123abcd"  # a running process's
    for p in (dead, legacy, live):
        p.mkdir()
        (p / "masks.npy").write_bytes(b"x" * 100)
    other = tmp_path / ".other.tmp-99999999-0123abcd"
    other.mkdir()
    removed = remove_stale_temporaries(out)
    assert sorted(removed) == sorted([dead, legacy])
    assert live.exists() and other.exists()


def test_issue47_trace_synth_cleans_an_interrupted_writer(tmp_path, capsys):
    out = tmp_path / "t"
    stale = tmp_path / ".t.tmp-99999999-deadbeef"
    stale.mkdir()
    (stale / "masks.npy").write_bytes(b"\0" * 4096)
    code, _, err = cli(capsys, "trace", "synth", "--model", "smollm2-135m", "--tokens", "4", "--active-fraction",
                       "0.4", "--overlap", "0.7", "--hot-skew", "0.5", "--out", out)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_issue47_trace_too_large_refused(tmp_path, capsys):
    out = tmp_path / "t"
    code, _, err = cli(capsys, "trace", "synth", "--model", "llama-2-7b", "--tokens", "1000000000000",
                       "--active-fraction", "0.1", "--overlap", "0.5", "--hot-skew", "0.3", "--out", out)
    assert_refused(code, err, out, contains="above the limit")


def _sweep(tmp_path: Path, **body) -> Path:
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(body))
    return p


def test_issue47_huge_grid_refused_at_once(tmp_path, capsys, trace_dir):
    spec = _sweep(tmp_path, traces=[str(trace_dir)], devices=["jetson-orin-nano-8gb"],
                  presets=[{"name": "llm-in-a-flash", "set": {"window.k": list(range(1000)),
                                                              "workload.batch": list(range(1, 1001)),
                                                              "sim.seed": list(range(1000))}}])
    for extra in (["--dry-run"], ["--no-progress"]):
        code, _, err = cli(capsys, "sweep", spec, "--out", tmp_path / "o", *extra)
        assert_refused(code, err, tmp_path / "o", contains="1,000,000,000")


def test_issue47_dry_run_counts_without_building(tmp_path, capsys, trace_dir):
    spec = _sweep(tmp_path, traces=[str(trace_dir)], devices=["jetson-orin-nano-8gb"],
                  presets=[{"name": "llm-in-a-flash", "set": {"window.k": list(range(100)),
                                                              "workload.batch": list(range(1, 101))}}])
    code, out, err = cli(capsys, "sweep", spec, "--out", tmp_path / "o", "--dry-run")
    assert code == 0, err
    assert out.startswith("10000 points") and "and 9950 more" in out
    spec2 = _sweep(tmp_path, traces=[str(trace_dir)], devices=["jetson-orin-nano-8gb"],
                   presets=[{"name": "llm-in-a-flash", "set": {"window.k": [1, 2, -3]}}])
    code, _, err = cli(capsys, "sweep", spec2, "--out", tmp_path / "o", "--dry-run")
    assert_refused(code, err, contains="window.k")       # a bad value anywhere in the grid, found


def test_issue47_sweep_every_point_failing_exits_2(tmp_path, capsys, trace_dir):
    import numpy as np

    def neg(a):
        a["abs_sum"][0, 0] = -1.0
    bad = rehashed_copy(trace_dir, tmp_path / "bad", neg)
    del np
    spec = _sweep(tmp_path, traces=[str(bad)], devices=["jetson-orin-nano-8gb"], presets=["naive", "hybrid"])
    code, _, err = cli(capsys, "sweep", spec, "--out", tmp_path / "o", "--no-progress", "--workers", "1")
    assert_refused(code, err, tmp_path / "o", contains="every one of the 2 sweep points failed")
    assert "abs_sum >= 0" in err


def test_issue47_sweep_profile_by_absolute_path(tmp_path, capsys, trace_dir):
    from devices.schema import BUNDLED_DIR

    prof = tmp_path / "mine.yaml"
    prof.write_text((BUNDLED_DIR / "jetson-orin-nano-8gb.yaml").read_text())
    spec = _sweep(tmp_path, traces=[str(trace_dir)], devices=[str(prof)], presets=["naive"])
    code, out, err = cli(capsys, "sweep", spec, "--out", tmp_path / "o", "--no-progress", "--workers", "1")
    assert code == 0, err


@pytest.mark.parametrize("argv", [
    ["bench", "compute", "--quick", "--threads", "100000000", "--no-write"],
    ["bench", "flash", "--quick", "--compute-threads", "0", "--no-write"],
    ["validate", "--quick", "--threads", "99999999"],
    ["real", "train-predictor", "--model", "smollm2-135m", "--out", "x.safetensors", "--threads", "-3"],
])
def test_absurd_thread_counts_are_refused_before_any_work(argv, capsys):
    """A thread count far beyond any core count crashed OpenMP (a segfault) in bench compute."""
    from flashsim.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "threads (use the core count" in err and "\n" not in err and "Traceback" not in err
