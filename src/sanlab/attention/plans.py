"""Execution plans: one contract, several ways to compute it, and the one place that picks among them.

``dense`` is the reference: it forms the full [b, h, i, j] score matrix and runs every part.
``sdpa`` hands plain masked attention to torch's fused kernel; it is chosen only when no part
needs the score matrix. ``banded`` (module ``banded``) runs window-local parts (1D/2D-CSAN) in
O(i*window) without forming the matrix. ``choose`` decides which one a call runs. Faster plans are
added only with a test that they equal ``dense`` in values and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from sanlab.attention import banded, masks
from sanlab.attention.parts_base import AttentionContext, AttentionPart, StageParts

PLANS = ("auto", "dense", "sdpa", "banded")  # what a config may request
Plan = Literal["dense", "sdpa", "banded"]     # what a call runs

__all__ = ["PLANS", "Plan", "StageParts", "check", "choose", "dense", "runnable", "sdpa", "visibility"]


def runnable(parts: StageParts) -> tuple[Plan, ...]:
    """The plans that compute exactly what ``dense`` computes for these parts."""
    fast: tuple[Plan, ...] = () if parts.needs_dense() else ("sdpa",)
    return ("dense", *fast, *(("banded",) if banded.supports(parts) else ()))


def check(requested: str, parts: Sequence[AttentionPart]) -> None:
    """Refuse, when the attention is built, a requested plan that can never run its parts."""
    can = runnable(StageParts.sort(list(parts)))
    if requested == "sdpa" and "sdpa" not in can:
        raise ValueError("plan 'sdpa' cannot run parts that read the score matrix; use 'auto' or 'dense'")
    if requested == "banded" and parts and "banded" not in can:  # no parts at all: nothing to band, dense
        names = ", ".join(type(p).__name__ for p in parts)
        raise ValueError(f"plan 'banded' needs window-local parts only (a window mask, at most one head-area "
                         f"extend, no score/weight/value parts); got parts: {names}")


def choose(parts: StageParts, *, requested: str, device: torch.device, key_length: int,
           need_trace: bool) -> Plan:
    """The plan one call runs: ``requested`` (a config's ``plan``) for these parts over ``key_length`` keys.

    A trace needs the dense matrix; ``auto`` bands from ``banded.MIN_KEYS`` keys on (docs/performance.md)
    and fuses otherwise when no part reads the scores. ``device`` is where the call runs: the CUDA plans
    (FlexAttention, flash) will be chosen by it here, so that parts and the pipeline stay device-free.
    """
    can = runnable(parts)
    if not need_trace and "banded" in can and (requested == "banded"
                                               or (requested == "auto" and key_length >= banded.MIN_KEYS)):
        return "banded"
    # an explicit 'sdpa' was checked at construction; it runs even with a trace (which then stays empty)
    if requested == "sdpa" or (requested == "auto" and not need_trace and "sdpa" in can):
        return "sdpa"
    return "dense"


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
    allowed = visibility(ctx, parts)
    ctx = replace(ctx, allowed=allowed)  # the score/weight/value parts read it (routing, convolved attention)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, i, j]
    for part in parts.score:
        scores = part.score(scores, ctx)
    weights = masks.masked_softmax(scores, allowed)  # [b, h, i, j]
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
