"""Attention as one fixed pipeline with pluggable parts.

Shape legend used in every module of this package (comments end with the result shape):

    b  batch            h  heads (query head)      s  key/value head (2D-CSAN)
    i  query positions  j  key positions           d  head dimension (D); the model width is h*d
    w  window offsets   K  kernel width            n  neighbouring heads (2D-CSAN)

Pipeline stages (see ``core.Attention``): project -> extend -> score -> score parts ->
masks -> normalise -> weight parts -> aggregate (+ value parts) -> output projection.
A part is one small module implementing one or more stage hooks of ``parts_base.AttentionPart``.
"""

from importlib import import_module

# where each name below lives; imported on first use, so ``sanlab.attention.config`` (the schema) loads
# without torch
_HOMES = {"Attention": "core", "AttentionOutput": "core", "AttentionPart": "parts_base",
          "AttentionContext": "parts_base", "KeySet": "parts_base", "Positions": "positions", "KV": "state",
          "PrefixState": "state"}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
