"""The registry of attention parts: config ``type`` name -> config class -> builder (``sanlab.registry``).

A sanlab part is two modules in ``attention/parts/``: ``<name>_config.py`` (the pydantic config, torch-free,
naming its builder) and ``<name>.py`` (the ``AttentionPart`` and the builder), plus one line in the table
below. A part in a researcher's own package registers through the entry point group ``sanlab.parts``
instead (``docs/variants.md``, "Adding a variant").
"""

from __future__ import annotations

from sanlab.registry import ComponentConfig, Registry


class PartConfig(ComponentConfig):
    """Base of every attention part config. ``layers``: which layer indices get the part
    (None = every layer of the stack it is listed in)."""


# sanlab's own parts, in the form of an entry point: name = "module:ConfigClass"
PARTS = Registry("attention part", group="sanlab.parts", builtin={
    "window": "sanlab.attention.parts.window_config:WindowConfig",
    "csan2d": "sanlab.attention.parts.csan2d_config:Csan2dConfig",
    "neighbor": "sanlab.attention.parts.gaussian_config:NeighborConfig",
    "local_hard": "sanlab.attention.parts.gaussian_config:LocalHardConfig",
    "local_soft": "sanlab.attention.parts.gaussian_config:LocalSoftConfig",
    "bi_direct": "sanlab.attention.parts.directional_config:BiDirectConfig",
    "rel_pos": "sanlab.attention.parts.rel_pos_config:RelPosConfig",
    "capsule": "sanlab.attention.parts.capsule_config:CapsuleConfig",
    "abs_position": "sanlab.attention.parts.position_interaction_config:AbsPositionConfig",
    "rel_position": "sanlab.attention.parts.position_interaction_config:RelPositionConfig",
    "temperature": "sanlab.attention.parts.temperature_config:TemperatureConfig",
    "conv_attention": "sanlab.attention.parts.conv_attention_config:ConvAttentionConfig",
})
