"""The contract between ``Attention`` and its parts.

A part implements one or more stage hooks. ``Attention`` looks at which hooks a part
overrides and calls it at those stages only, in the fixed pipeline order:

    project(q, k, v, ctx)      -> q, k, v         scale or rewrite projections (temperature)
    extend(k, v, ctx)          -> k, v            add keys/values (2D-CSAN: neighbouring heads);
                                                   must also update ctx.k_pos / ctx.key_valid / ctx.key_head
    score(scores, ctx)         -> scores          additive biases or whole-cube transforms
    mask(ctx)                  -> allowed         boolean, broadcastable to [b, h, i, j]; ANDed
    weights(weights, ctx)      -> weights         post-softmax transforms (convolved attention)
    values(out, weights, ctx)  -> out             value-side terms (Shaw's a^V)

Class attributes say what the part allows:

    incremental   it is exact when only cached keys/values of earlier steps are kept (most
                  parts), plus what the part keeps itself: a part that needs more (capsule routing: the
                  score rows of earlier queries) reads ``ctx.cached.get(self)`` and, when
                  ``ctx.to_cache`` is not None, stores ``ctx.to_cache[self]`` for the next step;
                  if False the attention keeps the layer input and recomputes the prefix
    causal_safe   it may run under a causal mask without letting the future leak in
    extends_keys  its ``extend`` adds key blocks (2D-CSAN repeats keys and positions per head in its area)
    measures_keys it reads the sentence length or the mean key from the keys; it cannot share a layer with
                  a part that extends them (the counts would include the copies)
    square_keys   it reads the scores or weights as a grid of positions, one key column per position
                  (capsule routing, convolved attention); it cannot share a layer with a part that extends keys
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn

from sanlab.attention.positions import Positions

STAGES = ("project", "extend", "score", "mask", "weights", "values")


@dataclass
class AttentionContext:
    """What the parts of one call may read. Built by ``Attention.forward``; parts never infer
    positions from tensor sizes.

    q [b, h, i, d] and k [b, h, j, d] are the per-head projections (after the project stage);
    q_full [b, i, h*d] is the query before the head split (Gaussian predictors read it).
    key_head [h, j] gives, per query head, the head each key column comes from when extend added heads
    (-1 for an empty slot; None without extension).
    allowed [b or 1, h or 1, i, j] is the combined visibility mask, available from the score
    stage on (routing zero-fills invisible scores with it).
    cached maps a part to what it stored at the previous decoding step (empty otherwise); to_cache
    collects what parts store for the next step, and is None when the call keeps no cache.
    """

    positions: Positions
    heads: int
    head_dim: int
    q: Tensor | None = None
    k: Tensor | None = None
    q_full: Tensor | None = None
    key_head: Tensor | None = None
    allowed: Tensor | None = None
    extras: dict = field(default_factory=dict)
    cached: dict = field(default_factory=dict)
    to_cache: dict | None = None

    @property
    def q_pos(self) -> Tensor:
        return self.positions.q_pos

    @property
    def k_pos(self) -> Tensor:
        return self.positions.k_pos

    @property
    def key_valid(self) -> Tensor | None:
        return self.positions.key_valid

    @property
    def causal(self) -> bool:
        return self.positions.causal


class AttentionPart(nn.Module):
    """Base class of every attention variant part. Override only the hooks you need."""

    incremental: bool = True
    causal_safe: bool = True
    extends_keys: bool = False
    measures_keys: bool = False
    square_keys: bool = False

    def project(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def extend(self, k: Tensor, v: Tensor, ctx: AttentionContext) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def score(self, scores: Tensor, ctx: AttentionContext) -> Tensor:
        raise NotImplementedError

    def mask(self, ctx: AttentionContext) -> Tensor:
        raise NotImplementedError

    def weights(self, weights: Tensor, ctx: AttentionContext) -> Tensor:
        raise NotImplementedError

    def values(self, out: Tensor, weights: Tensor, ctx: AttentionContext) -> Tensor:
        raise NotImplementedError

    def stages(self) -> tuple[str, ...]:
        """The hooks this part overrides."""
        return tuple(s for s in STAGES if getattr(type(self), s) is not getattr(AttentionPart, s))
