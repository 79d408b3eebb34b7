"""Print the package tree with lines of Python per package and per module (`wc -l` semantics), in the
format of docs/architecture.md's "The tree, with line counts". `__init__.py` files count in the
package totals but are not listed.

    python scripts/tree_lines.py [ROOT]
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

PACKAGES = ("devices", "traces", "sim", "adapt", "real", "analysis", "flashsim")


def lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def package_lines(folder: Path) -> int:
    return sum(lines(p) for p in folder.rglob("*.py"))


def emit(folder: Path, depth: int, out: list[str]) -> None:
    name = folder.name + "/"
    out.append(f"{'  ' * depth}{name:<{26 - 2 * depth}}{package_lines(folder):>5}")
    modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
    if modules:
        text = ", ".join(f"{p.stem}\u00a0{lines(p)}" for p in modules)   # a name and its count stay on one line
        indent = " " * (4 + 2 * depth)
        wrapped = textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent)
        out.extend(w.replace("\u00a0", " ") for w in wrapped)
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and any(p.rglob("*.py"))):
        emit(sub, depth + 1, out)


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    out: list[str] = []
    for pkg in PACKAGES:
        if (root / pkg).is_dir():
            emit(root / pkg, 0, out)
    print("\n".join(out))


if __name__ == "__main__":
    main()
