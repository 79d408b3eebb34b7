"""Fixtures of the analysis tests: a tiny real trace (built once per session) and sweep files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analysis.sweep_helpers import write_tiny_trace


@pytest.fixture(scope="session")
def tiny_trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_trace(tmp_path_factory.mktemp("traces") / "tiny")


@pytest.fixture
def write_spec(tmp_path: Path, tiny_trace_dir: Path):
    """write_spec(body, name="s.yaml") -> path of a sweep file whose traces default to the tiny trace."""

    def _write(body: str, name: str = "s.yaml") -> Path:
        path = tmp_path / name
        text = body if "traces" in body else f"traces: [{tiny_trace_dir}]\n{body}"
        path.write_text(text)
        return path

    return _write
