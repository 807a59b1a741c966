"""Config of Bi_Direct (``type: bi_direct``), torch-free; the part and its builder are in ``directional.py``."""

from __future__ import annotations

from typing import Literal

from sanlab.attention.registry import PartConfig


class BiDirectConfig(PartConfig):
    """``pairs``: number H_di of (forward, backward) head pairs; ``all`` = H/2 (every head directional)."""

    type: Literal["bi_direct"] = "bi_direct"
    builder = "sanlab.attention.parts.directional:build_bi_direct"
    layers: list[int] | None = [0, 1, 2]
    pairs: int | Literal["all"] = "all"

    @classmethod
    def examples(cls) -> list["BiDirectConfig"]:
        return [cls(layers=None), cls(layers=None, pairs=1)]
