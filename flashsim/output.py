"""Shared output helpers for the CLI: JSON on stdout, plain fixed-width tables for people, and the
check of an output file path before any slow work."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.results import to_jsonable


def output_file(path: str, kind: str, option: str = "--out") -> Path:
    """`path` as a file to write: FlashsimError when it is a directory or its folder does not exist
    (`kind` names what to give instead, e.g. "FILE.json")."""
    from traces.outputs import check_output_file

    return check_output_file(path, option, kind)


def print_json(obj: Any) -> None:
    """One JSON object (or list) on stdout."""
    json.dump(to_jsonable(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> None:
    """A plain table; `align` is a string of 'l'/'r' per column (default: text left, numbers right)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if align is None:
        align = "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(headers)))

    def fmt(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align)).rstrip()

    print(fmt(headers))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print(fmt(r))
