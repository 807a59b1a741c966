"""Direct position interactions (SAN+P, SAN+R, SAN+P+R).

Dufter, Schmitt & Schuetze, "Increasing Learning Efficiency of Self-Attention Networks through
Direct Position Interactions, Learnable Temperature, and Convoluted Attention", COLING 2020,
https://aclanthology.org/2020.coling-main.324 (no arXiv version), Sec. 2.3 (the paper numbers
no equations); spec C.3-C.5.

    E^h_ij = q^h_i . k^h_j / sqrt(d)  + A^p,h_ij  + A^r,h_ij        (per head; first layer by default)

``abs_position`` (SAN+P): A^p in R^{t x t} is a free matrix per head; it replaces the
position-position term of added position embeddings. ``rel_position`` (SAN+R) has a in R^{2t}
per head and two readings of it (``rel_param``):

* ``paper``: A^r_ij = a_{i-j+t-1} (0-based), a direction-aware Toeplitz matrix; a_{2t-1} is never read.
* ``circulant_real``: the released code passes a as the spectrum of a circulant operator and keeps
  the real part, A^r_ij = 1/(2t) sum_m a_m cos(pi m (i-j) / t), symmetric in i-j. It produced the
  published SAN+R and SAN+P+R numbers (spec C.4).

Both are additive score parts read at the explicit positions of the call (ctx.q_pos, ctx.k_pos),
so they run under a causal mask unchanged and decode incrementally. t is the model's max_len;
a position >= t is an error.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sanlab.attention.dufter_utils import check_fixed_positions, glorot_normal_
from sanlab.attention.parts.position_interaction_config import AbsPositionConfig, RelPositionConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


class AbsolutePositionInteraction(AttentionPart):
    """scores + A^p[h, q_pos, k_pos]; A^p [h, t, t], Glorot-normal (fan_in = fan_out = t)."""

    def __init__(self, *, heads: int, t: int):
        super().__init__()
        self.t = t
        self.interaction = nn.Parameter(torch.empty(heads, t, t))  # A^p [h, t, t]
        glorot_normal_(self.interaction, fan_in=t, fan_out=t)

    def score(self, scores: Tensor, ctx: AttentionContext) -> Tensor:
        check_fixed_positions(ctx, t=self.t, part="abs_position")
        bias = self.interaction[:, ctx.q_pos[:, None], ctx.k_pos[None, :]]  # [h, i, j]
        return scores + bias[None]  # [b, h, i, j]


def circulant_cosines(t: int) -> Tensor:
    """C[n, m] = cos(pi m (n - t + 1) / t) / (2t) for offsets i - j = n - t + 1 in -(t-1)..t-1.

    The real part of the circulant operator with spectrum a, restricted to the top-left t x t block,
    is A^r_ij = sum_m a_m C[i - j + t - 1, m] (spec C.4). Indexed by offset rather than by (i, j)
    it needs (2t-1) x 2t entries instead of t x t x 2t.
    """
    offsets = torch.arange(-(t - 1), t, dtype=torch.float64)  # [2t-1]
    spectrum = torch.arange(2 * t, dtype=torch.float64)  # [2t]
    return (torch.cos(math.pi * offsets[:, None] * spectrum[None, :] / t) / (2 * t)).float()  # [2t-1, 2t]


class RelativePositionInteraction(AttentionPart):
    """scores + A^r[h, q_pos, k_pos], A^r read from a [h, 2t] through a per-offset table."""

    def __init__(self, *, heads: int, t: int, rel_param: str):
        super().__init__()
        if rel_param not in ("paper", "circulant_real"):
            raise ValueError(f"unknown rel_param {rel_param!r}; choose 'paper' or 'circulant_real'")
        self.t, self.rel_param = t, rel_param
        self.a = nn.Parameter(torch.empty(heads, 2 * t))  # a [h, 2t]
        # Keras' fans of a 1-D weight are sqrt(size) each (std ~ 0.34 for t = 60, spec C.4).
        glorot_normal_(self.a, fan_in=math.sqrt(2 * t), fan_out=math.sqrt(2 * t))
        cosines = circulant_cosines(t) if rel_param == "circulant_real" else None
        self.register_buffer("cosines", cosines, persistent=False)  # [2t-1, 2t] or None

    def offset_table(self) -> Tensor:
        """r [h, 2t-1]: the bias of offset i - j = n - (t - 1) for n = 0..2t-2."""
        if self.cosines is None:
            return self.a[:, :-1]  # paper: a_{i-j+t-1}
        return self.a @ self.cosines.T  # [h, 2t-1]

    def matrix(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """A^r at the given absolute positions: [h, i, j]."""
        offset = q_pos[:, None] - k_pos[None, :] + (self.t - 1)  # [i, j], in 0..2t-2
        return self.offset_table()[:, offset]  # [h, i, j]

    def score(self, scores: Tensor, ctx: AttentionContext) -> Tensor:
        check_fixed_positions(ctx, t=self.t, part="rel_position")
        return scores + self.matrix(ctx.q_pos, ctx.k_pos)[None]  # [b, h, i, j]


def build_abs_position(config: AbsPositionConfig, ctx: BuildContext) -> AbsolutePositionInteraction:
    return AbsolutePositionInteraction(heads=ctx.heads, t=ctx.max_len)


def build_rel_position(config: RelPositionConfig, ctx: BuildContext) -> RelativePositionInteraction:
    return RelativePositionInteraction(heads=ctx.heads, t=ctx.max_len, rel_param=config.rel_param)
