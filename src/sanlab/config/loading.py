"""A run config from its file (``load_config``): the ``base:`` chain merged, ``--set`` overrides applied (a
``null`` removing a named entry where the schema has them, ``named_entries``), then validated with each error
traced to the line, base file or ``--set`` that gave the key, and a note where ``--set X.type=...`` kept the
old type's keys (``_retyped``). And the way back: ``dump_config`` writes a config that loads to the same one.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel

from sanlab.config.inheritance import WRITTEN
from sanlab.config.key_paths import named_entries
from sanlab.config.task_configs import TaskConfig
from sanlab.config.validation import validate
from sanlab.config_yaml import (apply_override, assigned_keys, dump_yaml, format_value, key_line, key_origin,
                                load_chain, merge_chain, parse_value, sets_key)
from sanlab.errors import ConfigError


def chain_task(chain: list[tuple[Path, dict]]) -> object:
    """The ``task`` a ``load_chain`` gives: the file's own, else its nearest base's."""
    return next((own["task"] for _, own in chain if "task" in own), None)


def load_config(path: str | Path, overrides: list[str] = ()) -> TaskConfig:
    chain = load_chain(path)  # read once: merged here, and traced in errors
    raw = merge_chain(chain, named=named_entries(chain_task(chain)))
    retyped = []
    for assignment in overrides:
        retyped += _retyped(raw, assignment)
        apply_override(raw, assignment, named=named_entries(raw.get("task")))
    source = str(path) + (f" (with --set {' '.join(overrides)})" if overrides else "")
    overridden = assigned_keys(list(overrides))

    def origin(key: str) -> str | None:  # where the key was set: --set, or its line (and file if a base's)
        if sets_key(overridden, key):
            return "from --set"
        found = key_origin(chain, key)
        if found is None:
            return None
        line = key_line(found, key)
        at = f"line {line}" if line is not None else None
        if found == chain[0][0]:
            return at
        return f"set in {found}" + (f", {at}" if at else "")

    try:
        return validate(raw, source=source, origin=origin)
    except ConfigError as err:
        if not retyped:
            raise
        raise ConfigError(f"{err}\n" + "\n".join(retyped)) from None


def _retyped(raw: dict, assignment: str) -> list[str]:
    """A note for ``--set X.type=NEW`` where ``X`` is a component (a part, a mixer) of another type with keys of
    its own: the assignment changes the type only, so the old type's keys stay (window's ``size`` under capsule
    is "unknown"); the note says so and how to replace the whole entry. Empty otherwise."""
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    if parts[-1] != "type":
        return []
    node = raw
    for part in parts[:-1]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return []
    try:
        new = parse_value(text)
    except yaml.YAMLError:
        return []
    if not isinstance(node, dict) or not isinstance(node.get("type"), str) or node["type"] == new:
        return []
    kept = [k for k in node if k not in ("type", "layers")]
    if not kept:
        return []
    entry = ".".join(parts[:-1])
    layers = f", layers: {format_value(node['layers'])}" if node.get("layers") is not None else ""
    return [f"  note: --set {key.strip()}={text} changed the type of {entry} ({node['type']!r}) and kept its other "
            f"keys ({', '.join(map(str, kept))}); to replace the entry, give it whole: "
            f"--set '{entry}={{type: {new}{layers}}}'"]


def dump_config(config: BaseModel) -> str:
    """The config as YAML that ``load_config`` reads back to the same config (``dump_yaml``: a string the
    loader would read as a number or a bool is quoted), and to the same config under any ``--set``: a key a
    section inherits is left out (``WRITTEN``), so that it follows its source there as in the original file."""
    return dump_yaml(config.model_dump(mode="json", context={WRITTEN: True}))
