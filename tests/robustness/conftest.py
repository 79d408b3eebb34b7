"""Fixtures of the bad-input batch (issue 47): run the CLI in-process and assert a clean refusal."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from devices.model_spec import ModelSpec
from flashsim.main import main


def tiny_spec(n_layers: int = 2, d_ff: int = 64) -> ModelSpec:
    return ModelSpec(name="tiny", family="llama", n_layers=n_layers, d_model=32, d_ff=d_ff, n_heads=4,
                     n_kv_heads=2, head_dim=8, vocab_size=64, ffn_kind="swiglu")


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `flashsim ARGV` run in this process."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:           # argparse's own usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code: int, err: str, *absent: Path, contains: str | None = None) -> None:
    """Exit 2, one line on stderr, no traceback, and none of `absent` written."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, f"exit {code}, stderr: {err[-500:]}"
    assert len(lines) == 1, f"expected one line, got {len(lines)}: {err[-500:]}"
    assert "Traceback" not in err
    for p in absent:
        assert not Path(p).exists(), f"{p} was left behind"
        assert not list(Path(p).parent.glob(f".{Path(p).name}.*")), f"a temporary of {p} was left behind"
    if contains:
        assert contains in err, err


@pytest.fixture(scope="session")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic trace (2 layers x 64 neurons, 2 prompts of 8 tokens, magnitudes)."""
    from traces.synthetic import synthesize

    out = tmp_path_factory.mktemp("trace") / "t"
    return synthesize(out, tiny_spec(), 16, 0, active_fraction=0.2, overlap=0.7, hot_skew=0.3, prompt_tokens=8)


def rehashed_copy(src: Path, dst: Path, mutate, rule: str | None = None) -> Path:  # type: ignore[no-untyped-def]
    """A copy of a trace whose arrays `mutate(arrays)` changed, with checksums that match again
    (and, with `rule`, its manifest's sparsity rule replaced)."""
    shutil.copytree(src, dst)
    man = json.loads((dst / "manifest.json").read_text())
    arrays = {n: np.load(dst / f"{n}.npy").copy() for n in man["files"]}
    mutate(arrays)
    for n, a in arrays.items():
        np.save(dst / f"{n}.npy", a)
        man["files"][n]["sha256"] = hashlib.sha256((dst / f"{n}.npy").read_bytes()).hexdigest()
    if rule is not None:
        man["sparsity"]["rule"] = rule
    (dst / "manifest.json").write_text(json.dumps(man))
    return dst
