"""Every number of a device profile file with the source that vouches for it (docs/devices.md, "Where
each number comes from", is generated from this by scripts/profile_sources.py, with the date each
number's lines last changed from git).

A constant is a leaf number of the file (a table counts as one constant): `memory.bandwidth_bytes_per_s`,
`compute.gemv_efficiency.fp16`, `flash.read_table_achievable`, `energy.static_w`,
`power_modes.modes.7w.set.memory.bandwidth_bytes_per_s`. Its source is, first match wins:
  * its own provenance beside it: `<name>_source`, the name without its unit suffix + `_source`
    (`router_sync_s` -> `router_sync_source`), the achievable number's named source (SOURCE_OF), a
    {value, kind, source} mapping (energy), a power mode's `source`;
  * the `source` string of the section that holds it.
`kind` is the provenance's kind where one is given (measured / published / datasheet / estimate),
else the profile's top-level `source.kind`. Lines are 1-based, first and last, for git blame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from devices.errors import FlashsimError

# achievable numbers whose provenance key is not `<name>_source`
SOURCE_OF = {"sustained_bandwidth_bytes_per_s": "sustained_bandwidth_source", "request_cpu_s": "request_cpu_source",
             "io_cores": "request_cpu_source", "gemv_efficiency": "gemv_efficiency_source",
             "sparse_gemv_efficiency": "sparse_gemv_efficiency_source", "host_copy_link_bytes_per_s": "host_copy_source"}
# keys that describe rather than measure (no source needed)
NOT_CONSTANTS = {"schema_version", "unified", "default"}


def _value(node: yaml.Node) -> Any:
    return yaml.safe_load(yaml.serialize(node))


def _is_number(node: yaml.Node) -> bool:
    """A plain scalar that is a number (YAML 1.1 reads `4e-11`, without a dot, as a string; the
    profile's schema reads it as the number it is)."""
    if not isinstance(node, yaml.ScalarNode) or node.style is not None:
        return False
    v = _value(node)
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return False
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_table(node: yaml.Node) -> bool:
    return isinstance(node, yaml.SequenceNode) or (
        isinstance(node, yaml.MappingNode) and any(k.value == "bytes_per_s" for k, _ in node.value))


def _provenance(mapping: dict[str, Any], key: str) -> tuple[str | None, str | None]:
    """(kind, source) of `key`'s own provenance among its siblings, or (None, None)."""
    parts = key.split("_")
    stems = ["_".join(parts[:i]) + "_source" for i in range(len(parts), 0, -1)]   # router_sync_s -> router_sync_source
    for name in (SOURCE_OF.get(key), *stems):
        p = mapping.get(name) if name else None
        if isinstance(p, dict) and p.get("source"):
            return p.get("kind"), p["source"]
    return None, None


def constant_sources(path: Path) -> list[dict[str, Any]]:
    """Every constant of the profile file at `path` (module docstring): path, value, kind, source,
    first_line, last_line. FlashsimError names a constant without any source."""
    text = path.read_text(encoding="utf-8")
    root = yaml.compose(text)
    data = yaml.safe_load(text)
    if not isinstance(root, yaml.MappingNode):
        raise FlashsimError(f"{path}: expected a mapping at the top level")
    top_kind = (data.get("source") or {}).get("kind")
    out: list[dict[str, Any]] = []

    def walk(node: yaml.MappingNode, raw: dict[str, Any], where: str, inherited: tuple[str | None, str | None]) -> None:
        own = raw.get("source")
        section = (inherited[0], own) if isinstance(own, str) else inherited
        for k_node, v_node in node.value:
            key = k_node.value
            dotted = f"{where}.{key}" if where else key
            if key in NOT_CONSTANTS or key.endswith("_source") or key in ("source", "description", "notes", "name"):
                continue
            value = raw.get(key)
            kind, src = _provenance(raw, key)
            if isinstance(value, dict) and "value" in value and "source" in value:       # energy's sourced values
                kind, src = value.get("kind"), value["source"]
                v_node = next(v for k, v in v_node.value if k.value == "value")
            elif isinstance(v_node, yaml.MappingNode) and not _is_table(v_node):
                mode_src = value.get("source") if isinstance(value, dict) and "set" in value else None
                walk(v_node, value, dotted, (value.get("kind") if mode_src else kind,
                                             mode_src or src or section[1]) if (mode_src or src) else section)
                continue
            if not (_is_number(v_node) or _is_table(v_node)):
                continue
            out.append({"path": dotted, "value": _value(v_node), "kind": kind or section[0] or top_kind,
                        "source": src or section[1], "first_line": v_node.start_mark.line + 1,
                        "last_line": max(v_node.end_mark.line + (0 if v_node.end_mark.column else -1),
                                         v_node.start_mark.line) + 1})

    walk(root, data, "", (top_kind, None))
    missing = [c["path"] for c in out if not c["source"]]
    if missing:
        raise FlashsimError(f"{path}: {', '.join(missing)}: no source; give the section a `source` or the number "
                            "its own `<name>_source` (kind and citation)")
    return out
