"""Traces shipped with flashsim (package data), found without knowing where flashsim is installed.

`shipped_trace_path()` is the SmolLM2-135M trace captured from the builtin prompts; README.md in
this folder gives the exact command that regenerates it.
"""

from __future__ import annotations

from pathlib import Path

from devices.errors import unknown_name

DATA_DIR = Path(__file__).resolve().parent
SHIPPED_TRACES = {"smollm2-135m-builtin": "SmolLM2-135M-Instruct, builtin prompts 1-5 (one per task), 40 new tokens"}
DEFAULT_TRACE = "smollm2-135m-builtin"


def shipped_trace_path(name: str = DEFAULT_TRACE) -> Path:
    """The directory of a shipped trace (open it with `traces.open_trace`)."""
    if name not in SHIPPED_TRACES:
        raise unknown_name("shipped trace", name, SHIPPED_TRACES)
    return DATA_DIR / name
