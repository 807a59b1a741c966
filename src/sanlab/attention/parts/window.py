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
The ``banded`` plan (``sanlab.attention.banded``) runs this part in O(I*M) through ``band_offsets``, the
``flex`` plan (``sanlab.attention.flex``) through ``flex_mask_mod``.
"""

from __future__ import annotations

from torch import Tensor

from sanlab.attention import masks
from sanlab.attention.parts.window_config import WindowConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


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

    def flex_mask_mod(self, ctx: AttentionContext):
        """The same band for the ``flex`` plan."""
        left, right = self.band_offsets(causal=ctx.causal)
        return masks.band_mod(ctx.q_pos, ctx.k_pos, left=left, right=right)

    def extra_repr(self) -> str:
        return f"half_width={self.half_width}, causal_window={self.causal_window!r}"


def refuse_cross_attention(name: str, ctx: BuildContext) -> None:
    """A window centred on the query's own position needs queries and keys on one time axis."""
    if ctx.side == "cross":
        raise ValueError(f"{name} windows are centred on the query's position in the same sequence; target and "
                         f"source positions are not aligned, so it is not defined for cross-attention "
                         f"(cross layer {ctx.layer_index}); list it under attention.parts, not cross_attention.parts")


def build_window(config: WindowConfig, ctx: BuildContext) -> WindowMask:
    refuse_cross_attention("1D-CSAN", ctx)
    return WindowMask(half_width=config.m, causal_window=config.causal_window)
