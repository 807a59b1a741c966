"""Bi_Direct: forward and backward directional masks on dot-product heads (CSAN baseline, spec B.7).

Shen, Zhou, Long, Jiang, Pan & Zhang, "DiSAN: Directional Self-Attention Network for RNN/CNN-Free
Language Understanding", AAAI 2018, https://arxiv.org/abs/1709.04696, Sec. 3.2 (directional masks
M^fw, M^bw). CSAN adaptation (reference code ``layers/attention_di.py``): ordinary dot-product
heads, the first H - 2 H_di heads unmasked, then H_di (forward, backward) pairs in alternation:

    forward head:  key j visible to query i iff j <= i        backward head:  iff j >= i

The diagonal is included, so no row is ever empty (DiSAN itself excludes it and uses
feature-wise attention; that full model is not what the CSAN table compares). No parameters.
Encoder-only: under a causal mask the backward heads would see only themselves, so the part is
not ``causal_safe`` and building it in decoder self-attention raises.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sanlab.attention.parts.directional_config import BiDirectConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


def head_directions(heads: int, pairs: int) -> Tensor:
    """[h] direction per head: 0 = unmasked, +1 = forward (j <= i), -1 = backward (j >= i)."""
    plain = heads - 2 * pairs
    return torch.tensor([0] * plain + [1, -1] * pairs)  # [h]


def directional_mask(q_pos: Tensor, k_pos: Tensor, directions: Tensor) -> Tensor:
    """Boolean [1, h, i, j]: forward heads see j <= i, backward heads j >= i, plain heads everything."""
    offset = (k_pos[None, :] - q_pos[:, None])[None]  # [1, i, j]
    sign = directions.to(q_pos.device)[:, None, None]  # [h, 1, 1]
    return ((offset * sign) <= 0)[None]  # [1, h, i, j]


class DirectionalHeads(AttentionPart):
    """Per-head forward/backward masks (mask stage only, so the fused SDPA and FlexAttention plans apply)."""

    causal_safe = False

    def __init__(self, *, heads: int, pairs: int):
        super().__init__()
        self.register_buffer("directions", head_directions(heads, pairs), persistent=False)  # [h]
        self.pairs = pairs

    def mask(self, ctx: AttentionContext) -> Tensor:
        return directional_mask(ctx.q_pos, ctx.k_pos, self.directions)  # [1, h, i, j]

    def flex_mask_mod(self, ctx: AttentionContext):
        """The same per-head masks for the ``flex`` plan."""
        q_pos, k_pos, directions = ctx.q_pos, ctx.k_pos, self.directions.to(ctx.q_pos.device)
        return lambda b, h, q_idx, kv_idx: (k_pos[kv_idx] - q_pos[q_idx]) * directions[h] <= 0

    def extra_repr(self) -> str:
        return f"pairs={self.pairs}, heads={self.directions.numel()}"


def build_bi_direct(config: BiDirectConfig, ctx: BuildContext) -> DirectionalHeads:
    if ctx.side == "cross":
        raise ValueError("bi_direct masks self-attention heads by direction; it has no meaning in "
                         "encoder-decoder attention")
    if ctx.heads < 2:  # (else the bound below reads "pairs must be between 1 and 0")
        raise ValueError(f"bi_direct needs at least 2 heads (a forward and a backward one); the attention of "
                         f"layer {ctx.layer_index} ({ctx.side}) has {ctx.heads}")
    pairs = ctx.heads // 2 if config.pairs == "all" else config.pairs
    if not 1 <= pairs <= ctx.heads // 2:
        raise ValueError(f"bi_direct pairs = {config.pairs} needs {2 * pairs} heads; the attention has "
                         f"{ctx.heads}, so pairs must be between 1 and {ctx.heads // 2}")
    return DirectionalHeads(heads=ctx.heads, pairs=pairs)
