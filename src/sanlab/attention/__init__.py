"""Attention as one fixed pipeline with pluggable parts.

Shape legend used in every module of this package (comments end with the result shape):

    b  batch            h  heads (query head)      s  key/value head (2D-CSAN)
    i  query positions  j  key positions           d  head dimension (D); the model width is h*d
    w  window offsets   K  kernel width            n  neighbouring heads (2D-CSAN)

Pipeline stages (see ``core.Attention``): project -> extend -> score -> score parts ->
masks -> normalise -> weight parts -> aggregate (+ value parts) -> output projection.
A part is one small module implementing one or more stage hooks of ``parts_base.AttentionPart``.
"""

from sanlab.attention.core import Attention, AttentionOutput
from sanlab.attention.parts_base import AttentionPart, AttentionContext
from sanlab.attention.positions import Positions
from sanlab.attention.state import KV, PrefixState

__all__ = ["Attention", "AttentionOutput", "AttentionPart", "AttentionContext", "Positions", "KV", "PrefixState"]
