"""What a task's schema holds at a key path of a raw config (``("data", "test")``): the annotation there
(``annotation_at``), the keys it takes (``known_keys``, to suggest one for a misspelt key), and whether it is a
mapping of named entries that a ``null`` removes one of (``named_entries``). For the loader and its errors,
which work on raw dicts before validation.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel

from sanlab.config.task_configs import TASKS
from sanlab.errors import ConfigError


def known_keys(raw: dict, section: tuple) -> list[str]:
    """The keys the schema of ``raw``'s task takes in the mapping at ``section`` (a key path, ``error_paths``), for
    suggesting one for an unknown key; empty where the schema there is not a model's."""
    try:
        kind = TASKS.entry(raw["task"]).config
    except (ConfigError, KeyError, TypeError):
        return []
    for part in section:
        kind = next((child for branch in _branches(kind) if (child := annotation_at(branch, part)) is not None), None)
    return sorted({name for branch in _branches(kind) if isinstance(branch, type) and issubclass(branch, BaseModel)
                   for name in branch.model_fields})


def _branches(kind: object) -> list:
    """The types a field's annotation allows: itself, or each member of a union, without ``Annotated``."""
    if get_origin(kind) is Annotated:
        return _branches(get_args(kind)[0])
    if get_origin(kind) in (Union, types.UnionType):
        return [b for member in get_args(kind) for b in _branches(member)]
    return [kind]


def annotation_at(kind: object, part: str | int) -> object | None:
    """The annotation of the key or item ``part`` of a value of type ``kind`` (None: it has none)."""
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        field = kind.model_fields.get(part) if isinstance(part, str) else None
        return field.annotation if field else None
    args = get_args(kind)
    if get_origin(kind) is dict and isinstance(part, str):
        return args[1]
    if get_origin(kind) is list and isinstance(part, int):
        return args[0]
    if get_origin(kind) is tuple and isinstance(part, int):
        return args[0] if len(args) == 2 and args[1] is Ellipsis else args[part] if part < len(args) else None
    return None

def named_entries(task: object) -> Callable[[tuple[str, ...]], bool]:
    """Whether the mapping at a key path of ``task``'s config holds named entries (a ``dict`` in the schema:
    ``data.test``'s test sets), whose entries a ``null`` removes in a file over its base, ``--set`` and a grid's
    ``set:`` (``config_yaml.merge_mapping``); everywhere else null is the value null (everywhere, for an unknown
    task)."""
    try:
        schema = TASKS.entry(task).config if isinstance(task, str) else None
    except ConfigError:
        schema = None

    def named(path: tuple[str, ...]) -> bool:
        kind = schema
        for part in path:
            part = int(part) if part.isdigit() and any(get_origin(b) in (list, tuple) for b in _branches(kind)) \
                else part
            kind = next((child for branch in _branches(kind) if (child := annotation_at(branch, part)) is not None),
                        None)
        return kind is not None and any(get_origin(branch) is dict for branch in _branches(kind))

    return named
