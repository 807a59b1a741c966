"""Shared helpers of the Dufter et al. parts: Keras initialisers and the fixed-length check.

Dufter, Schmitt & Schuetze, "Increasing Learning Efficiency of Self-Attention Networks through
Direct Position Interactions, Learnable Temperature, and Convoluted Attention", COLING 2020,
https://aclanthology.org/2020.coling-main.324 (no arXiv version); spec C.3, C.4, C.7, C.10.

The reference code is Keras 2.2.4: attention matrices use ``glorot_normal`` (a normal truncated at
two standard deviations, rescaled by 1/0.8796 so the kept samples have the Glorot variance) and
convolution kernels the Keras default ``glorot_uniform``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sanlab.attention.core import Attention
from sanlab.attention.parts_base import AttentionContext

# Standard deviation of a unit normal truncated to [-2, 2] (Keras VarianceScaling's constant).
_TRUNCATED_STD = 0.87962566103423978


def glorot_normal_(tensor: Tensor, *, fan_in: float, fan_out: float) -> Tensor:
    """Keras ``glorot_normal``: N(0, s^2) truncated at +-2s, s = sqrt(2 / (fan_in + fan_out)) / 0.8796."""
    std = math.sqrt(2.0 / (fan_in + fan_out)) / _TRUNCATED_STD
    with torch.no_grad():
        return torch.nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2 * std, b=2 * std)


def glorot_uniform_(tensor: Tensor, *, fan_in: float, fan_out: float) -> Tensor:
    """Keras ``glorot_uniform``: U(-l, l), l = sqrt(6 / (fan_in + fan_out))."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        return tensor.uniform_(-limit, limit)


def check_fixed_positions(ctx: AttentionContext, *, t: int, part: str) -> None:
    """Raise if a query or key position does not fit the part's fixed length t (= model max_len).
    The last positions come from the layout where ``Positions`` promises one (``last_positions``)."""
    known = ctx.positions.last_positions()
    for index, (name, pos) in enumerate((("query", ctx.q_pos), ("key", ctx.k_pos))):
        if not pos.numel():
            continue
        last = known[index] if known is not None else int(pos.max())
        if last >= t:
            raise ValueError(f"{part}: {name} position {last} is outside the fixed length t = {t} "
                             "the part was built for (the model's max_len); split or filter longer sequences")


def glorot_normal_attention_(module: torch.nn.Module) -> None:
    """Re-initialise the q/k/v projections of every ``Attention`` inside ``module`` as Keras does per head.

    Dufter et al. give each head its own W in R^{d_in x d_h} with ``glorot_normal`` (spec C.1), i.e.
    fan_in = d_in and fan_out = d_h; the stacked [h*d_h, d_in] weight gets the same distribution.
    """
    for attention in (m for m in module.modules() if isinstance(m, Attention)):
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
            if isinstance(proj, torch.nn.Linear):
                glorot_normal_(proj.weight, fan_in=proj.in_features, fan_out=attention.head_dim)
