"""Writes docs/devices.md's "Where each number comes from": per bundled profile, every constant with its
value, its source's kind, the date its lines last changed (git blame's author date) and its source
(devices/constant_sources.py). Run after editing a profile:

    python scripts/profile_sources.py          # rewrite the block in docs/devices.md
    python scripts/profile_sources.py --check  # exit 1 when the block is out of date (dates aside)

tests/devices/test_constant_sources.py checks the block's constants and sources against the profiles.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devices.constant_sources import constant_sources  # noqa: E402
from devices.schema import BUNDLED_DIR  # noqa: E402

DOC = ROOT / "docs" / "devices.md"
BEGIN = "<!-- profile-sources:begin (scripts/profile_sources.py writes this block) -->"
END = "<!-- profile-sources:end -->"
SOURCE_CHARS = 180


def blame_dates(path: Path) -> dict[int, str]:
    """{line: YYYY-MM-DD of the commit that last changed it} ("uncommitted" for local edits)."""
    try:
        out = subprocess.run(["git", "blame", "--line-porcelain", "--", str(path)], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    import datetime as dt

    dates: dict[int, str] = {}
    line, sha = 0, ""
    for text in out.splitlines():
        parts = text.split()
        if len(parts) >= 3 and len(parts[0]) == 40 and parts[1].isdigit():
            sha, line = parts[0], int(parts[2])
        elif text.startswith("author-time "):
            dates[line] = ("uncommitted" if set(sha) == {"0"} else
                           dt.datetime.fromtimestamp(int(parts[1]), dt.timezone.utc).date().isoformat())
    return dates


def _value(v: Any) -> str:
    if isinstance(v, dict):
        t = v.get("bytes_per_s", [])
        return f"table {len(t)} x {len(t[0]) if t else 0}"
    if isinstance(v, list):
        return f"{len(v)} values"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    try:
        return f"{float(v):g}"
    except (TypeError, ValueError):
        return str(v)


def _cell(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= SOURCE_CHARS else text[:SOURCE_CHARS - 1].rstrip() + "…"


def rows(path: Path, date_of: Callable[[int, int], str]) -> list[list[str]]:
    """[constant, value, kind, last changed, source] of every constant of one profile file."""
    return [[f"`{c['path']}`", _value(c["value"]), str(c["kind"]), date_of(c["first_line"], c["last_line"]),
             _cell(c["source"])] for c in constant_sources(path)]


def render(date_for: Callable[[Path], Callable[[int, int], str]]) -> str:
    """The whole block, one table per bundled profile."""
    out = [BEGIN, ""]
    for path in sorted(BUNDLED_DIR.glob("*.yaml")):
        out += [f"#### {path.stem}", "", "| constant | value | kind | last changed | source |", "|---|---|---|---|---|"]
        out += ["| " + " | ".join(r) + " |" for r in rows(path, date_for(path))]
        out.append("")
    out.append(END)
    return "\n".join(out)


def git_dates(path: Path) -> Callable[[int, int], str]:
    dates = blame_dates(path)

    def date_of(first: int, last: int) -> str:
        seen = [dates[i] for i in range(first, last + 1) if i in dates]
        return "uncommitted" if "uncommitted" in seen else max(seen, default="unknown")

    return date_of


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/devices.md's block is out of date")
    args = ap.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        print(f"{DOC}: no block between {BEGIN!r} and {END!r}", file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    new = head + render(git_dates) + tail
    if args.check:
        if new != text:
            print(f"{DOC}: the profile-sources block is out of date; run python scripts/profile_sources.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
