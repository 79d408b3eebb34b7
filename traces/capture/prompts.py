"""Prompt files for capture: JSON lines, one prompt per line, `{"id": str, "task": str, "text": str}`.

`load_prompts("builtin")` reads the suite shipped in `traces/prompts/builtin.jsonl` (written for
this project: question answering, translation, summarization, code and story writing, ordered
round-robin by task so that the first n prompts cover the tasks evenly). Blank lines are skipped;
anything else that is not such an object (bad JSON, a missing or empty field, an unknown key, a
duplicate id) is a `FlashsimError` naming the file and the line number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from devices.errors import FlashsimError

BUILTIN_PROMPTS = Path(__file__).resolve().parent.parent / "prompts" / "builtin.jsonl"
FIELDS = ("id", "task", "text")


@dataclass(frozen=True)
class Prompt:
    id: str
    task: str
    text: str


def load_prompts(source: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from 'builtin' or a JSONL file; `limit` keeps the first `limit` of them."""
    path = BUILTIN_PROMPTS if str(source) == "builtin" else Path(source).expanduser()
    if not path.is_file():
        raise FlashsimError(f"--prompts {source}: no such file (give 'builtin' or a JSON-lines file)")
    if limit is not None and limit < 1:
        raise FlashsimError(f"--limit-prompts must be >= 1, got {limit}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise FlashsimError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        prompt = _parse_line(path, lineno, line)
        if prompt.id in seen:
            raise FlashsimError(f"{path}:{lineno}: duplicate id {prompt.id!r} (first on line {seen[prompt.id]})")
        seen[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise FlashsimError(f"{path}: no prompts (expected one JSON object per line with {', '.join(FIELDS)})")
    return prompts[:limit] if limit else prompts


def _parse_line(path: Path, lineno: int, line: str) -> Prompt:
    where = f"{path}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise FlashsimError(f"{where}: malformed JSON at column {e.colno}: {e.msg}") from None
    if not isinstance(obj, dict):
        raise FlashsimError(f"{where}: expected a JSON object with {', '.join(FIELDS)}, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise FlashsimError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(FIELDS)}")
    for key in FIELDS:
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            got = "missing" if key not in obj else f"{type(value).__name__} {value!r}"[:60]
            raise FlashsimError(f"{where}: field {key!r} must be a non-empty string ({got})")
    return Prompt(obj["id"], obj["task"], obj["text"])
