"""Config of Rel_Pos (``type: rel_pos``), torch-free; the part and its builder are in ``rel_pos.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sanlab.attention.registry import PartConfig


class RelPosConfig(PartConfig):
    """Shaw et al.'s relative positions, in every layer of the stack it is listed in by default.

    ``cross``: allow use in encoder-decoder attention, with the offset j - i of source position j and
    target position i as in self-attention (cross use follows the CSAN reference code; not in Shaw et
    al.; the table is learned, so the sign only names its rows). List the part in
    ``cross_attention.parts`` and set this to true.
    """

    type: Literal["rel_pos"] = "rel_pos"
    builder = "sanlab.attention.parts.rel_pos:build_rel_pos"
    max_distance: int = Field(16, ge=0)   # clipping distance k (Shaw's MT setting)
    cross: bool = False

    @classmethod
    def examples(cls) -> list["RelPosConfig"]:
        return [cls(max_distance=2), cls(max_distance=0), cls(max_distance=2, cross=True)]
