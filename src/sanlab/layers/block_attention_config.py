"""Config of the block self-attention mixer (``type: block``), torch-free; the modules and the builder are in
``block_attention.py``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sanlab.layers.mixers import MixerConfig


class BlockMixerConfig(MixerConfig):
    """Block self-attention in the selected encoder layers; the other layers keep plain attention."""

    type: Literal["block"] = "block"
    builder = "sanlab.layers.block_attention:build_block_mixer"
    layers: list[int] | None = [0, 1, 2]
    block_mode: Literal["bibosan", "reference"] = "bibosan"
    # auto: ceil((2L)^(1/3)) for bibosan, 4 for reference
    block_len: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"

    @classmethod
    def examples(cls) -> list["BlockMixerConfig"]:
        # a fixed block length of 2 leaves a partial last block and several blocks for the inter-block attention
        return [cls(), cls(block_len=2), cls(block_mode="reference")]
