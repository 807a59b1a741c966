"""The one attention module: a fixed pipeline whose stages are filled with parts.

    project -> extend -> score -> score parts -> masks -> normalise -> weight parts
            -> aggregate (+ value parts) -> merge heads -> output projection

Vaswani et al. 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762, Eq. 1-2.
Variants never add a branch here; they are parts (``parts_base.AttentionPart``). Stages return what they
produce (the extended keys as a ``KeySet``, the visibility mask) and this module threads it to the next;
``plans.choose`` picks the plan (dense, fused, banded, flex) that computes the stages after projection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from sanlab.attention import banded, flex, plans
from sanlab.attention.parts_base import AttentionContext, AttentionPart, CallMemo, KeySet, PartCache
from sanlab.attention.plans import PLANS
from sanlab.attention.positions import Positions
from sanlab.attention.state import KV, PrefixState, SourceKV
from sanlab.traceable import replace


@dataclass
class AttentionOutput:
    """output [b, i, h*d]; cache for the next decoding step (or None); trace of stage tensors on request."""

    output: Tensor
    cache: KV | PrefixState | None = None
    trace: dict[str, Tensor] | None = None


class Attention(nn.Module):
    """Multi-head attention, self or cross, with pluggable parts.

    Projections are injected or built here; sharing a projection with another module is
    passing the same instance (MUSE shares the value projection with its convolutions).
    """

    def __init__(self, *, dim: int, heads: int, kv_dim: int | None = None, parts: list[AttentionPart] | None = None,
                 dropout: float = 0.0, bias: bool = True, out_proj: bool = True, plan: str = "auto",
                 v_proj: nn.Module | None = None):
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"attention width {dim} is not divisible by {heads} heads")
        if plan not in PLANS:
            raise ValueError(f"unknown attention plan {plan!r}; choose one of {PLANS}")
        kv_dim = dim if kv_dim is None else kv_dim
        self.dim, self.heads, self.head_dim = dim, heads, dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.dropout, self.plan = dropout, plan
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(kv_dim, dim, bias=bias)
        self.v_proj = v_proj if v_proj is not None else nn.Linear(kv_dim, dim, bias=bias)
        self.out_proj = nn.Linear(dim, dim, bias=bias) if out_proj else nn.Identity()
        self.parts = nn.ModuleList(parts or [])
        extending = [type(p).__name__ for p in self.parts if p.extends_keys]
        # parts that read the keys as one column per position cannot follow a part that extends them
        for flag, why in (("measures_keys", "measure the sentence from the keys, which {} repeats per head block"),
                          ("square_keys", "need one key column per position, which {} extends with other heads' keys")):
            readers = [type(p).__name__ for p in self.parts if getattr(p, flag)]
            if extending and readers:
                raise ValueError(f"attention parts {', '.join(readers)} {why.format(', '.join(extending))}; "
                                 "put them in different layers")
        self.stage_parts = plans.StageParts.sort(list(self.parts))
        plans.check(plan, list(self.parts), dropout=dropout, head_dim=self.head_dim)
        # fixed by the parts and the heads: asked once, not per call
        self.runnable_plans = plans.runnable(self.stage_parts, head_dim=self.head_dim)
        # the reference for cached decoding: keep the layer input and recompute every prefix query
        # (bench/decode_speed.py --recompute times it against the cache)
        self.recompute_prefix = False

    @property
    def incremental(self) -> bool:
        """True if cached keys/values (and what the parts keep) are enough for step-by-step decoding."""
        return not self.recompute_prefix and all(p.incremental for p in self.parts)

    def parts_in(self, stage: str) -> tuple[AttentionPart, ...]:
        """The parts called at ``stage`` (one of ``parts_base.STAGES``), in pipeline order."""
        return getattr(self.stage_parts, stage)

    def check_causal(self) -> None:
        """Raise if a part would let future tokens leak in under a causal mask."""
        for part in self.parts:
            if not part.causal_safe:
                raise ValueError(f"attention part {type(part).__name__} has no causal version and cannot be used "
                                 "in decoder self-attention")

    def _split(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [b, h, t, d]

    def _project_new(self, kv_in: Tensor, ctx: AttentionContext) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self._split(ctx.q_full), self._split(self.k_proj(kv_in)), self._split(self.v_proj(kv_in))
        for part in self.stage_parts.project:  # position-wise, so cached k/v stay valid
            q, k, v = part.project(q, k, v, ctx)
        return q, k, v

    def forward(self, x: Tensor, *, positions: Positions, memory: Tensor | None = None,
                cache: KV | PrefixState | None = None, use_cache: bool = False,
                need_trace: bool = False) -> AttentionOutput:
        """x [b, i, dim]; memory [b, j, kv_dim] for cross-attention (keys/values from memory).

        With ``use_cache`` the returned cache holds what the next step needs: projected keys and
        values (self: grown by the new tokens; cross: computed once) with what the parts keep for
        the next step, or the layer input so far when a part cannot decode incrementally.
        """
        if use_cache and memory is None and not self.incremental:
            return self._forward_prefix(x, positions=positions, cache=cache, need_trace=need_trace)
        kept = cache.parts if isinstance(cache, KV) else {}  # part index -> what the part kept at the last step
        # memo passed, not left to its default_factory: inside a model, dynamo (torch 2.13) failed to call that
        # factory and split the compiled model at every attention call (test_compile.py: one graph per recipe)
        ctx = AttentionContext(positions=positions, heads=self.heads, head_dim=self.head_dim, q_full=self.q_proj(x),
                               memo=CallMemo(),
                               cache=PartCache({self.parts[n]: s for n, s in kept.items()}, keeping=use_cache))
        if memory is not None and isinstance(cache, KV):  # cross-attention: memory keys/values are fixed
            q, k, v = self._split(ctx.q_full), cache.k, cache.v
            for part in self.stage_parts.project:
                q, _, _ = part.project(q, k, v, ctx)
        else:
            q, k, v = self._project_new(x if memory is None else memory, ctx)
            if isinstance(cache, KV):  # self-attention: append the new tokens to the cached ones
                k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)  # [b, h, j, d]
        trace = {} if need_trace else None
        out = self._attend(q, KeySet(k, v, positions), ctx, trace)  # [b, h, i, d]
        new_cache = None
        if use_cache:  # what each part kept, under its index in ``self.parts``
            kept = ctx.cache.kept
            kv = KV if memory is None else SourceKV  # the source's keys are the same in every beam
            new_cache = kv(k, v, {index: kept[p] for index, p in enumerate(self.parts) if p in kept})
        b, _, i, _ = out.shape
        out = out.transpose(1, 2).reshape(b, i, self.dim)  # [b, i, h*d]
        if positions.query_valid is not None:
            out = out * positions.query_mask(out.dtype)
        return AttentionOutput(self.out_proj(out), new_cache, trace)

    def _attend(self, q: Tensor, keys: KeySet, ctx: AttentionContext, trace: dict | None) -> Tensor:
        """Run the plan ``plans.choose`` picks: q [b, h, i, d] against the unextended keys -> [b, h, i, d]."""
        kw = dict(parts=self.stage_parts, scale=self.scale, dropout=self.dropout, training=self.training)
        plan = plans.choose(self.stage_parts, requested=self.plan, device=q.device, key_length=keys.k.shape[2],
                            query_length=q.shape[2], need_trace=trace is not None,
                            dropout=self.training and self.dropout > 0, can=self.runnable_plans)
        ctx = replace(ctx, q=q, k=keys.k)
        if plan == "banded":  # extends through the parts' head sources itself
            return banded.attend(q, keys.k, keys.v, ctx, **kw)
        for part in self.stage_parts.extend:
            keys = part.extend(keys, ctx)
        # the later stages see the extended keys where they sit
        ctx = replace(ctx, k=keys.k, positions=keys.positions, key_head=keys.key_head)
        if plan == "sdpa":
            return plans.sdpa(q, keys.k, keys.v, ctx, **kw)
        if plan == "flex":  # mask and score parts only: no extend ran
            return flex.attend(q, keys.k, keys.v, ctx, **kw)
        return plans.dense(q, keys.k, keys.v, ctx, trace=trace, **kw)

    def _forward_prefix(self, x: Tensor, *, positions: Positions, cache: PrefixState | None,
                        need_trace: bool) -> AttentionOutput:
        """Decode step for parts without an incremental form: recompute all prefix queries."""
        x_all = x if cache is None else torch.cat([cache.x, x], dim=1)  # [b, t, dim]
        full = Positions.self_attention(positions.key_valid, length=x_all.shape[1], causal=positions.causal,
                                        device=x.device)
        result = self.forward(x_all, positions=full, need_trace=need_trace)
        new = x.shape[1]
        return AttentionOutput(result.output[:, -new:], PrefixState(x_all), result.trace)

