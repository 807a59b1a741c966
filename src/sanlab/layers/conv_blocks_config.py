"""Config of the QANet convolution pre-block (``type: conv``), torch-free; the module and its builder are in
``conv_blocks.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sanlab.layers.pre_blocks import PreBlockConfig


class ConvBlockConfig(PreBlockConfig):
    """QANet convolutions before the SAN sublayer of the selected layers (default: layers 0-2)."""

    type: Literal["conv"] = "conv"
    builder = "sanlab.layers.conv_blocks:build_conv_block"
    layers: list[int] | None = [0, 1, 2]
    count: int = Field(4, ge=1)     # n_conv
    kernel: int = Field(7, ge=1)    # k
    conv_type: Literal["separable", "full"] = "separable"

    @classmethod
    def examples(cls) -> list["ConvBlockConfig"]:
        # the second in the upper layer only: the contract tests check that it is built there alone
        return [cls(), cls(conv_type="full", kernel=3, count=2, layers=[1])]
