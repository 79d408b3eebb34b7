"""The one reader of the YAML and JSON files a user gives (device profiles, model specs, run configs,
config.json, sweep files): regular files only, duplicate keys refused, YAML aliases bounded.

- Only a regular file is read: a FIFO would block the reader until a writer appears, a device node
  (/dev/zero) never ends. Both are refused before the file is opened.
- A key given twice in one mapping is an error (PyYAML and `json` silently keep the last value, so
  `capacity_bytes` written twice would give an 800 GiB device with no warning).
- A YAML alias is a reference, not a copy, so a document of a few hundred bytes can describe a tree
  of 10^9 nodes ("billion laughs"); every walk over it (validation, JSON dumps, line numbers) is then
  exponential. The composed node graph is measured as the tree it expands to, memoised per node (so
  the measure costs one visit per distinct node), and a document above MAX_YAML_NODES is refused;
  a recursive alias (a node that contains itself) is refused outright.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from devices.errors import FlashsimError

MAX_YAML_NODES = 200_000        # expanded tree size; the largest bundled file is ~2,000 nodes
MAX_TEXT_BYTES = 64 << 20       # no configuration file the tool reads is near this


def read_text_file(path: Path, what: str = "file") -> str:
    """The UTF-8 text of a regular file; FlashsimError for a missing file, a folder, a FIFO, a
    device node or socket, an unreadable or non-UTF-8 file, or one above MAX_TEXT_BYTES."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FlashsimError(f"{path}: file not found") from None
    except OSError as e:
        raise FlashsimError(f"{path}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FlashsimError(f"{path}: is a directory; give a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise FlashsimError(f"{path}: is {special_kind(st.st_mode)}, not a regular file; give a {what}")
    if st.st_size > MAX_TEXT_BYTES:
        raise FlashsimError(f"{path}: {st.st_size:,} bytes, above the {MAX_TEXT_BYTES >> 20} MiB limit of a {what}")
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        kind = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}.get(Path(path).suffix, "text")
        raise FlashsimError(f"{path}: invalid {kind} (not UTF-8 text) at byte {e.start}; give a text {what}") from None
    except OSError as e:
        raise FlashsimError(f"{path}: cannot read ({e.strerror or e})") from None


def special_kind(mode: int) -> str:
    """'a character device', 'a FIFO', ... for a file mode that is not a regular file or folder."""
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


class DuplicateKeyError(ValueError):
    """A mapping key given twice (message: the key and where)."""


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(f"key {k!r} given twice; keep one")
        out[k] = v
    return out


def parse_json(text: str | bytes, where: str) -> Any:
    """JSON with duplicate keys refused; FlashsimError names `where` and the line."""
    try:
        return json.loads(text, object_pairs_hook=_pairs_no_duplicates)
    except json.JSONDecodeError as e:
        raise FlashsimError(f"{where}: invalid JSON at line {e.lineno}: {e.msg}") from None
    except DuplicateKeyError as e:
        raise FlashsimError(f"{where}: {e}") from None
    except UnicodeDecodeError:
        raise FlashsimError(f"{where}: invalid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise FlashsimError(f"{where}: JSON nested too deeply") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (a key a `<<` merge brings in may
    be overridden, as YAML says)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:              # the explicit keys; `<<` merges may be overridden
            if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue                       # SafeLoader's own error follows
            if key in seen:
                raise DuplicateKeyError(f"line {key_node.start_mark.line + 1}: key {key!r} given twice "
                                        f"(first at line {seen[key]}); keep one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def expanded_size(node: yaml.Node, limit: int = MAX_YAML_NODES) -> int:
    """Nodes of the tree `node` expands to (aliases counted at every use), memoised per node;
    ValueError for a recursive alias or a tree above `limit`."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ValueError(f"line {n.start_mark.line + 1}: a recursive alias (a node that contains itself)")
        active.add(key)
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(size(v) for v in n.value)
        active.discard(key)
        if total > limit:
            raise ValueError(f"line {n.start_mark.line + 1}: the aliases expand to more than {limit:,} "
                             "nodes (an alias bomb?); write the values out")
        sizes[key] = total
        return total

    return size(node)


def compose_yaml(text: str, where: str) -> yaml.Node | None:
    """The node graph of a YAML text, checked for alias expansion; FlashsimError on invalid YAML."""
    try:
        node = yaml.compose(text, Loader=_StrictLoader)
        if node is not None:
            expanded_size(node)
        return node
    except yaml.YAMLError as e:
        raise FlashsimError(f"{where}: {_yaml_problem(e)}") from None
    except (ValueError, RecursionError) as e:
        raise FlashsimError(f"{where}: invalid YAML: {str(e) or 'nested too deeply'}") from None


def parse_yaml_text(text: str, where: str) -> Any:
    """YAML data with aliases bounded and duplicate keys refused; FlashsimError names `where`."""
    return construct_yaml(compose_yaml(text, where), where)


def construct_yaml(node: yaml.Node | None, where: str) -> Any:
    """The data of a node graph from compose_yaml (duplicate keys refused)."""
    if node is None:
        return None
    loader = _StrictLoader("")
    try:
        return loader.construct_document(node)
    except DuplicateKeyError as e:
        raise FlashsimError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        raise FlashsimError(f"{where}: {_yaml_problem(e)}") from None
    except RecursionError:
        raise FlashsimError(f"{where}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def _yaml_problem(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"invalid YAML{at}: {problem}"


def load_data_file(path: Path, what: str = "file") -> Any:
    """Parse a regular YAML or JSON file (by suffix: .json is JSON) with the checks above."""
    text = read_text_file(path, what)
    return parse_json(text, str(path)) if Path(path).suffix == ".json" else parse_yaml_text(text, str(path))
