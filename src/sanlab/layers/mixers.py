"""The registry of mixers: what fills a layer's mixer slot (attention, convolution, parallel mixes).

A mixer builder receives its config, the ``BuildContext`` and the stack's ``AttentionConfig``
(mixers that contain attention use it), and returns a module following the mixer contract of
``layers.transformer``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, SerializeAsAny

from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.registry import STRICT_SCHEMA, BuildContext, Registry

MIXERS = Registry("mixer")


class MixerConfig(BaseModel):
    """Base of every mixer config. ``layers``: the layer indices that get this mixer (None = every
    layer); the other layers of the stack keep plain attention with the stack's parts."""

    model_config = STRICT_SCHEMA
    type: str
    layers: list[int] | None = None

    def applies_to(self, layer_index: int) -> bool:
        return self.layers is None or layer_index in self.layers


class AttentionMixerConfig(MixerConfig):
    """Plain (multi-head) self-attention with the stack's attention parts."""

    type: Literal["attention"] = "attention"


@MIXERS.register(AttentionMixerConfig)
def build_attention_mixer(config: AttentionMixerConfig, ctx: BuildContext, *, attention: AttentionConfig):
    return build_attention(attention, ctx)


def _parse_mixer(value: object) -> MixerConfig:
    return MIXERS.parse(value)


MixerSpec = Annotated[SerializeAsAny[MixerConfig], BeforeValidator(_parse_mixer)]

from sanlab.layers import dynamic_conv, muse  # noqa: E402,F401  (each registers its mixers)
