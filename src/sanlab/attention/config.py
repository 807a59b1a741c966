"""Config of one attention module: heads, dropout, plan, and the list of parts (by ``type``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, SerializeAsAny

from sanlab.attention.registry import PARTS, PartConfig


def _parse_part(value: object) -> PartConfig:
    import sanlab.attention.parts  # noqa: F401  (every part registers itself on import)

    return PARTS.parse(value)


PartSpec = Annotated[SerializeAsAny[PartConfig], BeforeValidator(_parse_part)]


class AttentionConfig(BaseModel):
    """One attention module. ``parts`` are applied in every layer their ``layers`` field selects."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    heads: int = 8
    dropout: float = 0.0          # on attention probabilities
    bias: bool = True             # biases of the q/k/v/output projections
    out_proj: bool = True         # Dufter et al.'s SAN has no output projection
    plan: Literal["auto", "dense", "sdpa", "banded"] = "auto"
    parts: list[PartSpec] = []
