"""Decoding state of attention and mixers: plain data, reordered by ``decoding.cache.reorder``.

Dimension 0 of every tensor is the batch (times beam), so one generic ``index_select``
follows the beams.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor


@dataclass(frozen=True)
class KV:
    """Projected keys and values seen so far: k, v [b, h, j, d].

    ``parts`` maps the index of a part in its attention's ``parts`` to what that part keeps beside them for
    the next step; a part that keeps nothing has no entry. Capsule routing keeps its routing cube's rows
    [b, h, j, j]; batch on dimension 0, like every cached tensor.
    """

    k: Tensor
    v: Tensor
    parts: dict[int, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return self.k.shape[2]


@dataclass(frozen=True)
class SourceKV(KV):
    """Cross-attention's keys and values, projected from the source at the first step: the same rows in every
    beam of a sentence, so beam search need not reorder them while no sentence leaves. What the parts keep
    stays per beam (it follows the queries)."""

    beam_shared_fields: ClassVar[tuple[str, ...]] = ("k", "v")  # read by decoding.cache.reorder


@dataclass(frozen=True)
class PrefixState:
    """For parts that cannot decode step by step: the whole layer input so far, x [b, t, h*d].

    The attention recomputes every prefix query and returns the newest rows, so correctness
    never depends on a part's own cache (the nanoGPT ``generate`` strategy).
    """

    x: Tensor

    @property
    def length(self) -> int:
        return self.x.shape[1]
