"""The one registry of attention parts: config ``type`` name -> (config class, builder).

A new variant is one module with a config class and a builder, registered with
``@PARTS.register(MyConfig)``, in ``sanlab/attention/parts/`` (which imports every module in it).
The config schema, the builders and the contract tests all read this registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from sanlab.errors import ConfigError

# Every config schema: unknown keys and non-finite numbers (.inf, .nan in YAML) are errors, and so is an
# assignment that breaks a field's type or bounds.
STRICT_SCHEMA = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class PartConfig(BaseModel):
    """Base of every attention part config. ``layers``: which layer indices get the part
    (None = every layer of the stack it is listed in)."""

    model_config = STRICT_SCHEMA
    type: str
    layers: list[int] | None = None

    def applies_to(self, layer_index: int) -> bool:
        return self.layers is None or layer_index in self.layers

    @classmethod
    def examples(cls) -> list["PartConfig"]:
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


C = TypeVar("C", bound=BaseModel)


@dataclass(frozen=True)
class Entry(Generic[C]):
    config: type[C]
    build: Callable


class Registry:
    """Maps a ``type`` name to its config class and builder. Used for parts and for mixers."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, config_cls: type[C]) -> Callable[[Callable], Callable]:
        name = config_cls.model_fields["type"].default
        if not isinstance(name, str):
            raise TypeError(f"{config_cls.__name__}.type needs a string default (its registry name)")

        def decorator(build: Callable) -> Callable:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = Entry(config_cls, build)
            return build

        return decorator

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str) -> Entry:
        if name not in self._entries:
            raise ConfigError(f"unknown {self.kind} type {name!r}; known: {', '.join(self.names())}")
        return self._entries[name]

    def parse(self, value: object) -> BaseModel:
        """Validate a raw dict (from YAML) into the config class its ``type`` names."""
        if isinstance(value, BaseModel):
            return value
        if not isinstance(value, dict) or "type" not in value:
            raise ValueError(f"a {self.kind} needs a 'type' (one of: {', '.join(self.names())}); got {value!r}")
        try:
            cls = self.entry(value["type"]).config
        except ConfigError as err:
            raise ValueError(str(err)) from None
        try:
            return cls.model_validate(value)
        except ValidationError as err:  # re-raised plainly so the outer model reports the full path
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<value>'}: {e['msg']}" for e in err.errors())
            raise ValueError(f"{self.kind} {value['type']!r}: {problems}") from None

    def build(self, config: BaseModel, ctx: BuildContext, **kwargs):
        return self.entry(config.type).build(config, ctx, **kwargs)


PARTS = Registry("attention part")
