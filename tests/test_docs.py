"""The documentation names files that exist: every backticked repository path (src/, docs/, results/,
configs/, bench/, tests/) and every relative Markdown link in README.md, docs/ and results/; the commands and
options README.md and docs/ show are the CLI's, and the keys they say a resume may change are runs.RESUMABLE_KEYS."""

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


def _resume_comment(text: str) -> str:
    """The README's comment over `sanlab train` on what a resume may change (from "a changed config" to the data)."""
    start = text.index("a changed config is an error, except the keys docs/training.md lists")
    return " ".join(line.lstrip("# ") for line in text[start:text.index("--allow-changed-data", start)].splitlines())


# Each key a resume may change, as the README's summary of docs/training.md's list names it.
RESUME_WORDS = {"train.max_steps": "budget", "train.max_epochs": "budget", "train.patience": "patience",
                "train.progress": "logging", "train.log_every": "logging", "train.threads": "threads",
                "train.device": "device", "train.deterministic": "deterministic",
                "train.find_unused_parameters": "find_unused_parameters", "decode.beam": "beam",
                "decode.length_penalty": "length penalty", "decode.length_penalty_style": "length penalty",
                "decode.n_best": "n-best"}


def test_the_keys_a_resume_may_change_are_the_ones_the_docs_name():
    """runs.RESUMABLE_KEYS is listed whole in docs/training.md ("Resuming") and summarised in the README's
    comment over `sanlab train`: a key added to one and not the others would have a user told that changing it
    is an error, or the reverse."""
    from sanlab.runs import RESUMABLE_KEYS

    assert set(RESUME_WORDS) == set(RESUMABLE_KEYS), "RESUME_WORDS here lags runs.RESUMABLE_KEYS"
    training = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    sentence = training[training.index("Only `train.max_steps`"):]
    sentence = sentence[:sentence.index("may change on")]
    listed = {f"train.{k}" for k in re.findall(r"`(?:train\.)?(\w+)`", sentence.split("and `decode.")[0])}
    listed |= {f"decode.{k}" for k in re.findall(r"`decode\.(\w+)`", sentence)}
    assert listed == set(RESUMABLE_KEYS), f"docs/training.md lists {sorted(listed)} as resumable"
    comment = _resume_comment((ROOT / "README.md").read_text(encoding="utf-8"))
    missing = sorted(k for k, word in RESUME_WORDS.items() if word not in comment)
    assert not missing, f"README.md's comment over `sanlab train` leaves out {missing}: {comment!r}"


def _cli_options() -> dict[str, set[str]]:
    """{"train": {its options}, "analyze sweep": {...}, ...}: every (sub)command of `sanlab` and its options."""
    import argparse

    from sanlab.cli import _parser

    found = {}

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, f"{name} {sub}".strip())
        found[name] = {flag for action in parser._actions for flag in action.option_strings}

    walk(_parser(), "")
    return found


CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)
COMMAND = re.compile(r"(?<![\w/.-])sanlab ([a-z][a-z-]*)( [a-z][a-z-]*)?(.*)")


def _code(text: str):
    """The code of a page: each line of a fenced block, its comment cut off, and each inline code span."""
    for m in CODE.finditer(text):
        if m.group(1) is None:
            yield m.group(2)
        else:
            yield from (re.split(r"(?:^|\s)#", line)[0] for line in m.group(1).splitlines())


@pytest.mark.parametrize("page", [p for p in PAGES if p.parent != ROOT / "results"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_a_page_shows_are_the_clis(page):
    """Every `sanlab COMMAND --option` in the README's and docs' code is a command the CLI has, with that option
    (spelled as argparse takes it), so that a command copied from the page runs."""
    known, wrong = _cli_options(), []
    for code in _code(page.read_text(encoding="utf-8")):
        for m in COMMAND.finditer(code):
            command, sub, rest = m.group(1), (m.group(2) or "").strip(), m.group(3)
            if command not in known:
                wrong.append(f"sanlab {command} (no such command): {code}")
                continue
            if f"{command} {sub}" in known:
                command = f"{command} {sub}"
            elif any(k.startswith(f"{command} ") for k in known):
                continue  # `sanlab analyze <analysis> RUN... --out PREFIX`: no analysis named
            else:
                rest = f" {sub}{rest}"
            wrong += [f"sanlab {command} {option}: {code}" for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest)
                      if option not in known[command]]
    assert not wrong, f"{page.relative_to(ROOT)} shows commands the CLI does not take: {wrong}"
