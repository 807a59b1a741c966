"""Convolved attention (+Conv, +Conv2d): a convolution over the post-softmax attention matrix.

Dufter, Schmitt & Schuetze, "Increasing Learning Efficiency of Self-Attention Networks through
Direct Position Interactions, Learnable Temperature, and Convoluted Attention", COLING 2020,
https://aclanthology.org/2020.coling-main.324 (no arXiv version), Sec. 2.5 and Figure 1;
spec C.7, C.8, C.12.

    dims 1:  A'_ij' = ReLU( b_j' + sum_{delta=-1..1} sum_{j<t} W[delta, j, j'] A_{i+delta, j} ),  W [3, t, t]
    dims 2:  A'_ij  = ReLU( b + sum_{delta, eps=-1..1} w[delta, eps] A_{i+delta, j+eps} ),       w [3, 3]
    Z = A' V       (per head and layer; zero padding; no renormalisation)

For 1D the query axis is the convolution axis and the t key positions are the channels, so the
kernel needs a fixed t (= the model's max_len). The part therefore places A on the fixed t x t grid
of absolute positions (q_pos, k_pos) -- absent rows/columns are zero, exactly the zero padding of
the reference, which always pads to t -- convolves, and reads the visited cells back. Rows of
padded queries are zeroed first and A' is multiplied by the visibility mask afterwards, so
padding and masked keys get no weight (the reference masks nothing; spec C.10 ``clean``).

Causal use (spec C.12): rows i-2..i replace i-1..i+1 (left padding by 2) and the causal mask is
re-applied to A'. The part is not incremental -- row i needs the rows of the two previous queries --
so the attention recomputes the prefix while decoding. Grid axes (positions 0..t-1) are written t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention.dufter_utils import check_fixed_positions, glorot_uniform_
from sanlab.attention.parts.conv_attention_config import ConvAttentionConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


def conv1d_over_queries(grid: Tensor, *, weight: Tensor, bias: Tensor, causal: bool) -> Tensor:
    """grid [b, h, t, t], weight W [h, 3, t, t] (delta, j, j'), bias [h, t] -> A' [b, h, t, t].

    Kernel tap k reads row i + k - 1 (centred) or i + k - 2 (causal).
    """
    b, h, t, _ = grid.shape
    x = grid.transpose(2, 3).reshape(b, h * t, t)  # [b, h*j, i]: key positions are channels
    x = F.pad(x, (2, 0) if causal else (1, 1))  # [b, h*j, i+2]: zero rows outside the grid
    kernel = weight.permute(0, 3, 2, 1).reshape(h * t, t, 3)  # [h*j', j, K]
    out = F.conv1d(x, kernel, bias.reshape(h * t), groups=h)  # [b, h*j', i]
    return torch.relu(out.view(b, h, t, t).transpose(2, 3))  # [b, h, i, j']


def conv2d_over_weights(grid: Tensor, *, weight: Tensor, bias: Tensor, causal: bool) -> Tensor:
    """grid [b, h, t, t], weight w [h, 3, 3] (delta, eps), bias [h] -> A' [b, h, t, t]."""
    x = F.pad(grid, (1, 1, 2, 0) if causal else (1, 1, 1, 1))  # [b, h, i+2, j+2]
    return torch.relu(F.conv2d(x, weight[:, None], bias, groups=grid.shape[1]))  # [b, h, i, j]


class ConvolvedAttention(AttentionPart):
    """Post-softmax convolution of each head's attention matrix on the fixed t x t position grid."""

    incremental = False  # row i mixes the rows of queries i-1 (i-2): recompute the prefix
    causal_safe = True   # causal rows + re-applied causal mask (spec C.12)
    square_keys = True   # convolves the t x t grid of (query, key) positions

    def __init__(self, *, heads: int, t: int, dims: int, causal: bool):
        super().__init__()
        if dims not in (1, 2):
            raise ValueError(f"conv_attention dims must be 1 or 2, got {dims}")
        self.t, self.dims, self.causal = t, dims, causal
        if dims == 1:  # Keras Conv1D(t filters, width 3): glorot_uniform kernel, zero bias
            self.weight = nn.Parameter(torch.empty(heads, 3, t, t))  # W [h, 3, j, j']
            self.bias = nn.Parameter(torch.zeros(heads, t))  # [h, j']
            glorot_uniform_(self.weight, fan_in=3 * t, fan_out=3 * t)
        else:  # Keras Conv2D(1 filter, 3 x 3)
            self.weight = nn.Parameter(torch.empty(heads, 3, 3))  # w [h, 3, 3]
            self.bias = nn.Parameter(torch.zeros(heads))  # [h]
            glorot_uniform_(self.weight, fan_in=9, fan_out=9)

    def weights(self, weights: Tensor, ctx: AttentionContext) -> Tensor:
        check_fixed_positions(ctx, t=self.t, part=f"conv_attention (dims {self.dims})")
        if ctx.key_head is not None:
            raise ValueError("conv_attention needs one key column per position; it cannot follow a part "
                             "that extends keys with other heads' keys (2D-CSAN)")
        causal = self.causal or ctx.causal
        rows, cols = ctx.q_pos[:, None], ctx.k_pos[None, :]  # [i, 1], [1, j]
        if ctx.positions.query_valid is not None:  # padded queries act like the zero rows outside
            weights = weights * ctx.positions.query_mask(weights.dtype)[:, None]  # [b, h, i, j] (made once)
        b, h = weights.shape[:2]
        grid = weights.new_zeros(b, h, self.t, self.t)  # [b, h, t, t]
        grid[:, :, rows, cols] = weights
        conv = conv1d_over_queries if self.dims == 1 else conv2d_over_weights
        out = conv(grid, weight=self.weight, bias=self.bias, causal=causal)[:, :, rows, cols]  # [b, h, i, j]
        # Conv1d mixes all key columns (and Conv2d reaches j+1): invisible keys must stay at zero.
        return out if ctx.allowed is None else out * ctx.allowed.to(out.dtype)


def build_conv_attention(config: ConvAttentionConfig, ctx: BuildContext) -> ConvolvedAttention:
    if ctx.side == "cross":
        raise ValueError("conv_attention mixes the attention rows of neighbouring queries; in cross-attention "
                         "those are earlier decoder steps, which cached decoding does not keep. Use it in "
                         "encoder or decoder self-attention.")
    return ConvolvedAttention(heads=ctx.heads, t=ctx.max_len, dims=config.dims, causal=ctx.causal)
