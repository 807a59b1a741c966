"""Configs of the direct position interactions (``type: abs_position``, ``rel_position``), torch-free; the
parts and their builders are in ``position_interaction.py``."""

from __future__ import annotations

from typing import Literal

from sanlab.attention.registry import PartConfig


class AbsPositionConfig(PartConfig):
    """SAN+P: a learned t x t matrix per head added to the logits (first layer only, as in the paper)."""

    type: Literal["abs_position"] = "abs_position"
    builder = "sanlab.attention.parts.position_interaction:build_abs_position"
    layers: list[int] | None = [0]


class RelPositionConfig(PartConfig):
    """SAN+R: a learned vector of 2t offsets per head added to the logits (first layer only)."""

    type: Literal["rel_position"] = "rel_position"
    builder = "sanlab.attention.parts.position_interaction:build_rel_position"
    layers: list[int] | None = [0]
    rel_param: Literal["paper", "circulant_real"] = "paper"

    @classmethod
    def examples(cls) -> list["RelPositionConfig"]:
        return [cls(rel_param="paper"), cls(rel_param="circulant_real")]
