"""The registry of mixers: what fills a layer's mixer slot (attention, convolution, parallel mixes).

Torch-free, like every config module. A mixer builder receives its config, the ``BuildContext`` and the
stack's ``AttentionConfig`` (mixers that contain attention use it), and returns a module following the
mixer contract of ``layers.transformer``. A researcher's own mixer registers through the entry point group
``sanlab.mixers`` (``docs/variants.md``).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, SerializeAsAny

from sanlab.registry import ComponentConfig, Registry


class MixerConfig(ComponentConfig):
    """Base of every mixer config. ``layers``: the layer indices that get this mixer (None = every
    layer); the other layers of the stack keep plain attention with the stack's parts.

    ``layer_kind`` is the kind of layer the builder puts the mixer in (``layers.transformer``): "sequential"
    (the mixer is one residual sublayer, the FFN and the cross-attention are others) or "parallel" (the
    mixer's builder also receives the layer's ``ffn``, the ``dropout`` of each branch and, where
    ``cross_branch``, the decoder's ``cross_attention``, and returns one block that holds them).
    """

    layer_kind: ClassVar[Literal["sequential", "parallel"]] = "sequential"

    @property
    def cross_branch(self) -> bool:
        """In a parallel decoder layer: the cross-attention is a branch of the block (else a sublayer after it)."""
        return False


class AttentionMixerConfig(MixerConfig):
    """Plain (multi-head) self-attention with the stack's attention parts."""

    type: Literal["attention"] = "attention"
    builder = "sanlab.layers.transformer:build_attention_mixer"


# sanlab's own mixers, in the form of an entry point: name = "module:ConfigClass"
MIXERS = Registry("mixer", group="sanlab.mixers", builtin={
    "attention": "sanlab.layers.mixers:AttentionMixerConfig",
    "dynamic_conv": "sanlab.layers.dynamic_conv_config:DynamicConvMixerConfig",
    "light_conv": "sanlab.layers.dynamic_conv_config:LightConvMixerConfig",
    "muse": "sanlab.layers.muse_config:MuseConfig",
    "muse_ff": "sanlab.layers.muse_config:MuseFFConfig",
    "block": "sanlab.layers.block_attention_config:BlockMixerConfig",
})

MixerSpec = Annotated[SerializeAsAny[MixerConfig], BeforeValidator(MIXERS.parse)]
