"""The docs cite only what exists, and nothing cites a document outside the repository.

A newcomer with only a clone must be able to follow every citation: each ``tests/...::name``
named in docs/*.md is a test that exists, each ``docs/<file>.md §N`` cited anywhere names a
page and a numbered section that exist, and no file points at documents a clone lacks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Where citations live: code, tests, benchmarks, deployment files, the docs themselves.
CITING = ("app", "tests", "bench", "deploy", "docs", "api-schemas")
CITING_FILES = ("README.md", "Makefile")
_TEST_REF = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
_SECTION_REF = re.compile(r"docs/([\w-]+\.md) §(\d+(?:\.\d+)*)")
_HEADING = re.compile(r"^#+ §(\d+(?:\.\d+)*)\b", re.MULTILINE)
# Spelled in pieces so this file does not match itself.
_OUTSIDE = re.compile(
    "|".join(
        [
            r"\.\./" + "shared",
            r"\bDESIGN" + r"\.md",
            r"(?<![\w/])API" + r"\.md",
            r"ADR-?" + r"00(?:07|70|71)",
            "验" + "证",
        ]
    )
)


def _texts() -> list[tuple[Path, str]]:
    files = [p for d in CITING for p in (ROOT / d).rglob("*") if p.is_file()]
    files += [ROOT / name for name in CITING_FILES if (ROOT / name).exists()]
    out = []
    for path in files:
        if path.suffix not in {".py", ".md", ".json", ".service", ".example", ""} or (
            "results" in path.parts or "__pycache__" in path.parts
        ):
            continue
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return out


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_test_the_docs_name_exists() -> None:
    missing = []
    for page in sorted(DOCS.glob("*.md")):
        for file, name in _TEST_REF.findall(page.read_text(encoding="utf-8")):
            path = ROOT / file
            if not path.is_file() or name not in _test_names(path):
                missing.append(f"{page.name}: {file}::{name}")
    assert not missing, "docs name tests that do not exist:\n" + "\n".join(missing)


def test_every_cited_docs_section_exists() -> None:
    sections = {
        page.name: set(_HEADING.findall(page.read_text(encoding="utf-8")))
        for page in DOCS.glob("*.md")
    }
    broken = []
    for path, text in _texts():
        for page, section in _SECTION_REF.findall(text):
            if section not in sections.get(page, set()):
                broken.append(f"{path.relative_to(ROOT)}: docs/{page} §{section}")
    assert not broken, "citations of missing docs sections:\n" + "\n".join(sorted(set(broken)))


def test_no_file_cites_a_document_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path, text in _texts()
        for m in _OUTSIDE.finditer(text)
    ]
    assert not hits, "cite docs/<file>.md §N instead:\n" + "\n".join(hits)


def test_the_heading_scan_finds_the_design_sections() -> None:
    # A guard for the scans above: a heading format they cannot read would pass them all.
    headings = set(_HEADING.findall((DOCS / "design.md").read_text(encoding="utf-8")))
    assert {"1", "3", "3.12", "5.5"} <= headings
