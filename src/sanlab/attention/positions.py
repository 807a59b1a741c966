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
    def cross_attention(query: "Positions", memory_valid: Tensor | None, *, memory_length: int) -> "Positions":
        """Queries of the decoder against an encoder memory of ``memory_length`` positions."""
        k_pos = torch.arange(memory_length, device=query.q_pos.device)  # [j]
        return _memoized(Positions(q_pos=query.q_pos, k_pos=k_pos, key_valid=memory_valid,
                                   query_valid=query.query_valid, query_start=query.query_start))

    def once(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, made once per ``key`` for these positions (``derived``); ``key`` names everything besides
        the positions that the value depends on (a dtype, a part's setting), never a size: the positions fix the
        sizes, and under dynamic compilation a size read into a key pins it (a recompile per batch shape)."""
        if self.derived is None:
            return make()
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]

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


def _memoized(positions: Positions) -> Positions:
    """``positions`` with a memo of its own (set the way a frozen dataclass sets its fields)."""
    object.__setattr__(positions, "derived", {})
    return positions
