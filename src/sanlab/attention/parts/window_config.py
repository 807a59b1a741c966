"""Config of 1D-CSAN (``type: window``), torch-free; the part and its builder are in ``window.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from sanlab.attention.registry import PartConfig

DEFAULT_SIZE = 11  # M = 11 was best for 1D-CSAN (Figure 2 of both papers)


class WindowConfig(PartConfig):
    """1D-CSAN window. Give ``size`` (M, odd: the window holds M keys) or ``half_width`` (m); default M = 11."""

    type: Literal["window"] = "window"
    builder = "sanlab.attention.parts.window:build_window"
    # The papers localise the lowest 3 of 6 encoder layers (upper layers stay global); `layers: null` = all.
    layers: list[int] | None = [0, 1, 2]
    size: int | None = None
    half_width: int | None = None
    causal_window: Literal["half", "full"] = "half"  # decoder only: [i-m, i] or [i-2m, i]

    @field_validator("size")
    @classmethod
    def _odd_size(cls, size: int | None) -> int | None:
        # An even M is ambiguous between the two papers (M-1 or M+1 keys); spec A.1 accepts odd M only.
        if size is not None and (size < 1 or size % 2 == 0):
            raise ValueError(f"window size M must be odd and >= 1 (M = 2m+1 keys), got {size}; "
                             f"or give half_width m instead")
        return size

    @field_validator("half_width")
    @classmethod
    def _non_negative(cls, half_width: int | None) -> int | None:
        if half_width is not None and half_width < 0:
            raise ValueError(f"window half_width m must be >= 0, got {half_width}")
        return half_width

    @model_validator(mode="after")
    def _consistent(self):
        if self.size is not None and self.half_width is not None and self.size != 2 * self.half_width + 1:
            raise ValueError(f"window size {self.size} and half_width {self.half_width} disagree "
                             f"(size must be 2*half_width+1 = {2 * self.half_width + 1}); give only one")
        return self

    @property
    def m(self) -> int:
        """Half-width m = floor((M-1)/2)."""
        if self.half_width is not None:
            return self.half_width
        return ((self.size or DEFAULT_SIZE) - 1) // 2

    @property
    def window_size(self) -> int:
        """M = 2m + 1 keys, however it was given (size, half_width or the default): what a sweep plots."""
        return 2 * self.m + 1

    @classmethod
    def examples(cls) -> list["WindowConfig"]:
        return [cls(size=3), cls(size=5, causal_window="full")]
