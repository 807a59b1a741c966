"""Validating a raw config dict into its task's config (``validate``): keys renamed since old run directories
were written are migrated first (``_migrated``), and every error is one line naming the key, what is wrong and
where it was set, in the words of a YAML file's author rather than pydantic's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Union

import yaml
from pydantic import Field, TypeAdapter, ValidationError

from sanlab.config.key_paths import known_keys
from sanlab.config.task_configs import TASKS, TaskConfig
from sanlab.config_yaml import parse_value, unsupported_values
from sanlab.errors import ConfigError
from sanlab.registry import did_you_mean, error_paths, rule_words

# one TypeAdapter per set of registered tasks (a plug-in's registration adds one)
_ADAPTERS: dict[tuple, TypeAdapter] = {}


def _adapter() -> TypeAdapter:
    """The schema of a run config: the config class of every registered task, told apart by ``task``."""
    classes = tuple(TASKS.config_classes())
    if classes not in _ADAPTERS:
        union = Union[classes] if len(classes) > 1 else classes[0]
        _ADAPTERS[classes] = TypeAdapter(Annotated[union, Field(discriminator="task")])
    return _ADAPTERS[classes]


def validate(raw: dict, *, source: str, origin: Callable[[str], str | None] | None = None) -> TaskConfig:
    """Validate a raw dict; errors name each offending key and the source (``origin``: where a dotted key was
    set, e.g. "line 4" or "set in base.yaml, line 7", ``load_config``)."""
    if isinstance(raw, dict) and "task" not in raw:  # (pydantic's words: "unable to extract tag using discriminator")
        found = f"its keys: {', '.join(map(str, raw))}" if raw else "it is empty"
        raise ConfigError(f"{source}: no `task:` ({' or '.join(TASKS.references())}), which says what the config "
                          f"trains; {found}")
    raw = _migrated(raw, source=source)

    def line(shown: str, msg: str, key: str, named: list[str] = ()) -> str:
        """One problem, shown at ``shown``; where the first key of ``named`` that has an origin was set, else
        where ``key`` was."""
        where = next((w for k in (*named, key) if k and (w := origin(k))), None) if origin else None
        return f"  {shown or '<root>'}: {msg}" + (f" ({where})" if where else "")

    unsupported = unsupported_values(raw)  # before JSON, which would respell them (a date) or rename them (no: "false")
    if unsupported:
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(line(shown, msg, key)
                                                                   for key, shown, msg in unsupported))
    try:
        # strict, through JSON: a quoted "0.1" or "no" in YAML is a string, refused where a number or a bool
        # belongs (lax mode would convert it); JSON lists still fill tuples, numbers from --set stay typed
        return _adapter().validate_json(json.dumps(raw, default=str), strict=True)
    except ValidationError as err:
        lines = []
        task = raw.get("task") if isinstance(raw, dict) else None  # loc[0]: the task name that picked the schema
        for path, e in error_paths(err, raw, root_tag=task):
            loc = ".".join(map(str, path))
            # a rule's own words, without pydantic's "Value error, " before them (decode.py drops it too)
            msg = "unknown key" if e["type"] == "extra_forbidden" else rule_words(e)
            if e["type"] == "extra_forbidden":
                msg += did_you_mean(str(path[-1]), known_keys(raw, path[:-1]))
            if e["type"] == "union_tag_invalid" and not path:  # pydantic's words for an unknown `task:`
                loc, tag = "task", e["ctx"]["tag"]
                msg = f"unknown task {tag!r} (known: {', '.join(TASKS.references())})" + did_you_mean(tag, TASKS.names())
            if e["type"] in ("float_type", "int_type", "bool_type") and _typed_text(e["input"]):
                msg += " (a quoted value is a string in YAML: write it without quotes)"
            empty = e["type"] in ("model_type", "dict_type") and e["input"] is None  # `train:` with nothing under it
            if empty:  # a file's `train:` with nothing under it, or an override's null (--set data.test=null)
                overridden = origin is not None and (origin(loc) or "").startswith("from ")
                msg = ("null where a section belongs: give it keys, or {} to empty it" if overridden else
                       "an empty section (every key under it commented out?): give it keys or {}, or remove the line")
            shown = e["type"] != "extra_forbidden" and not isinstance(e["input"], dict) and not empty
            msg += f" (got {e['input']!r})" if shown else ""
            if e["type"] in ("int_type", "int_from_float") and isinstance(e["input"], float) and e["input"].is_integer():
                msg += (": a number with an exponent or a decimal point (1e5, 100000.0) is a float in YAML; write it as a "
                        f"whole number ({int(e['input'])})")
            if e["type"] == "string_type" and isinstance(e["input"], (bool, int, float)):  # `src: on` is True
                msg += (": YAML reads an unquoted on, off, yes, no, true or false as a boolean"
                        if isinstance(e["input"], bool) else ": YAML reads it as a number") + ": write text in quotes"
            lines.append(line(loc, msg, loc, _named_keys(e, loc, raw)))
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(lines)) from None


def _named_keys(error: dict, loc: str, raw: dict) -> list[str]:
    """The dotted keys under ``loc`` that a rule's message names (``train.betas is ...`` at ``train``, ``data.max_len
    ... exceeds model.max_positions`` at the root): the rule is a section's, and the line to show is theirs."""
    if error["type"] != "value_error":
        return []
    named = re.findall(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+)+", error["msg"])
    if loc:
        return [k for k in named if k.startswith(loc + ".")]
    return [k for k in named if k.split(".")[0] in raw]


def _migrated(raw: dict, *, source: str) -> dict:
    """Keys renamed since a run directory was written, in today's spelling: ``train.bf16: true`` is
    ``train.precision: bf16`` (``bf16: false`` is the default fp32), so old runs resume unchanged."""
    train = raw.get("train") if isinstance(raw, dict) else None
    if not isinstance(train, dict) or "bf16" not in train:
        return raw
    train = dict(train)
    legacy = train.pop("bf16")
    if not isinstance(legacy, bool):
        raise ConfigError(f"{source}: train.bf16: expected true or false, got {legacy!r} (it is now train.precision: bf16)")
    if legacy and train.setdefault("precision", "bf16") != "bf16":
        raise ConfigError(f"{source}: train.bf16: true and train.precision: {train['precision']} disagree; give precision only")
    return {**raw, "train": train}


def _typed_text(value: object) -> bool:
    """Whether ``value`` is a string that YAML would read as a number or a bool without its quotes."""
    try:
        return isinstance(value, str) and isinstance(parse_value(value), (bool, int, float))
    except yaml.YAMLError:
        return False
