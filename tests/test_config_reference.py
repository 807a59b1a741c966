"""docs/config.md names every key of the config schema with its default, and no key the schema does not have:
the reference is checked against ``sanlab.config``, so a new key, a renamed one or a changed default fails here
until the page says so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel

from sanlab.attention.config import AttentionConfig
from sanlab.config import (
    DecodeConfig, Seq2SeqConfig, TaggerConfig, TaggerTrainConfig, TaggingDataConfig, TrainConfig,
    TranslationDataConfig, parse_value,
)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"
REQUIRED = object()  # the default of a key that has none
LEAVES = {"mixer"}  # registry-typed keys: their own keys are in docs/variants.md
# section heading -> (prefix, the schema of each default column)
SECTIONS = {
    "data (translation)": ("data.", [TranslationDataConfig]),
    "data (tagging)": ("data.", [TaggingDataConfig]),
    "model (translation)": ("model.", [Seq2SeqConfig]),
    "model (tagging)": ("model.", [TaggerConfig]),
    "train": ("train.", [TrainConfig, TaggerTrainConfig]),
    "decode": ("decode.", [DecodeConfig]),
}


def schema_keys(model: type[BaseModel], prefix: str) -> dict[str, object]:
    """Every dotted key under ``model`` with its default (``REQUIRED`` for a required one)."""
    keys = {}
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True) if not field.is_required() else REQUIRED
        if isinstance(default, BaseModel) and name not in LEAVES:
            keys.update(schema_keys(type(default), f"{prefix}{name}."))
        else:
            keys[prefix + name] = default
    return keys



def page_rows() -> dict[str, dict[str, list[str]]]:
    """Section heading -> key -> its default cells, from the page's tables."""
    sections, current = {}, None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), {})
        elif current is not None and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            key = cells[0].strip("`")
            assert key not in current, f"docs/config.md: {key} twice under one heading"
            current[key] = cells[1:-1]
    return sections


def _side(key: str) -> str:
    """The translation model's decoder takes the encoder's keys: the page lists them once."""
    return key.replace("model.decoder.", "model.encoder.")


def _value(cell: str, default: object) -> object:
    if cell == "required":
        return REQUIRED
    value = parse_value(re.fullmatch(r"`(.*)`", cell).group(1))
    if isinstance(default, BaseModel):  # a registry entry: the page names its type
        return value if value != default.type else default
    return value


def _normal(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_the_config_reference_names_every_key_with_its_default(heading):
    prefix, schemas = SECTIONS[heading]
    rows = page_rows().get(heading)
    assert rows is not None, f"docs/config.md has no section '## {heading}'"
    expected = [schema_keys(schema, prefix) for schema in schemas]
    keys, documented = {_side(k) for k in expected[0]}, {_side(k) for k in rows}
    assert not keys - documented, f"docs/config.md, {heading}: keys not documented: {sorted(keys - documented)}"
    assert not documented - keys, f"docs/config.md, {heading}: keys the schema lacks: {sorted(documented - keys)}"
    for key, cells in rows.items():
        assert len(cells) == len(schemas), f"docs/config.md, {key}: {len(cells)} default column(s), not {len(schemas)}"
        for cell, defaults in zip(cells, expected):
            default = defaults[key]
            assert _normal(_value(cell, default)) == _normal(default), \
                f"docs/config.md, {key}: the page says {cell}, the schema's default is {default!r}"


def _models(annotation: object) -> list[type[BaseModel]]:
    """The models a field's annotation holds: itself, a union's members, a list's or a mapping's items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models(arg)]


def mapping_keys(model: type[BaseModel], prefix: str) -> dict[str, set[str]]:
    """Every dotted key that ``schema_keys`` lists as one row although its value is a mapping of keys of its own
    (``data.train``'s src, tgt and weight; a part's type and layers), with those keys."""
    keys = {}
    for name, field in model.model_fields.items():
        default = field.get_default(call_default_factory=True) if not field.is_required() else REQUIRED
        if isinstance(default, BaseModel) and name not in LEAVES:
            keys.update(mapping_keys(type(default), f"{prefix}{name}."))
        elif inner := _models(field.annotation):
            keys[prefix + name] = {k for m in inner for k in m.model_fields}
    return keys


@pytest.mark.parametrize("heading", [h for h, (prefix, schemas) in sorted(SECTIONS.items())
                                     if mapping_keys(schemas[0], prefix)])
def test_a_key_that_takes_a_mapping_names_its_keys(heading):
    """The table gives such a key one row (``schema_keys``), so a key added inside it (a corpus's ``weight``) was
    not checked: the row's meaning must name each, in backticks (``src``, ``{src: FILE``, ``layers: [...]``),
    or say it takes the keys of ``attention`` (cross-attention) or that the key is refused; a tagging row that is
    "as for translation" is held to the translation row."""
    prefix, (schema, *_) = SECTIONS[heading]
    meanings = {_side(key): cells[-1] for key, cells in _full_rows(heading).items()}
    checked = 0
    for key, inner in mapping_keys(schema, prefix).items():
        meaning = meanings[_side(key)]
        if meaning.startswith("as for translation"):
            meaning = _full_rows(heading.replace("tagging", "translation"))[_side(key)][-1]
        if meaning.startswith("refused") or (inner <= set(AttentionConfig.model_fields) and "`attention`" in meaning):
            continue
        named = {k for k in inner if re.search(rf"`(?:[^`]*[{{,]\s*)?{k}\b", meaning)}
        assert named == inner, f"docs/config.md, {key}: its meaning does not name {sorted(inner - named)}"
        checked += 1
    assert checked, f"docs/config.md, {heading}: no key that takes a mapping was checked"


def _full_rows(heading: str) -> dict[str, list[str]]:
    """Key -> every cell after the key (the defaults and the meaning) of the section's table."""
    rows, current = {}, None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
        elif current == heading and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _commands():
    """(command name, its parser) of every ``sanlab`` command, and of every ``sanlab analyze`` analysis."""
    import argparse

    from sanlab.cli import _parser

    def subcommands(parser):
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return action.choices.items()

    for name, parser in subcommands(_parser()):
        if name == "analyze":
            yield from ((f"analyze {n}", p) for n, p in subcommands(parser))
        else:
            yield name, parser


def _options(parser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]


@pytest.mark.parametrize("name,parser", list(_commands()), ids=lambda x: x if isinstance(x, str) else "")
def test_every_command_line_option_is_documented(name, parser):
    """docs/config.md's command table names each option of its commands; compare's are in docs/compare.md and
    the analyses' in docs/analysis.md."""
    docs = PAGE.parent
    if name == "compare" or name.startswith("analyze "):
        where = docs / ("compare.md" if name == "compare" else "analysis.md")
        text = where.read_text(encoding="utf-8")
    else:
        where = PAGE
        rows = [line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith(f"| `sanlab {name} ")
                or line.startswith(f"| `sanlab {name}`")]
        assert len(rows) == 1, f"docs/config.md: no row (or several) for `sanlab {name}` in the command table"
        text = rows[0]
    missing = [o for o in _options(parser) if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)]
    assert not missing, f"{where.name}: `sanlab {name}` options not documented: {missing}"


def test_the_config_keys_the_command_line_help_names_exist():
    """An option's help that points at a config key (``decode.beam``, ``train.device``) names a key of the schema,
    which ``--set`` and a config file take; a key inside a list of attention parts (``parts.0.window_size``) is
    the part's own, documented in docs/variants.md, and not checked here."""
    known = {key for prefix, schemas in SECTIONS.values() for schema in schemas for key in schema_keys(schema, prefix)}
    named = {(name, key) for name, parser in _commands() for action in parser._actions
             for key in re.findall(r"\b(?:data|model|train|decode)\.[A-Za-z_][\w.]*\b", action.help or "")
             if not re.search(r"\.\d+\.", key)}
    unknown = sorted((name, key) for name, key in named if key not in known)
    assert named and not unknown, f"help texts name config keys the schema lacks: {unknown}"
