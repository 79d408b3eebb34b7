"""Sweep files as text with positions: YAML or TOML parsed into data plus the 1-based line of every
key, so that a validation error can name the key and its line.

A key path is a tuple as pydantic writes an error's location: mapping keys and list indices, e.g.
("presets", 1, "set", "window.k"). YAML positions come from the composed node tree (where a key given
twice is an error: safe_load would silently keep the last one); tomllib keeps no positions, so TOML
lines come from a scan of `[table]`, `[[array]]` headers and `key =` lines.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from devices.errors import FlashsimError
from devices.safe_load import compose_yaml, construct_yaml


def parse_yaml(path: Path, text: str) -> tuple[Any, dict[tuple, int]]:
    """(data, {key path: line}) of a YAML text; FlashsimError on invalid YAML or a key given twice."""
    node = compose_yaml(text, str(path))      # alias expansion bounded (devices/safe_load.py)
    lines: dict[tuple, int] = {}
    if node is not None:
        try:
            _yaml_lines(node, (), lines)
        except _DuplicateKey as e:
            raise FlashsimError(f"{path}: {e}") from None
    data = construct_yaml(node, str(path))
    return data, lines


class _DuplicateKey(Exception):
    pass


def _yaml_lines(node: yaml.Node, loc: tuple, out: dict[tuple, int]) -> None:
    """Map every key path (as pydantic writes it: names and list indices) to its 1-based line.
    The node graph's alias expansion was bounded by compose_yaml, so this walk is bounded too."""
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = loc + (k.value,)
            if key in out:  # safe_load would silently keep the last one
                dotted = ".".join(str(p) for p in key)
                raise _DuplicateKey(f"key '{dotted}' (line {k.start_mark.line + 1}): given twice "
                                    f"(first at line {out[key]}); keep one")
            out[key] = k.start_mark.line + 1
            _yaml_lines(v, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _yaml_lines(v, loc + (i,), out)


def parse_toml(path: Path, text: str) -> tuple[Any, dict[tuple, int]]:
    """(data, {key path: line}) of a TOML text; FlashsimError on invalid TOML."""
    if sys.version_info < (3, 11):  # pragma: no cover - the project's venv is 3.11
        raise FlashsimError(f"{path}: TOML sweep files need Python >= 3.11 (tomllib); use YAML")
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FlashsimError(f"{path}: invalid TOML: {e}") from None
    return data, _toml_lines(text)


_TOML_TABLE = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"""^\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)\s*=""")


def _toml_lines(text: str) -> dict[tuple, int]:
    """tomllib keeps no positions: map `[table]`, `[[array]]` entries and `key =` lines to lines."""
    lines: dict[tuple, int] = {}
    table: tuple = ()
    counts: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if m := _TOML_TABLE.match(line):
            name = m.group(2).strip()
            if m.group(1) == "[[":
                counts[name] = counts.get(name, -1) + 1
                table = (*name.split("."), counts[name])
            else:
                table = tuple(name.split("."))
            lines.setdefault(table, n)
        elif m := _TOML_KEY.match(line):
            lines.setdefault((*table, m.group(1).strip("\"'")), n)
    return lines
