"""Configs of the DynamicConv and LightConv mixers (``type: dynamic_conv``, ``light_conv``), torch-free; the
modules and their builders are in ``dynamic_conv.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sanlab.layers.mixers import MixerConfig


class DynamicConvMixerConfig(MixerConfig):
    """Wu et al.'s DynamicConv block in the mixer slot (self-attention replaced, FFN kept).

    ``kernel_size``: one width for every layer, or one per layer (length = number of layers),
    e.g. the IWSLT/WMT encoder [3, 7, 15, 31, 31, 31, 31].
    """

    type: Literal["dynamic_conv"] = "dynamic_conv"
    builder = "sanlab.layers.dynamic_conv:build_dynamic_conv"
    kernel_size: int | list[int] = 3
    heads: int | None = Field(None, ge=1)   # None = the stack's attention heads
    glu: bool = True                        # fairseq IWSLT configs use False (Linear d -> d)
    weight_dropout: float = Field(0.1, ge=0, lt=1)
    input_dropout: float = Field(0.0, ge=0, lt=1)
    mask_padding: bool = True
    algorithm: Literal["auto", "unfold", "band"] = "auto"

    def width_for(self, layer_index: int, num_layers: int) -> int:
        if isinstance(self.kernel_size, int):
            width = self.kernel_size
        elif len(self.kernel_size) != num_layers:
            raise ValueError(f"{self.type}: kernel_size lists {len(self.kernel_size)} widths "
                             f"{self.kernel_size} for a stack of {num_layers} layers")
        else:
            width = self.kernel_size[layer_index]
        if width < 1:
            raise ValueError(f"{self.type}: kernel width must be >= 1, got {width} for layer {layer_index}")
        return width

    @classmethod
    def examples(cls) -> list["DynamicConvMixerConfig"]:
        """Also LightConv's (``cls``). An even width (fairseq's left-heavy centring), fewer heads than the
        attention's and no GLU, each algorithm by name. Not ``mask_padding: false``: its encoder output depends on
        the padding by design, which the contracts refuse. No per-layer list: it fixes the stack's depth."""
        return [cls(), cls(kernel_size=4, heads=2, glu=False, algorithm="unfold"),
                cls(kernel_size=5, weight_dropout=0.0, algorithm="band")]


class LightConvMixerConfig(DynamicConvMixerConfig):
    """Wu et al.'s LightConv block: the same, with one learned kernel per head instead of predicted ones."""

    type: Literal["light_conv"] = "light_conv"
    builder = "sanlab.layers.dynamic_conv:build_light_conv"
