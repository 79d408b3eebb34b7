"""Issue 47, hangs and runaway memory: inputs that used to hang or grow without bound, run as real
processes under a watchdog (wall-clock timeout, address-space limit): a one-line refusal, exit 2."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT_BYTES = 4 << 30      # the CLI with NumPy needs well under 1 GiB; a runaway hits this
TIMEOUT_S = 120                   # generous for a loaded CI host; the refusals take seconds


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run_cli(*argv: object, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "flashsim", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limits)


def _assert_refused(p: subprocess.CompletedProcess, contains: str) -> None:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr[-800:]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-800:]
    assert contains in p.stderr, p.stderr


def test_issue47_huge_model_spec_synth(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "deep", "source": "test", "config": {
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 10**12,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}}))
    p = run_cli("trace", "synth", "--model", spec, "--tokens", "4", "--active-fraction", "0.1", "--overlap",
                "0.5", "--hot-skew", "0.3", "--out", tmp_path / "t", cwd=tmp_path)
    _assert_refused(p, "n_layers")
    assert not (tmp_path / "t").exists()


def test_issue47_huge_trace_tokens(tmp_path):
    p = run_cli("trace", "synth", "--model", "smollm2-135m", "--tokens", 10**12, "--active-fraction", "0.1",
                "--overlap", "0.5", "--hot-skew", "0.3", "--out", tmp_path / "t", cwd=tmp_path)
    _assert_refused(p, "above the limit")
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [["--dry-run"], []])
def test_issue47_billion_point_sweep(tmp_path, extra):
    from traces.data import shipped_trace_path

    sw = tmp_path / "sw.yaml"
    sw.write_text(yaml.safe_dump({"traces": [str(shipped_trace_path())], "devices": ["jetson-orin-nano-8gb"],
                                  "presets": [{"name": "llm-in-a-flash", "set": {
                                      "window.k": list(range(1000)), "workload.batch": list(range(1, 1001)),
                                      "sim.seed": list(range(1000))}}]}))
    p = run_cli("sweep", sw, "--out", tmp_path / "o", "--no-progress", *extra, cwd=tmp_path)
    _assert_refused(p, "1,000,000,000")
    assert not (tmp_path / "o").exists()
