"""Masks as small predicates of absolute positions, combined with AND.

Every function returns a boolean tensor broadcastable to [b, h, i, j]; True = visible. The ``*_mod``
functions give the same predicates as FlexAttention ``mask_mod``s, (b, h, q_idx, kv_idx) -> visible, for the
``flex`` plan (``attention/flex.py``): they index the positions, so they hold for any layout.
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """Key j is visible to query i iff k_pos[j] <= q_pos[i]."""
    return (k_pos[None, :] <= q_pos[:, None])[None, None]  # [1, 1, i, j]


def band(q_pos: Tensor, k_pos: Tensor, *, left: int, right: int) -> Tensor:
    """Keys with q - left <= k <= q + right (a window; left/right are half-widths)."""
    offset = k_pos[None, :] - q_pos[:, None]  # [i, j]
    return ((offset >= -left) & (offset <= right))[None, None]  # [1, 1, i, j]


def key_padding(key_valid: Tensor) -> Tensor:
    """Padded keys are invisible to every query."""
    return key_valid[:, None, None, :]  # [b, 1, 1, j]


def causal_mod(q_pos: Tensor, k_pos: Tensor):
    """``causal`` as a mask_mod."""
    return lambda b, h, q_idx, kv_idx: k_pos[kv_idx] <= q_pos[q_idx]


def band_mod(q_pos: Tensor, k_pos: Tensor, *, left: int, right: int):
    """``band`` as a mask_mod."""
    def mod(b, h, q_idx, kv_idx):
        offset = k_pos[kv_idx] - q_pos[q_idx]
        return (offset >= -left) & (offset <= right)

    return mod


def key_padding_mod(key_valid: Tensor):
    """``key_padding`` as a mask_mod."""
    return lambda b, h, q_idx, kv_idx: key_valid[b, kv_idx]


def combine(*masks: Tensor | None) -> Tensor | None:
    """AND of the given masks (None entries are ignored); None if there is none."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """fp32 for a floating ``dtype`` of 32 bits or fewer, fp64 for fp64: ``torch.promote_types(dtype, fp32)``
    decided on the host (``promote_types`` is one more dispatched operator per call)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """What a softmax of ``dtype`` scores computes in: ``at_least_fp32``. CUDA's autocast runs a softmax in fp32 by
    itself, the CPU's keeps bf16 scores in bf16, and bf16 training must not differ by device."""
    return at_least_fp32(dtype)


def masked_softmax(scores: Tensor, allowed: Tensor | None, *, complements: tuple[Tensor, Tensor] | None = None
                   ) -> Tensor:
    """Softmax over the last axis restricted to allowed keys; a row with no allowed key is 0, not NaN. In
    ``softmax_dtype``: fp32 under autocast. ``complements``: ``mask_complements(allowed)`` where the caller made it
    already (once for every layer over the same positions)."""
    dtype = softmax_dtype(scores.dtype)
    if allowed is None:
        return torch.softmax(scores, dim=-1, dtype=dtype)
    hidden, empty = mask_complements(allowed) if complements is None else complements
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1, dtype=dtype)
    # An all -inf row gives NaN; such rows (padded queries, strictly directional heads) must be zero.
    return weights.masked_fill(empty, 0.0)


def mask_complements(allowed: Tensor) -> tuple[Tensor, Tensor]:
    """What ``masked_softmax`` needs of a mask besides itself: the hidden entries and the rows with none
    allowed (keepdim)."""
    hidden = ~allowed
    return hidden, ~allowed.any(dim=-1, keepdim=True)
