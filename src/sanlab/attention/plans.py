"""Execution plans: one contract, several ways to compute it.

``dense`` is the reference: it forms the full [b, h, i, j] score matrix and runs every part.
``sdpa`` hands plain masked attention to torch's fused kernel; it is chosen only when no part
needs the score matrix. ``banded`` (module ``banded``) runs window-local parts (1D/2D-CSAN) in
O(i*window) without forming the matrix. Faster plans are added only with a test that they equal ``dense`` in
values and gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sanlab.attention import masks
from sanlab.attention.parts_base import AttentionContext, AttentionPart


@dataclass(frozen=True)
class StageParts:
    """The parts of one ``Attention``, sorted by the stage hooks they implement."""

    project: tuple[AttentionPart, ...] = ()
    extend: tuple[AttentionPart, ...] = ()
    score: tuple[AttentionPart, ...] = ()
    mask: tuple[AttentionPart, ...] = ()
    weights: tuple[AttentionPart, ...] = ()
    values: tuple[AttentionPart, ...] = ()

    @staticmethod
    def sort(parts: list[AttentionPart]) -> "StageParts":
        by_stage: dict[str, list[AttentionPart]] = {}
        for part in parts:
            for stage in part.stages():
                by_stage.setdefault(stage, []).append(part)
        return StageParts(**{stage: tuple(ps) for stage, ps in by_stage.items()})

    def needs_dense(self) -> bool:
        """True if some part reads or rewrites the score/weight matrix."""
        return bool(self.extend or self.score or self.weights or self.values)


def visibility(ctx: AttentionContext, parts: StageParts) -> Tensor | None:
    """The combined boolean mask [b|1, h|1, i, j]: padding, causality, then each mask part."""
    pos = ctx.positions
    return masks.combine(
        masks.key_padding(pos.key_valid) if pos.key_valid is not None else None,
        masks.causal(pos.q_pos, pos.k_pos) if pos.causal else None,
        *(part.mask(ctx) for part in parts.mask),
    )


def dense(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, parts: StageParts,
          scale: float, dropout: float, training: bool, trace: dict | None) -> Tensor:
    """Reference plan. q [b, h, i, d], k/v [b, h, j, d] -> [b, h, i, d]."""
    ctx.allowed = visibility(ctx, parts)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, i, j]
    for part in parts.score:
        scores = part.score(scores, ctx)
    weights = masks.masked_softmax(scores, ctx.allowed)  # [b, h, i, j]
    if trace is not None:
        trace["scores"], trace["weights"] = scores.detach(), weights.detach()
    for part in parts.weights:
        weights = part.weights(weights, ctx)
    if trace is not None and parts.weights:
        trace["weights_final"] = weights.detach()
    weights = F.dropout(weights, p=dropout, training=training)
    out = torch.matmul(weights, v)  # [b, h, i, d]
    for part in parts.values:
        out = part.values(out, weights, ctx)
    return out


def sdpa(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, parts: StageParts,
         scale: float, dropout: float, training: bool) -> Tensor:
    """Fused plan for plain masked attention. Same contract as ``dense``."""
    allowed = visibility(ctx, parts)
    empty = None
    if allowed is not None:
        allowed = allowed.expand(q.shape[0], -1, q.shape[2], k.shape[2])
        empty = ~allowed.any(dim=-1, keepdim=True)  # [b, h|1, i, 1]
        # The fused kernel returns NaN for a row with no visible key: open it, then zero it below.
        allowed = allowed | empty
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout if training else 0.0,
                                         scale=scale)  # [b, h, i, d]
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return out
