"""The contract between ``Attention`` and its parts.

A part implements one or more stage hooks. ``Attention`` looks at which hooks a part
overrides and calls it at those stages only, in the fixed pipeline order:

    project(q, k, v, ctx)      -> q, k, v         scale or rewrite projections (temperature)
    extend(keys, ctx)          -> keys            add keys/values (2D-CSAN: neighbouring heads); a ``KeySet``
                                                   in and out: k, v with their positions and head map
    score(scores, ctx)         -> scores          additive biases or whole-cube transforms
    mask(ctx)                  -> allowed         boolean, broadcastable to [b, h, i, j]; ANDed
    weights(weights, ctx)      -> weights         post-softmax transforms (convolved attention)
    values(out, weights, ctx)  -> out             value-side terms (Shaw's a^V)

Hooks return what they produce and never write to ``ctx`` (it is frozen): the attention hands each
stage the context it needs (after ``extend``: the extended key positions and ``key_head``; from the score
stage on: the visibility mask ``allowed``). Two explicit channels carry what is not a stage's result:
``ctx.memo`` (a value a part computes once per call and reads in several hooks) and ``ctx.cache``
(``PartCache``: what a part keeps between decoding steps).

Class attributes say what the part allows:

    incremental   it is exact when only cached keys/values of earlier steps are kept (most
                  parts), plus what the part keeps itself: a part that needs more (capsule routing: the
                  score rows of earlier queries) reads ``ctx.cache.previous(self)`` and stores
                  ``ctx.cache.keep(self, value)`` for the next step (``KV.parts``);
                  if False the attention keeps the layer input and recomputes the prefix
    causal_safe   it may run under a causal mask without letting the future leak in
    extends_keys  its ``extend`` adds key blocks (2D-CSAN repeats keys and positions per head in its area)
    measures_keys it reads the sentence length or the mean key from the keys; it cannot share a layer with
                  a part that extends them (the counts would include the copies)
    square_keys   it reads the scores or weights as a grid of positions, one key column per position
                  (capsule routing, convolved attention); it cannot share a layer with a part that extends keys

Optional methods tell the faster plans what a part can give them; ``plans.runnable`` asks for them, never for a
type: ``band_offsets``/``head_sources`` (``banded.py``: a window as an interval of offsets), and
``flex_mask_mod(ctx)``/``flex_score_mod(ctx)`` (``flex.py``: the part's ``mask`` or ``score`` as a FlexAttention
function of (b, h, q_idx, kv_idx) for one call, or None for nothing to add).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from sanlab.attention.positions import Positions
from sanlab.traceable import replaceable

STAGES = ("project", "extend", "score", "mask", "weights", "values")


@dataclass(frozen=True)
class KeySet:
    """Keys and values with where they sit: what ``extend`` takes and returns.

    k, v [b, h, j, d]; positions: the call's ``Positions`` with k_pos [j] / key_valid [b, j] of these keys;
    key_head [h, j]: per query head, the head each key column comes from once extend added heads (-1 for an
    empty slot; None without extension).
    """

    k: Tensor
    v: Tensor
    positions: Positions
    key_head: Tensor | None = None


class CallMemo:
    """Values a part computes once per attention call and reads in several hooks (the Gaussian centre and
    width in ``mask`` and ``score``). Each call starts with an empty one, so nothing outlives the call."""

    def __init__(self) -> None:
        self._values: dict[Any, Any] = {}

    def once(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time ``key`` is asked for in this call, the same value afterwards."""
        if key not in self._values:
            self._values[key] = compute()
        return self._values[key]


class PartCache:
    """What parts keep between decoding steps, for one call: ``previous(part)`` is what the part kept at
    the previous step (None at the first), ``keep(part, value)`` what it needs at the next one (dropped when
    the call keeps no cache). Values hold the batch on dimension 0, so beams reorder them."""

    def __init__(self, previous: Mapping[AttentionPart, Any] | None = None, *, keeping: bool = False) -> None:
        self._previous = dict(previous or {})
        self.kept: dict[AttentionPart, Any] | None = {} if keeping else None

    def previous(self, part: AttentionPart) -> Any:
        return self._previous.get(part)

    def keep(self, part: AttentionPart, value: Any) -> None:
        if self.kept is not None:
            self.kept[part] = value


@replaceable  # the forward copies it with changes under torch.compile (sanlab.traceable)
@dataclass(frozen=True)
class AttentionContext:
    """What the parts of one call may read. Built by ``Attention.forward``; parts never infer
    positions from tensor sizes.

    q [b, h, i, d] and k [b, h, j, d] are the per-head projections (after the project stage);
    q_full [b, i, h*d] is the query before the head split (Gaussian predictors read it).
    key_head [h, j]: as ``KeySet.key_head``, after the extend stage.
    allowed [b or 1, h or 1, i, j] is the combined visibility mask, available from the score
    stage on (routing zero-fills invisible scores with it).
    """

    positions: Positions
    heads: int
    head_dim: int
    q: Tensor | None = None
    k: Tensor | None = None
    q_full: Tensor | None = None
    key_head: Tensor | None = None
    allowed: Tensor | None = None
    memo: CallMemo = field(default_factory=CallMemo)
    cache: PartCache = field(default_factory=PartCache)

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

    def extend(self, keys: KeySet, ctx: AttentionContext) -> KeySet:
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
