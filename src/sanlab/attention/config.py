"""Config of one attention module: heads, dropout, plan, and the list of parts (by ``type``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, SerializeAsAny

from sanlab.attention.registry import PARTS, PartConfig
from sanlab.registry import STRICT_SCHEMA

PartSpec = Annotated[SerializeAsAny[PartConfig], BeforeValidator(PARTS.parse)]  # the class its ``type`` names


class AttentionConfig(BaseModel):
    """One attention module. ``parts`` are applied in every layer their ``layers`` field selects."""

    model_config = STRICT_SCHEMA
    heads: int = Field(8, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)  # on attention probabilities
    bias: bool = True             # biases of the q/k/v/output projections
    out_proj: bool = True         # Dufter et al.'s SAN has no output projection
    plan: Literal["auto", "dense", "sdpa", "banded", "flex"] = "auto"
    parts: list[PartSpec] = []
