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


def test_every_recipe_has_a_passing_smoke_row():
    """results/variant-smoke.md covers every recipe in configs/ (bench/variant_smoke.py --only <name> adds a
    missing row), and every row trained to finite values with a falling loss."""
    rows = {}
    for line in (ROOT / "results" / "variant-smoke.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].endswith(".yaml"):
            rows[cells[0]] = cells
    recipes = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    missing = [r for r in recipes if r not in rows]
    assert not missing, f"recipes without a smoke row (bench/variant_smoke.py --only <name>): {missing}"
    assert sorted(rows) == recipes, f"smoke rows for recipes that no longer exist: {sorted(set(rows) - set(recipes))}"
    failing = [name for name, cells in rows.items() if cells[4:6] != ["yes", "yes"]]
    assert not failing, f"smoke rows not finite or whose loss did not fall: {failing}"
