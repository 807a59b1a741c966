"""Configs of MUSE and MUSE_FF (``type: muse``, ``muse_ff``), torch-free; the modules and their builders are in
``muse.py``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sanlab.layers.mixers import MixerConfig


class MuseFFConfig(MixerConfig):
    """MUSE_FF (MUSE-simple): attention and FFN in parallel, one residual, one LayerNorm.

    The block holds the stack's FFN (``ffn_dim``) and the model dropout on each branch output;
    ``decoder_cross``: "parallel" (code: cross-attention is a third branch) or "sequential" (ICLR
    text: a MUSE sub-layer then a separate cross-attention sub-layer).
    """

    type: Literal["muse_ff"] = "muse_ff"
    builder = "sanlab.layers.muse:build_muse_ff"
    input_dropout: float = Field(0.0, ge=0, lt=1)     # on the attention(/conv) branch input only
    decoder_cross: Literal["parallel", "sequential"] = "parallel"
    init: Literal["reference", "pytorch"] = "reference"
    unused_cross_norm: bool = False   # build the code's never-used decoder LayerNorm (parameter parity with its logs)
    layer_kind = "parallel"

    @property
    def cross_branch(self) -> bool:
        return self.decoder_cross == "parallel"

    @classmethod
    def examples(cls) -> list["MuseFFConfig"]:
        return [cls(), cls(decoder_cross="sequential", init="pytorch"), cls(unused_cross_norm=True)]


class MuseConfig(MuseFFConfig):
    """MUSE: MUSE_FF plus gated dynamic-convolution cells on the shared value projection."""

    type: Literal["muse"] = "muse"
    builder = "sanlab.layers.muse:build_muse"
    kernel_sizes: list[Annotated[int, Field(ge=1)]] = Field([3, 15], min_length=1)  # the same cells in every layer
    weight_dropout: float = Field(0.1, ge=0, lt=1)    # DropConnect on the normalised kernels (code: fixed 0.1)
    conv_mask_padding: bool = True    # zero V at padded positions before the convolutions (code: no)
    algorithm: Literal["auto", "unfold", "band"] = "auto"

    @classmethod
    def examples(cls) -> list["MuseConfig"]:
        # not conv_mask_padding: false (the released runs'): the encoder's output then depends on its padding
        return [cls(), cls(kernel_sizes=[3], decoder_cross="sequential", algorithm="unfold"),
                cls(kernel_sizes=[5, 3], init="pytorch", algorithm="band")]
