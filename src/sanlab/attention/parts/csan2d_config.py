"""Config of 2D-CSAN (``type: csan2d``), torch-free; the part and its builder are in ``csan2d.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from sanlab.attention.parts.window_config import WindowConfig


class Csan2dConfig(WindowConfig):
    """2D-CSAN area: ``size`` M (or ``half_width`` m) positions x ``heads_area`` N (odd) heads."""

    type: Literal["csan2d"] = "csan2d"  # type: ignore[assignment]
    builder = "sanlab.attention.parts.csan2d:build_csan2d"
    heads_area: int = 3
    head_boundary: Literal["wrap", "clip", "reference"] = "wrap"

    @field_validator("heads_area")
    @classmethod
    def _odd_area(cls, heads_area: int) -> int:
        if heads_area < 1 or heads_area % 2 == 0:
            raise ValueError(f"heads_area N must be odd and >= 1 (heads h-n .. h+n), got {heads_area}")
        return heads_area

    @classmethod
    def examples(cls) -> list["Csan2dConfig"]:
        return [cls(size=3), cls(size=5, head_boundary="clip", causal_window="full"),
                cls(size=3, head_boundary="reference")]
