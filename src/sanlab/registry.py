"""The registry kernel: what attention parts, mixers and pre-blocks have in common, and how they are found.

A registry maps a config ``type`` name to a config class (pydantic, torch-free), and the config class names
its builder (``builder = "module:function"``, the function that imports torch and makes the module).
Entries are references ``"module:ConfigClass"``, found in two places, the same way:

* sanlab's own entries: the table each registry is created with (``attention/registry.py``,
  ``layers/mixers.py``, ``layers/pre_blocks.py``);
* a researcher's package: the Python entry point group the registry names (``sanlab.parts``,
  ``sanlab.mixers``, ``sanlab.pre_blocks``), ``name = "module:ConfigClass"`` in its ``pyproject.toml``.

Tasks are found the same way (``TaskRegistry``, the group ``sanlab.tasks``): a task name maps to the run's
config class, which names the task's implementation (``implementation = "module:TaskClass"``, ``docs/tasks.md``).

Nothing is imported before it is used: parsing a config imports the config classes it names, building
a model imports their builders. So the schema (``sanlab.config``) validates without torch.
``docs/variants.md`` ("Adding a variant") shows a plug-in end to end.
"""

from __future__ import annotations

import difflib
import importlib
import json
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from sanlab.errors import ConfigError

# Every config schema: unknown keys and non-finite numbers (.inf, .nan in YAML) are errors, and so is an
# assignment that breaks a field's type or bounds.
STRICT_SCHEMA = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def rule_words(error: dict) -> str:
    """A pydantic error's message without the "Value error, " pydantic puts before a validator's own words."""
    return error["msg"].removeprefix("Value error, ")


def error_paths(err: ValidationError, data: object, *, root_tag: str | None = None) -> list[tuple[tuple, dict]]:
    """``(key path, error)`` for pydantic's errors about ``data``: each location in ``data``'s own keys, without
    the tags pydantic gives a union's branches (``ParallelFiles``, ``list[WeightedFiles]``, ``constrained-float``),
    and without ``root_tag``, a discriminated union's tag, where the location starts with it. A branch's refusal
    of the value's type (its location ends in its tag: "a valid array") is left out when another branch took the
    value and names what is wrong inside it; with none inside, each branch's refusal stays, saying what it may be."""
    found = []
    for e in err.errors():
        loc = e["loc"][1:] if root_tag is not None and e["loc"][:1] == (root_tag,) else e["loc"]
        found.append((*_key_path(loc, data, missing=e["type"] == "missing"), e))
    return [(path, e) for path, tagged, e in found
            if not (tagged and any(len(other) > len(path) and other[:len(path)] == path for other, _, _ in found))]


def _key_path(loc: tuple, data: object, *, missing: bool) -> tuple[tuple, bool]:
    """The elements of ``loc`` that are keys of ``data`` (or list indices), and whether ``loc`` ended in one that
    is not (a union branch's tag). A required key (``missing``) ends the path although ``data`` lacks it."""
    path, node, tagged = [], data, False
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (missing and i == len(loc) - 1):
            tagged = i == len(loc) - 1
            continue
        path.append(part)
    return tuple(path), tagged


def did_you_mean(name: str, known) -> str:
    """`` (did you mean lr?)`` for an unknown key ``name``, naming the ``known`` keys that are spelt much like it;
    empty if none is."""
    close = difflib.get_close_matches(name, list(known), n=2)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


class ComponentConfig(BaseModel):
    """Base of the config of everything a registry builds (an attention part, a mixer, a pre-block).

    ``type`` is its registry name (a ``Literal`` default in each subclass); ``layers``: which layer indices
    of the stack get it (None = every layer); ``builder``: ``"module:function"`` that turns the config
    into its module, declared by every registered class itself (a subclass does not inherit it).
    """

    model_config = STRICT_SCHEMA
    type: str
    layers: list[int] | None = None
    builder: ClassVar[str]

    def applies_to(self, layer_index: int) -> bool:
        return self.layers is None or layer_index in self.layers

    @classmethod
    def examples(cls) -> list["ComponentConfig"]:
        """Representative configurations the contract tests build (default: the defaults)."""
        return [cls()]


@dataclass(frozen=True)
class BuildContext:
    """What a builder may know about the place its module goes."""

    dim: int            # model width of the attention (h*d)
    heads: int
    layer_index: int    # 0-based index in its stack
    num_layers: int
    side: str           # "encoder", "decoder" (self-attention) or "cross"
    max_len: int        # longest sequence the model is configured for

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def causal(self) -> bool:
        return self.side == "decoder"


def load_reference(reference: str) -> object:
    """The object a ``"package.module:name"`` reference (an entry point's value) names, imported now."""
    module, _, name = reference.partition(":")
    target = importlib.import_module(module)
    for attr in filter(None, name.split(".")):
        target = getattr(target, attr)
    return target


@dataclass(frozen=True)
class Entry:
    """A loaded registry entry: its config class; ``build`` imports the builder the class names."""

    config: type[ComponentConfig]

    @property
    def build(self) -> Callable:
        return load_reference(self.config.builder)


class Registry:
    """Maps a ``type`` name to its config class and builder: sanlab's ``builtin`` table plus the entry
    point ``group`` of installed packages, read on first use. One instance each for parts, mixers and
    pre-blocks."""

    def __init__(self, kind: str, *, group: str, builtin: dict[str, str]):
        self.kind, self.group = kind, group
        self._builtin = dict(builtin)
        self._references: dict[str, str] | None = None  # name -> "module:ConfigClass", once discovered
        self._entries: dict[str, Entry] = {}            # the ones loaded so far

    def references(self) -> dict[str, str]:
        """Every known name and the reference of its config class (built-ins, then entry points)."""
        if self._references is None:
            found = dict(self._builtin)
            for point in entry_points(group=self.group):
                if found.get(point.name, point.value) != point.value:
                    raise ConfigError(f"{self.kind} {point.name!r} is registered twice: {found[point.name]} and "
                                      f"{point.value} (entry point group {self.group})")
                found[point.name] = point.value
            self._references = found
        return self._references

    def register(self, config_cls: type[ComponentConfig]) -> type[ComponentConfig]:
        """Add a config class that is already imported (a test's own entry); usable as a class decorator."""
        name = self._name_of(config_cls)
        self._checked(config_cls, name)
        if name in self.references():
            raise ConfigError(f"{self.kind} {name!r} is registered twice")
        self._references[name] = f"{config_cls.__module__}:{config_cls.__qualname__}"
        self._entries[name] = Entry(config_cls)
        return config_cls

    def _name_of(self, config_cls: type[BaseModel]) -> str:
        return config_cls.model_fields["type"].default

    def names(self) -> list[str]:
        return sorted(self.references())

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            references = self.references()
            if name not in references:
                raise ConfigError(f"unknown {self.kind} type {name!r}; known: {', '.join(self.names())}")
            try:
                config_cls = load_reference(references[name])
            except (ImportError, AttributeError) as err:
                raise ConfigError(f"{self.kind} {name!r}: cannot load {references[name]}: {err}") from err
            self._checked(config_cls, name)
            self._entries[name] = Entry(config_cls)
        return self._entries[name]

    def _checked(self, config_cls: object, name: str) -> None:
        where = f"{self.kind} {name!r} ({getattr(config_cls, '__qualname__', config_cls)})"
        if not (isinstance(config_cls, type) and issubclass(config_cls, ComponentConfig)):
            raise ConfigError(f"{where}: a registry entry must be a ComponentConfig subclass")
        if config_cls.model_fields["type"].default != name:
            raise ConfigError(f"{where}: its type default {config_cls.model_fields['type'].default!r} must be "
                              f"the name it is registered under")
        if "builder" not in vars(config_cls):
            raise ConfigError(f"{where}: declares no builder = \"module:function\" of its own")

    def parse(self, value: object) -> BaseModel:
        """Validate a raw dict (from YAML) into the config class its ``type`` names."""
        if isinstance(value, BaseModel):
            return value
        if not isinstance(value, dict) or not isinstance(value.get("type"), str):  # (a list would not even hash)
            article = "an" if self.kind[:1] in "aeiou" else "a"
            raise ValueError(f"{article} {self.kind} needs a 'type' (one of: {', '.join(self.names())}); got {value!r}")
        try:
            cls = self.entry(value["type"]).config
        except ConfigError as err:
            raise ValueError(str(err)) from None
        try:  # strict through JSON, as the run config (sanlab.config.validate): a quoted "11" is refused here too
            return cls.model_validate_json(json.dumps(value, default=str), strict=True)
        except ValidationError as err:  # re-raised plainly so the outer model reports the full path
            problems = "; ".join(f"{'.'.join(map(str, path)) or '<value>'}: {rule_words(e)}"
                                 + (did_you_mean(str(path[-1]), cls.model_fields) if e["type"] == "extra_forbidden"
                                    else "") for path, e in error_paths(err, value))
            raise ValueError(f"{self.kind} {value['type']!r}: {problems}") from None

    def build(self, config: ComponentConfig, ctx: BuildContext, **kwargs):
        return self.entry(config.type).build(config, ctx, **kwargs)


class TaskRegistry(Registry):
    """Maps a config's ``task:`` name to its config class (torch-free), which names the task's implementation
    (``implementation = "module:TaskClass"``, a ``sanlab.tasks.Task``). sanlab's ``builtin`` table (translation,
    tagging: ``sanlab/config/task_configs.py``) plus the entry point group ``sanlab.tasks`` of installed packages."""

    def _name_of(self, config_cls: type[BaseModel]) -> str | None:
        return task_name(config_cls)

    def config_classes(self) -> list[type[BaseModel]]:
        """Every registered task's config class, built-ins first (imports the plug-ins' torch-free configs)."""
        return [self.entry(name).config for name in self.references()]

    def _checked(self, config_cls: object, name: str) -> None:
        where = f"{self.kind} {name!r} ({getattr(config_cls, '__qualname__', config_cls)})"
        if not (isinstance(config_cls, type) and issubclass(config_cls, BaseModel) and "task" in config_cls.model_fields):
            raise ConfigError(f"{where}: a task's config must be a pydantic model with a task field")
        if task_name(config_cls) != name:
            raise ConfigError(f"{where}: its task Literal {task_name(config_cls)!r} must be the name it is "
                              "registered under")
        if not isinstance(getattr(config_cls, "implementation", None), str):
            raise ConfigError(f"{where}: declares no implementation = \"module:TaskClass\"")


def task_name(config_cls: type[BaseModel]) -> str | None:
    """The name in a task config's ``task: Literal["name"]``."""
    import typing

    args = typing.get_args(config_cls.model_fields["task"].annotation) if "task" in config_cls.model_fields else ()
    return args[0] if len(args) == 1 else None
