"""Config -> ``Attention`` with the parts selected for one layer."""

from __future__ import annotations

from torch import nn

from sanlab.attention.config import AttentionConfig
from sanlab.attention.core import Attention
from sanlab.attention.registry import PARTS
from sanlab.registry import BuildContext


def build_attention(config: AttentionConfig, ctx: BuildContext, *, kv_dim: int | None = None,
                    v_proj: nn.Module | None = None) -> Attention:
    """Build the attention of layer ``ctx.layer_index``; a causal side checks every part can be causal.
    ``v_proj``: a value projection shared with another module (MUSE's convolutions), else its own."""
    parts = [PARTS.build(p, ctx) for p in config.parts if p.applies_to(ctx.layer_index)]
    attention = Attention(dim=ctx.dim, heads=config.heads, kv_dim=kv_dim, parts=parts, dropout=config.dropout,
                          bias=config.bias, out_proj=config.out_proj, plan=config.plan, v_proj=v_proj)
    if ctx.causal:
        attention.check_causal()
    return attention
