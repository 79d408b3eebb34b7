"""The package layers and the module graph, read from the source with `ast` (not grep, not imports).

Layers, bottom to top: devices < traces < sim < adapt < real < analysis < flashsim (the command line).
A module may import its own package and lower layers only, so `sim` imports only `devices`, `traces` and
itself, and `adapt` (runtime adaptation built on the engine) never imports `real`, `analysis` or the
command line; `real` may read `adapt`'s GSI files. Every import counts: module level, inside
functions, under `if TYPE_CHECKING:`, relative (`from . import x`), and the literal-string dynamic ones (`importlib.import_module("pkg.mod")`,
`__import__("pkg.mod")`). Between modules there is no import cycle (strongly connected components of
the module graph, function-level imports included).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("devices", "traces", "sim", "adapt", "real", "analysis", "flashsim")   # bottom to top
RANK = {pkg: i for i, pkg in enumerate(LAYERS)}

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files() -> dict[str, Path]:
    """Every module of the layered packages, by dotted name."""
    files: dict[str, Path] = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[_module_name(path)] = path
    return files


MODULES = _source_files()


def _resolve(name: str) -> str | None:
    """The repository module `name` refers to: itself, or the longest prefix that is one (an import of
    a name defined in a package's `__init__`); None outside the repository."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _imported_names(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) for every import in one file, relative ones made absolute."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(p for p in base_parts if p)
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` imports mod.
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if sub in MODULES else target
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("import_module", "__import__"):
                yield node.lineno, node.args[0].value


def _edges() -> list[tuple[str, int, str]]:
    """(importing module, line, imported repository module), self-imports left out."""
    edges = []
    for module, path in MODULES.items():
        for line, name in _imported_names(module, path):
            target = _resolve(name)
            if target is not None and target != module:
                edges.append((module, line, target))
    return edges


EDGES = _edges()


def _layer(module: str) -> str:
    return module.split(".", 1)[0]


def test_the_walk_sees_the_packages():
    """The walk finds modules in every layer and the imports that cross layers (a walk that found
    nothing would pass every check below)."""
    assert {_layer(m) for m in MODULES} == set(LAYERS)
    crossing = {(_layer(a), _layer(b)) for a, _, b in EDGES if _layer(a) != _layer(b)}
    assert ("sim", "devices") in crossing and ("flashsim", "sim") in crossing
    assert ("real", "sim") in crossing and ("analysis", "sim") in crossing
    assert ("adapt", "sim") in crossing and ("flashsim", "adapt") in crossing


def test_the_simulator_package_holds_no_adaptation():
    """Runtime adaptation is its own package above sim: nothing of it is left inside sim/."""
    assert not list((ROOT / "sim" / "adapt").rglob("*.py"))
    assert not [m for m in MODULES if m.startswith("sim.") and "adapt" in m.split(".")]


def _upward(edges: list[tuple[str, int, str]]) -> list[str]:
    return [f"{MODULES[a].relative_to(ROOT)}:{line}: import {b} "
            f"(layer {_layer(a)} imports higher layer {_layer(b)})"
            for a, line, b in edges if RANK[_layer(b)] > RANK[_layer(a)]]


def test_no_import_flows_up_the_layers():
    bad = _upward(EDGES)
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_upward_imports_are_reported_with_their_line():
    bad = _upward([("sim.engine", 7, "analysis.planner"), ("analysis.planner", 3, "sim.engine"),
                   ("sim.engine", 9, "sim.workload")])
    assert bad == ["sim/engine.py:7: import analysis.planner (layer sim imports higher layer analysis)"]


def test_relative_function_level_and_dynamic_imports_resolve(tmp_path):
    src = tmp_path / "fake.py"
    src.write_text("from .. import workload\nfrom ..workload import TraceView\nfrom . import base\n"
                   "def f():\n    import importlib\n    importlib.import_module('flashsim.main')\n"
                   "    from devices.schema import load_profile\n")
    got = [(line, _resolve(name)) for line, name in _imported_names("sim.policies.fake", src)]
    assert sorted(got) == [(1, "sim.workload"), (2, "sim.workload"), (3, "sim.policies.base"),
                           (5, None), (6, "flashsim.main"), (7, "devices.schema")]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module (no module imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _describe(component: list[str]) -> str:
    """The imports inside one component, as file:line lines, so the cycle can be cut."""
    members = set(component)
    lines = [f"  {MODULES[a].relative_to(ROOT)}:{line}: import {b}"
             for a, line, b in sorted(set(EDGES)) if a in members and b in members]
    return "cycle among " + ", ".join(component) + ":\n" + "\n".join(lines)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, _, b in EDGES:
        graph[a].add(b)
    cycles = _strongly_connected(graph)
    assert not cycles, "\n".join(_describe(c) for c in cycles)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_cycle_finder_on_hand_made_graphs(graph, expected):
    assert sorted(_strongly_connected(graph)) == expected
