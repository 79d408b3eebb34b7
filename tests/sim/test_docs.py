"""The Python examples in docs/replay.md run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "replay.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("code", _blocks())
def test_doc_python_block_runs(code: str, capsys) -> None:
    exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert out.strip(), "the example prints its results"


def test_doc_has_examples() -> None:
    assert _blocks()
