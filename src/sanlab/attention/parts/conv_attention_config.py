"""Config of convolved attention (``type: conv_attention``), torch-free; the part and its builder are in
``conv_attention.py``."""

from __future__ import annotations

from typing import Literal

from sanlab.attention.registry import PartConfig


class ConvAttentionConfig(PartConfig):
    """Convolve the attention weights: ``dims: 1`` (t filters of 3 x t per head) or ``dims: 2`` (one 3 x 3)."""

    type: Literal["conv_attention"] = "conv_attention"
    builder = "sanlab.attention.parts.conv_attention:build_conv_attention"
    dims: Literal[1, 2] = 1

    @classmethod
    def examples(cls) -> list["ConvAttentionConfig"]:
        return [cls(dims=1), cls(dims=2)]
