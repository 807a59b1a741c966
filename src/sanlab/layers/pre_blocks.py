"""The registry of pre-blocks: sublayers an ``EncoderLayer`` runs before its mixer (QANet's convolutions).

Torch-free, like every config module: a pre-block builder receives its config, the ``BuildContext`` and the
host's ``norm`` and ``dropout``, and returns a module called ``block(x, positions=positions)``. A researcher's
own pre-block registers through the entry point group ``sanlab.pre_blocks`` (``docs/variants.md``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, SerializeAsAny

from sanlab.registry import ComponentConfig, Registry


class PreBlockConfig(ComponentConfig):
    """Base of pre-block configs; ``layers`` selects the layer indices that get the block."""


# sanlab's own pre-blocks, in the form of an entry point: name = "module:ConfigClass"
PRE_BLOCKS = Registry("pre-block", group="sanlab.pre_blocks", builtin={
    "conv": "sanlab.layers.conv_blocks_config:ConvBlockConfig",
})

PreBlockSpec = Annotated[SerializeAsAny[PreBlockConfig], BeforeValidator(PRE_BLOCKS.parse)]
