"""The one attention module: a fixed pipeline whose stages are filled with parts.

    project -> extend -> score -> score parts -> masks -> normalise -> weight parts
            -> aggregate (+ value parts) -> merge heads -> output projection

Vaswani et al. 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762, Eq. 1-2.
Variants never add a branch here; they are parts (``parts_base.AttentionPart``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from sanlab.attention import banded, plans
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.attention.positions import Positions
from sanlab.attention.state import KV, PrefixState

PLANS = ("auto", "dense", "sdpa", "banded")


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
        if plan == "sdpa" and self.stage_parts.needs_dense():
            raise ValueError("plan 'sdpa' cannot run parts that read the score matrix; use 'auto' or 'dense'")
        self.banded_ok = banded.supports(self.stage_parts)  # every part window-local (1D/2D-CSAN)
        if plan == "banded" and self.parts and not self.banded_ok:  # no parts at all: nothing to band, dense
            names = ", ".join(type(p).__name__ for p in self.parts)
            raise ValueError(f"plan 'banded' needs window-local parts only (a window mask, at most one head-area "
                             f"extend, no score/weight/value parts); got parts: {names}")
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
        ctx = AttentionContext(positions=positions, heads=self.heads, head_dim=self.head_dim, q_full=self.q_proj(x),
                               cached=dict(zip(self.parts, cache.parts)) if isinstance(cache, KV) else {},
                               to_cache={} if use_cache else None)
        if memory is not None and isinstance(cache, KV):  # cross-attention: memory keys/values are fixed
            q, k, v = self._split(ctx.q_full), cache.k, cache.v
            for part in self.stage_parts.project:
                q, _, _ = part.project(q, k, v, ctx)
        else:
            q, k, v = self._project_new(x if memory is None else memory, ctx)
            if isinstance(cache, KV):  # self-attention: append the new tokens to the cached ones
                k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)  # [b, h, j, d]
        trace = {} if need_trace else None
        out = self._attend(q, k, v, ctx, trace)  # [b, h, i, d]
        new_cache = None
        if use_cache:
            kept = tuple(ctx.to_cache.get(p) for p in self.parts) if ctx.to_cache else ()
            new_cache = KV(k, v, kept)
        b, _, i, _ = out.shape
        out = out.transpose(1, 2).reshape(b, i, self.dim)  # [b, i, h*d]
        if positions.query_valid is not None:
            out = out * positions.query_valid[..., None].to(out.dtype)
        return AttentionOutput(self.out_proj(out), new_cache, trace)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, trace: dict | None) -> Tensor:
        ctx.q, ctx.k = q, k
        kw = dict(parts=self.stage_parts, scale=self.scale, dropout=self.dropout, training=self.training)
        # The banded plan pays off from ~128 keys on (docs/performance.md); a trace needs the dense matrix.
        if trace is None and self.banded_ok and (self.plan == "banded" or (self.plan == "auto"
                                                                           and k.shape[2] >= banded.MIN_KEYS)):
            return banded.attend(q, k, v, ctx, **kw)
        for part in self.stage_parts.extend:
            k, v = part.extend(k, v, ctx)
        ctx.k = k
        use_sdpa = self.plan == "sdpa" or (self.plan == "auto" and trace is None and not self.stage_parts.needs_dense())
        if use_sdpa:
            return plans.sdpa(q, k, v, ctx, **kw)
        return plans.dense(q, k, v, ctx, trace=trace, **kw)

    def _forward_prefix(self, x: Tensor, *, positions: Positions, cache: PrefixState | None,
                        need_trace: bool) -> AttentionOutput:
        """Decode step for parts without an incremental form: recompute all prefix queries."""
        x_all = x if cache is None else torch.cat([cache.x, x], dim=1)  # [b, t, dim]
        full = Positions.self_attention(positions.key_valid, length=x_all.shape[1], causal=positions.causal,
                                        device=x.device)
        result = self.forward(x_all, positions=full, need_trace=need_trace)
        new = x.shape[1]
        return AttentionOutput(result.output[:, -new:], PrefixState(x_all), result.trace)


def with_positions(ctx: AttentionContext, **changes) -> None:
    """Let an extend part replace key positions/validity in the context (positions are frozen)."""
    ctx.positions = replace(ctx.positions, **changes)
