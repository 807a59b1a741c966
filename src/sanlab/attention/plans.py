"""Execution plans: one contract, several ways to compute it, and the one place that picks among them.

``dense`` is the reference: it forms the full [b, h, i, j] score matrix and runs every part.
``sdpa`` hands plain masked attention to torch's fused kernel; it is chosen only when no part
needs the score matrix, and passes causality and key padding to the kernel without forming a [b, h, i, j]
mask where the kernel can take them itself (``_fused_mask``). ``banded`` (module ``banded``) runs
window-local parts (1D/2D-CSAN) in O(i*window) without forming the matrix; ``flex`` (module ``flex``) runs
the masks and score biases that parts offer as FlexAttention mods. ``choose`` decides which one a call runs.
Faster plans are added only with a test that they equal ``dense`` in values and gradients.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from sanlab.attention import banded, flex, masks
from sanlab.attention.parts_base import AttentionContext, AttentionPart, StageParts
from sanlab.errors import ConfigError
from sanlab.traceable import replace

PLANS = ("auto", "dense", "sdpa", "banded", "flex")  # what a config may request
Plan = Literal["dense", "sdpa", "banded", "flex"]     # what a call runs

__all__ = ["PLANS", "Plan", "StageParts", "check", "choose", "dense", "runnable", "sdpa", "visibility"]


def runnable(parts: StageParts, *, head_dim: int | None = None) -> tuple[Plan, ...]:
    """The plans that compute exactly what ``dense`` computes for these parts (and heads of ``head_dim``)."""
    fast: tuple[Plan, ...] = () if parts.needs_dense() else ("sdpa",)
    return ("dense", *fast, *(("banded",) if banded.supports(parts) else ()),
            *(("flex",) if flex.supports(parts) and flex.supports_head_dim(head_dim) else ()))


def check(requested: str, parts: Sequence[AttentionPart], *, dropout: float = 0.0,
          head_dim: int | None = None) -> None:
    """Refuse, when the attention is built, a requested plan that can never run its parts."""
    sorted_parts = StageParts.sort(list(parts))
    can = runnable(sorted_parts)
    names = ", ".join(type(p).__name__ for p in parts)
    if requested == "sdpa" and "sdpa" not in can:
        raise ValueError("plan 'sdpa' cannot run parts that read the score matrix; use 'auto' or 'dense'")
    if requested == "banded" and parts and "banded" not in can:  # no parts at all: nothing to band, dense
        raise ValueError(f"plan 'banded' needs window-local parts only (a window mask, at most one head-area "
                         f"extend, no score/weight/value parts); got parts: {names}")
    if requested != "flex":
        return
    if not flex.AVAILABLE:
        raise ValueError(f"plan 'flex' needs torch.nn.attention.flex_attention from torch 2.6 on (2.5's builds "
                         f"block masks past the sequence's end); this torch is {torch.__version__}: use 'auto'")
    if not flex.supports_head_dim(head_dim):
        raise ValueError(f"plan 'flex' on torch {torch.__version__} needs heads whose size is a power of two "
                         f"(FlexAttention before torch 2.7); these heads have {head_dim}: use 'auto'")
    if dropout > 0:
        raise ValueError(f"plan 'flex' has no attention dropout (FlexAttention applies none); set the attention's "
                         f"dropout to 0 or use 'auto' (dropout {dropout})")
    # parts with nothing to mask or score (none, or projection parts only) run what 'auto' runs
    if (sorted_parts.mask or sorted_parts.needs_dense()) and "flex" not in can:
        raise ValueError(f"plan 'flex' needs parts that offer FlexAttention a mask_mod or score_mod for every "
                         f"mask and score they apply, and nothing that extends keys or reads the weights or values "
                         f"(window, bi_direct, neighbor, local_hard without luong_exact, local_soft); "
                         f"got parts: {names}")


def choose(parts: StageParts, *, requested: str, device: torch.device, key_length: int, query_length: int,
           need_trace: bool, dropout: bool = False, can: tuple[Plan, ...] | None = None) -> Plan:
    """The plan one call runs: ``requested`` (a config's ``plan``) for these parts, ``query_length`` queries over
    ``key_length`` keys.

    A trace needs the dense matrix. ``auto`` bands window-local parts from ``banded_from`` keys on, and
    fuses (``sdpa``) otherwise when no part reads the scores. On CUDA it takes ``flex`` from ``flex.MIN_KEYS``
    keys on for the parts FlexAttention can run and the banded plan cannot (Bi_Direct's per-head directions,
    the Gaussian biases, Local_Hard's data-dependent window), unless attention ``dropout`` is active in this
    call (FlexAttention has none). The thresholds are measured (docs/performance.md, "GPU"). ``device`` is
    where the call runs; this function only decides, it never touches the device, so that parts and the
    pipeline stay device-free. ``can``: ``runnable(parts)`` if the caller keeps it (an ``Attention`` computes
    it once, not at every call).

    Under deterministic algorithms (``train.deterministic``) score parts never run FlexAttention on CUDA:
    its generated backward adds up the gradients of what a score_mod reads (the Gaussian parts' predicted
    centres and widths) with atomic additions, in an order that varies, and torch has no deterministic
    form of it to switch to. ``auto`` takes dense there; an explicit ``flex`` is refused.

    A single query (a decoding step) never runs ``flex``, on any device, also where it is asked for: it runs
    what ``auto`` runs without it. FlexAttention's compiled kernel is made for one (query length, key length)
    (``flex._with_settings``), and each step brings a key more: it compiled anew at every step up to the
    recompile limit. One query against J keys costs O(J) in every plan, so the step loses nothing.
    """
    can = runnable(parts) if can is None else can
    if query_length == 1:
        can = tuple(plan for plan in can if plan != "flex")
    if requested == "flex" and "flex" not in can:  # nothing to mask or score here (or one query): what auto runs
        requested = "auto"
    if "flex" in can and parts.score and device.type == "cuda" and torch.are_deterministic_algorithms_enabled():
        if requested == "flex" and not need_trace:
            names = ", ".join(type(p).__name__ for p in parts.score)
            raise ConfigError(f"plan 'flex' cannot run the score parts {names} under deterministic algorithms "
                              "(train.deterministic) on CUDA: FlexAttention adds up the gradients of their learned "
                              "biases in an order that varies from run to run. Use plan auto (dense there) or "
                              "dense, or leave train.deterministic off")
        can = tuple(plan for plan in can if plan != "flex")
    if not need_trace:
        if requested == "flex" or (requested == "auto" and "banded" not in can and device.type == "cuda"
                                   and "flex" in can and not dropout and key_length >= flex.MIN_KEYS):
            return "flex"
        if "banded" in can and (requested == "banded" or (
                requested == "auto" and key_length >= banded_from(can, device))):
            return "banded"
    # an explicit 'sdpa' was checked at construction; it runs even with a trace (which then stays empty)
    if requested == "sdpa" or (requested == "auto" and not need_trace and "sdpa" in can):
        return "sdpa"
    return "dense"


def banded_from(can: tuple[Plan, ...], device: torch.device) -> int:
    """The key length from which ``auto`` bands: ``banded.MIN_KEYS`` where the alternative is dense (and on
    the CPU), ``banded.CUDA_MIN_KEYS`` on CUDA where SDPA's fused kernels could run the mask instead."""
    return banded.CUDA_MIN_KEYS if device.type == "cuda" and "sdpa" in can else banded.MIN_KEYS


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
    allowed, complements = _dense_mask(ctx, parts)
    ctx = replace(ctx, allowed=allowed)  # the score/weight/value parts read it (routing, convolved attention)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, i, j]
    for part in parts.score:
        scores = part.score(scores, ctx)
    weights = masks.masked_softmax(scores, allowed, complements=complements)  # [b, h, i, j]
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


def _dense_mask(ctx: AttentionContext, parts: StageParts) -> tuple[Tensor | None, tuple[Tensor, Tensor] | None]:
    """``visibility`` and its ``masks.mask_complements``; made once per ``Positions`` where no part adds a mask (the
    parts' masks may depend on more than the positions)."""
    def make():
        allowed = visibility(ctx, parts)
        return allowed, None if allowed is None else masks.mask_complements(allowed)

    return make() if parts.mask else ctx.positions.once("dense mask", make)


def _fused_mask(ctx: AttentionContext, parts: StageParts, *, batch: int, queries: int, keys: int
                ) -> tuple[Tensor | None, bool, Tensor | None]:
    """What ``sdpa`` hands the kernel: (attn_mask, is_causal, empty), empty marking rows to zero afterwards.

    Where no mask part is present and the layout is known (``Positions.query_start``; key j at position j):
      no padding, not causal              no mask (flash on CUDA)
      no padding, causal, no cache offset ``is_causal`` (flash); torch aligns it top-left, right only for i == j
      causal, every query past the keys   causality hides nothing (one decoding step): as not causal
      no padding, causal, cache offset    the [1, 1, i, j] causal mask; key 0 is visible to every query
      padding, not causal                 the [b, 1, 1, j] key mask unexpanded. A row is empty only when its
                                          sentence has no valid key: those sentences (a [b] test) see every
                                          key and their rows are zeroed, exactly as dense does
    Otherwise (mask parts, padding together with causality, or an unknown layout) the combined mask as a
    [b, h|1, i, j] tensor, as before, and the rows it leaves empty opened and zeroed (the fused kernels of older torch
    return NaN for them).

    A mask that depends on the positions alone (no mask part) is made once per ``Positions`` (``Positions.once``):
    every layer of an encoder, and every cross-attention of a decoding step, reads the same one. It stays boolean:
    torch turns it into the additive form each backend wants (-inf for most, a finite fill for cuDNN's). Its key
    names no size: the sizes follow from the positions (an extend part's copy has no memo), and a size in a key
    would pin the shapes of a dynamically compiled model (a recompile per batch shape).
    """
    pos = ctx.positions
    start = pos.query_start
    causal = pos.causal and not (start is not None and start >= keys - 1)
    if not parts.mask and start is not None and not (causal and pos.key_valid is not None):
        if pos.key_valid is not None:
            return pos.once("sdpa key padding", lambda: _padding_mask(pos.key_valid), keys_only=True)
        if not causal:
            return None, False, None
        if start == 0 and queries == keys:
            return None, True, None
        return pos.once("sdpa causal", lambda: (masks.causal(pos.q_pos, pos.k_pos), False, None))  # [1, 1, i, j]
    if parts.mask:  # the parts' masks may depend on more than the positions: made at every call
        return _visibility_mask(ctx, parts, batch=batch, queries=queries, keys=keys)
    return pos.once("sdpa visibility", lambda: _visibility_mask(ctx, parts, batch=batch, queries=queries, keys=keys))


def _padding_mask(key_valid: Tensor) -> tuple[Tensor, bool, Tensor]:
    empty = ~key_valid.any(dim=-1)  # [b]
    return (key_valid | empty[:, None])[:, None, None, :], False, empty[:, None, None, None]


def _visibility_mask(ctx: AttentionContext, parts: StageParts, *, batch: int, queries: int, keys: int
                     ) -> tuple[Tensor | None, bool, Tensor | None]:
    allowed = visibility(ctx, parts)
    if allowed is None:
        return None, False, None
    allowed = allowed.expand(batch, -1, queries, keys)  # [b, h|1, i, j]
    empty = ~allowed.any(dim=-1, keepdim=True)  # [b, h|1, i, 1]
    return allowed | empty, False, empty


def sdpa(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, parts: StageParts,
         scale: float, dropout: float, training: bool) -> Tensor:
    """Fused plan for plain masked attention. Same contract as ``dense``."""
    mask, is_causal, empty = _fused_mask(ctx, parts, batch=q.shape[0], queries=q.shape[2], keys=k.shape[2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                         dropout_p=dropout if training else 0.0, scale=scale)  # [b, h, i, d]
    return out if empty is None else out.masked_fill(empty, 0.0)
