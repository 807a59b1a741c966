"""1D-CSAN: every query attends only to the keys inside a window of M = 2m+1 positions around it.

Yang, Wang, Wong, Chao, Tu, "Convolutional Self-Attention Network", arXiv 2018,
https://arxiv.org/abs/1810.13320, Eq. 4-5; NAACL 2019 version "Convolutional Self-Attention
Networks", https://arxiv.org/abs/1904.03107, Eq. 4-6.

    alpha_ij^h = exp(e_ij^h) / sum_{t in W(i)} exp(e_it^h),   y_i^h = sum_{j in W(i)} alpha_ij^h v_j^h
    W(i) = { j : |j - i| <= m, j a real (non-padding) key }

A mask part: out-of-range and padding keys are excluded from the softmax (spec A.1, as the
released code does), so the window is truncated at the sentence ends. No parameters.
Decoder use (spec A.7, not in the papers): ``causal_window: half`` keeps [i-m, i], ``full``
keeps [i-2m, i] so a decoder query sees as many keys as an encoder query.
The ``banded`` plan (``sanlab.attention.banded``) runs this part in O(I*M) through ``band_offsets``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator
from torch import Tensor

from sanlab.attention import masks
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.attention.registry import PARTS, BuildContext, PartConfig

DEFAULT_SIZE = 11  # M = 11 was best for 1D-CSAN (Figure 2 of both papers)


class WindowConfig(PartConfig):
    """1D-CSAN window. Give ``size`` (M, odd: the window holds M keys) or ``half_width`` (m); default M = 11."""

    type: Literal["window"] = "window"
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


def band_offsets(m: int, causal_window: str, *, causal: bool) -> tuple[int, int]:
    """(left, right): the keys q-left .. q+right that the window lets through.

    Under a causal mask the right side is cut to 0 and ``full`` doubles the left side.
    """
    if causal:
        return (2 * m if causal_window == "full" else m), 0
    return m, m


class WindowMask(AttentionPart):
    """Boolean band |j - i| <= m on absolute positions (ANDed with padding and causality)."""

    def __init__(self, *, half_width: int, causal_window: str = "half"):
        super().__init__()
        self.half_width, self.causal_window = half_width, causal_window

    def band_offsets(self, *, causal: bool) -> tuple[int, int]:
        return band_offsets(self.half_width, self.causal_window, causal=causal)

    def mask(self, ctx: AttentionContext) -> Tensor:
        left, right = self.band_offsets(causal=ctx.causal)
        return masks.band(ctx.q_pos, ctx.k_pos, left=left, right=right)  # [1, 1, i, j]

    def extra_repr(self) -> str:
        return f"half_width={self.half_width}, causal_window={self.causal_window!r}"


def refuse_cross_attention(name: str, ctx: BuildContext) -> None:
    """A window centred on the query's own position needs queries and keys on one time axis."""
    if ctx.side == "cross":
        raise ValueError(f"{name} windows are centred on the query's position in the same sequence; target and "
                         f"source positions are not aligned, so it is not defined for cross-attention "
                         f"(cross layer {ctx.layer_index}); list it under attention.parts, not cross_attention.parts")


@PARTS.register(WindowConfig)
def build_window(config: WindowConfig, ctx: BuildContext) -> WindowMask:
    refuse_cross_attention("1D-CSAN", ctx)
    return WindowMask(half_width=config.m, causal_window=config.causal_window)
