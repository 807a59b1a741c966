"""Explicit absolute positions and validity masks for one attention call.

Positions are always passed in, never inferred from tensor sizes inside a part: during
cached decoding the query at step t has position t although the query tensor has length 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from sanlab.traceable import replaceable


@replaceable  # the forward copies it with changes under torch.compile (sanlab.traceable)
@dataclass(frozen=True)
class Positions:
    """Where the queries and keys of one attention call sit in their sequences.

    q_pos:       [i] absolute query positions (offset by the cache length while decoding)
    k_pos:       [j] absolute key positions
    key_valid:   [b, j] True for real (non-padding) keys, or None when nothing is padded
    query_valid: [b, i] True for real queries, or None; outputs at invalid queries are zeroed
    causal:      keys after the query are invisible (decoder self-attention)
    query_start: what the constructors promise about the layout, a plain int so plans read it without asking
                 the device: key j at position j and query i at position query_start + i; None when the
                 positions were built otherwise (then no plan relies on the layout without checking it)
    derived:     what plans make from these positions alone (the key-padding mask the fused kernel takes), made at
                 the first call and read by every later one: the constructors give one, so the layers of an
                 encoder, or the cross-attentions of one decoding step, make it once. A copy made by ``replace``
                 has none (it may have other positions); None: made at every call
    key_derived: what plans make from the keys alone (``once(..., keys_only=True)``), where it outlives these
                 positions: a decoder's cross-attention keeps it across decoding steps (``MemoryKeys``); None: in
                 ``derived``
    """

    q_pos: Tensor
    k_pos: Tensor
    key_valid: Tensor | None = None
    query_valid: Tensor | None = None
    causal: bool = False
    query_start: int | None = None
    # not an init field, so no copy inherits it (``replace`` of the standard library or sanlab.traceable); a plain
    # dict, which torch.compile can rebuild around a graph break (an object of a class of ours it cannot)
    derived: dict[Any, Any] | None = field(init=False, default=None, compare=False, repr=False)
    key_derived: dict[Any, Any] | None = field(init=False, default=None, compare=False, repr=False)

    @staticmethod
    def self_attention(valid: Tensor | None, *, length: int, offset: int = 0, causal: bool = False,
                       device: torch.device | None = None) -> "Positions":
        """Positions of a self-attention call over ``length`` new tokens after ``offset`` cached ones.

        ``valid`` is [b, offset + length] (keys = cache + new tokens) or None.
        """
        k_pos = torch.arange(offset + length, device=device)  # [j]
        q_valid = None if valid is None else valid[:, offset:]
        return _memoized(Positions(q_pos=k_pos[offset:], k_pos=k_pos, key_valid=valid, query_valid=q_valid,
                                   causal=causal, query_start=offset))

    @staticmethod
    def cross_attention(query: "Positions", memory_valid: Tensor | None, *, memory_length: int,
                        keys: "MemoryKeys | None" = None) -> "Positions":
        """Queries of the decoder against an encoder memory of ``memory_length`` positions; ``keys``: that memory's
        ``MemoryKeys``, kept by the caller across decoding steps (None: made here, for this call only)."""
        carried = keys is not None and keys.serves(memory_valid, memory_length)
        k_pos = keys.k_pos if carried else torch.arange(memory_length, device=query.q_pos.device)  # [j]
        positions = _memoized(Positions(q_pos=query.q_pos, k_pos=k_pos, key_valid=memory_valid,
                                        query_valid=query.query_valid, query_start=query.query_start))
        if carried:  # (no object of a class of ours is made here: a compiled forward passes through)
            object.__setattr__(positions, "key_derived", keys.derived)
        return positions

    def once(self, key: Any, make: Callable[[], Any], *, keys_only: bool = False) -> Any:
        """``make()``, made once per ``key`` for these positions (``derived``); ``key`` names everything besides
        the positions that the value depends on (a dtype, a part's setting), never a size: the positions fix the
        sizes, and under dynamic compilation a size read into a key pins it (a recompile per batch shape).
        ``keys_only``: the value depends on the keys (``k_pos``, ``key_valid``) alone, not on the queries, so it
        may serve every call over the same keys (``key_derived``: a decoder's steps over one memory)."""
        memo = self.key_derived if keys_only and self.key_derived is not None else self.derived
        if memo is None:
            return make()
        if key not in memo:
            memo[key] = make()
        return memo[key]

    def query_mask(self, dtype: torch.dtype) -> Tensor | None:
        """``query_valid`` as a [b, i, 1] multiplier in ``dtype`` (None when nothing is padded), made once."""
        if self.query_valid is None:
            return None
        return self.once(("query mask", dtype), lambda: self.query_valid[..., None].to(dtype))

    def last_positions(self) -> tuple[int, int] | None:
        """(last query position, last key position) from the layout ``query_start`` promises, read from the
        sizes alone (no wait for the device, nothing for torch.compile to stop at); None without that layout
        or with no query or no key."""
        if self.query_start is None or not self.q_pos.numel() or not self.k_pos.numel():
            return None
        return self.query_start + self.q_pos.shape[0] - 1, self.k_pos.shape[0] - 1

    def lengths(self) -> Tensor | None:
        """[b] number of valid keys per sentence (L_b), or None when nothing is padded."""
        return None if self.key_valid is None else self.key_valid.sum(-1)


class MemoryKeys:
    """The key side of a decoder's cross-attention over one encoder memory: its positions and what plans make from
    the keys alone (the fused kernel's key-padding mask), made at the first decoding step and read by the later ones
    for as long as the memory's rows stay. It holds batch-shaped tensors (``memory_valid``, the [b, 1, 1, j] mask) that
    no reorder touches: a plain object, not a dataclass, so ``decoding.cache.reorder`` passes it on as it is (its
    ``k_pos`` has no batch dimension to reorder anyway), and it is right only because ``serves`` asks for the very
    ``memory_valid`` object it was made for: a reorder that moves rows across sentences (a sentence leaving, beams
    expanded) makes a new ``memory_valid``, and the caller new keys; one within sentences keeps the rows' values."""

    __slots__ = ("memory_valid", "k_pos", "derived")

    def __init__(self, memory_valid: Tensor | None, *, memory_length: int, device: torch.device):
        self.memory_valid = memory_valid
        self.k_pos = torch.arange(memory_length, device=device)  # [j]
        self.derived: dict[Any, Any] = {}

    def serves(self, memory_valid: Tensor | None, memory_length: int) -> bool:
        """Whether these are the keys of that memory (the same ``memory_valid`` object, not merely equal values:
        nothing is read from the device)."""
        return self.memory_valid is memory_valid and self.k_pos.shape[0] == memory_length


def _memoized(positions: Positions) -> Positions:
    """``positions`` with a memo of its own (set the way a frozen dataclass sets its fields)."""
    object.__setattr__(positions, "derived", {})
    return positions
