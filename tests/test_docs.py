"""The documentation names files that exist: every backticked repository path (src/, docs/, results/,
configs/, bench/, tests/) and every relative Markdown link in README.md, docs/ and results/."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*.md"))]
PATH = re.compile(r"`((?:src|docs|results|configs|bench|tests)/[^`\s*{}<>]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_files_exist(page):
    text = page.read_text(encoding="utf-8")
    named = {m.group(1).split("::")[0].rstrip(".,;:)") for m in PATH.finditer(text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    links = {m.group(1) for m in LINK.finditer(text) if not m.group(1).startswith(("http://", "https://"))}
    missing += sorted(f"link {p}" for p in links if not (page.parent / p).exists())
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"
