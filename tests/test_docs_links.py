"""Every relative link in README.md and docs/*.md resolves (to a file, and a `#section` to one of that
page's headings), and every docs page that code, scripts or device profiles name (`docs/NAME.md` in an
error message or a comment) exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ')'
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"```.*?```", re.S)
DOC_NAME = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)")
HEADING = re.compile(r"^#+\s+(.*)$", re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' removed, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _relative_links(page: Path) -> list[str]:
    text = CODE_BLOCK.sub("", page.read_text())
    out = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue                                     # http:, mailto:, in-page anchors
        out.append(target.split("#", 1)[0])
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    missing = [t for t in _relative_links(page) if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files: {missing}"


def test_docs_pages_named_in_code_exist() -> None:
    missing = []
    for folder in ("flashsim", "sim", "real", "analysis", "traces", "devices", "scripts", "tests"):
        base = ROOT / folder
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            if path.suffix not in (".py", ".yaml", ".yml", ".toml") or not path.is_file() or path == Path(__file__):
                continue
            for name in DOC_NAME.findall(path.read_text(errors="replace")):
                if not (ROOT / "docs" / name).exists():
                    missing.append(f"{path.relative_to(ROOT)}: docs/{name}")
    assert not missing, "docs pages named but absent: " + "; ".join(sorted(set(missing)))


def test_every_docs_page_is_linked_from_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    unlinked = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert not unlinked, f"README.md does not link these docs pages: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_section_links_name_a_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or "#" not in target:
            continue
        name, anchor = target.split("#", 1)
        linked = page if not name else page.parent / name
        if linked.suffix != ".md" or not linked.exists():
            continue
        if anchor not in {_slug(h) for h in HEADING.findall(CODE_BLOCK.sub("", linked.read_text()))}:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to sections that do not exist: {broken}"
