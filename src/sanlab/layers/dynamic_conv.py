"""Lightweight and dynamic convolutions, and the DynamicConv/LightConv mixer block.

Wu, Fan, Baevski, Dauphin & Auli 2019, "Pay Less Attention with Lightweight and Dynamic
Convolutions", https://arxiv.org/abs/1901.10430, Eq. 1 (depthwise), Eq. 2 (LightConv: softmax
kernels shared by the d channels of a head), Eq. 3 (DynamicConv: kernels predicted per position):

    out[i, (h, d)] = sum_{k<K} w[i, h, k] * x[i + k - P, (h, d)]      x outside [0, I) is 0
    w[i, h, :]     = DropConnect(softmax_k(W^dyn x_i)[h, :])          dynamic   (LightConv: softmax(W[h, :]))

P = (K-1)//2 in an encoder (centred; fairseq's left padding for even K) and K-1 in a decoder
(causal). One operator, two algorithms with the same numbers (fairseq ``_forward_unfolded`` /
``_forward_expanded``): ``unfold`` gathers each position's K neighbours (O(I*K) memory; long
inputs and decoding), ``band`` writes the kernels into a banded [b, h, i, j] matrix and
multiplies (O(I^2) memory, faster for short inputs). Shape letters: see ``sanlab.attention``;
channels are ``h*d`` (heads x channels per head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention.config import AttentionConfig
from sanlab.attention.core import AttentionOutput
from sanlab.attention.masks import at_least_fp32
from sanlab.attention.positions import Positions
from sanlab.layers.dynamic_conv_config import DynamicConvMixerConfig, LightConvMixerConfig
from sanlab.registry import BuildContext

ALGORITHMS = ("auto", "unfold", "band")
BAND_MAX_LEN = 512  # the reference switches from the band matrix to unfolding above this length


@dataclass(frozen=True)
class ConvState:
    """Decoding state of one causal convolution: the last K-1 inputs, buffer [b, K-1, h*d].

    Starts as zeros (the causal zero padding), so every step sees exactly K rows.
    """

    buffer: Tensor


def left_padding(kernel_size: int, *, causal: bool) -> int:
    """P: how many positions before i the first tap reads."""
    return kernel_size - 1 if causal else (kernel_size - 1) // 2


def unfold_conv(x: Tensor, weights: Tensor, *, left: int) -> Tensor:
    """x [b, i, h*d], weights [b, i, h, K] -> [b, i, h*d], gathering the K inputs of each position."""
    kernel = weights.shape[-1]
    padded = F.pad(x, (0, 0, left, kernel - 1 - left))  # [b, i+K-1, h*d]
    return _weigh_windows(padded, weights)


def band_matrix(weights: Tensor, *, left: int) -> Tensor:
    """weights [b, i, h, K] -> [b, h, i, j]: the weight each output i gives input j (zero off the band).

    Row i holds its K taps at columns i..i+K-1 of the padded input; shifting each row by one is a
    flat reshape (pad every row by i zeros, re-read with rows one shorter). It is also the layer's
    "attention map" (what ``sanlab analyze attention`` draws for a convolution).
    """
    b, n, heads, kernel = weights.shape
    w = weights.permute(0, 2, 1, 3)  # [b, h, i, K]
    band = F.pad(w, (0, n)).reshape(b, heads, n * (kernel + n))  # [b, h, i*(K+i)]
    band = band[..., : n * (kernel + n - 1)].view(b, heads, n, kernel + n - 1)  # [b, h, i, i+K-1]
    return band[..., left:left + n]  # [b, h, i, j]


def band_conv(x: Tensor, weights: Tensor, *, left: int) -> Tensor:
    """x [b, i, h*d], weights [b, i, h, K] -> [b, i, h*d] through the banded [b, h, i, j] matrix."""
    b, n, c = x.shape
    heads = weights.shape[2]
    xh = x.view(b, n, heads, c // heads).transpose(1, 2)  # [b, h, j, d]
    return torch.matmul(band_matrix(weights, left=left), xh).transpose(1, 2).reshape(b, n, c)  # [b, i, h*d]


def _weigh_windows(context: Tensor, weights: Tensor) -> Tensor:
    """context [b, i+K-1, h*d] (already padded), weights [b, i, h, K] -> [b, i, h*d]."""
    b, n, heads, kernel = weights.shape
    c = context.shape[-1]
    windows = context.unfold(1, kernel, 1)  # [b, i, h*d, K]
    windows = windows.reshape(b, n, heads, c // heads, kernel)  # [b, i, h, d, K]
    return torch.einsum("bihdk,bihk->bihd", windows, weights).reshape(b, n, c)  # [b, i, h*d]


class PredictedKernels(nn.Module):
    """DynamicConv (Eq. 3): kernel logits predicted linearly from the input at each position, no bias."""

    def __init__(self, *, dim: int, heads: int, kernel_size: int):
        super().__init__()
        self.heads, self.kernel_size = heads, kernel_size
        self.linear = nn.Linear(dim, heads * kernel_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return self.linear(x).view(b, n, self.heads, self.kernel_size)  # [b, i, h, K]


class SharedKernels(nn.Module):
    """LightConv (Eq. 2): one learned kernel per head, the same at every position."""

    def __init__(self, *, heads: int, kernel_size: int):
        super().__init__()
        self.heads, self.kernel_size = heads, kernel_size
        self.weight = nn.Parameter(torch.empty(heads, kernel_size))
        nn.init.xavier_uniform_(self.weight.view(heads, 1, kernel_size))  # fairseq's [h, 1, K] fan-in/out

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return self.weight[None, None].expand(b, n, -1, -1)  # [b, i, h, K]


class DynamicConv(nn.Module):
    """Softmax-normalised depthwise convolution over positions with head-shared kernels.

    ``kernels`` maps x [b, i, h*d] to logits [b, i, h, K] (``PredictedKernels`` or
    ``SharedKernels``). ``algorithm``: "unfold", "band", or "auto" (band up to ``band_max_len``
    positions, unfold beyond and while decoding step by step).
    """

    def __init__(self, *, kernels: nn.Module, causal: bool, weight_dropout: float = 0.0,
                 algorithm: str = "auto", band_max_len: int = BAND_MAX_LEN):
        super().__init__()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown convolution algorithm {algorithm!r}; choose one of {ALGORITHMS}")
        self.kernels, self.causal = kernels, causal
        self.kernel_size = kernels.kernel_size
        self.left = left_padding(self.kernel_size, causal=causal)
        self.weight_dropout, self.algorithm, self.band_max_len = weight_dropout, algorithm, band_max_len

    def kernel_weights(self, x: Tensor) -> Tensor:
        """x [b, i, h*d] -> normalised kernels [b, i, h, K], DropConnect applied while training.

        The softmax runs over all K taps even where a tap falls on zero padding (no renormalisation).
        """
        logits = self.kernels(x)  # [b, i, h, K]
        weights = torch.softmax(logits.to(at_least_fp32(logits.dtype)), dim=-1).to(x.dtype)
        return F.dropout(weights, p=self.weight_dropout, training=self.training)

    def forward(self, x: Tensor, *, state: ConvState | None = None, use_cache: bool = False,
                trace: dict | None = None) -> tuple[Tensor, ConvState | None]:
        """x [b, i, h*d] -> (output [b, i, h*d], state for the next step if ``use_cache``).

        With a ``trace`` dict (full-sequence calls), ``trace["weights"]`` receives the [b, h, i, j] band.
        """
        weights = self.kernel_weights(x)  # [b, i, h, K]
        if trace is not None and not use_cache:
            trace["weights"] = band_matrix(weights, left=self.left).detach()
        if not use_cache:
            band = self.algorithm == "band" or (self.algorithm == "auto" and x.shape[1] <= self.band_max_len)
            return (band_conv if band else unfold_conv)(x, weights, left=self.left), None
        if not self.causal:
            raise ValueError("a centred (encoder) convolution cannot decode step by step; build it with causal=True")
        buffer = state.buffer if state is not None else x.new_zeros(x.shape[0], self.kernel_size - 1, x.shape[2])
        context = torch.cat([buffer, x], dim=1)  # [b, K-1+i, h*d]
        new_state = ConvState(context[:, context.shape[1] - (self.kernel_size - 1):])
        return _weigh_windows(context, weights), new_state


# ----------------------------------------------------------------------------- the mixer block
class ConvBlock(nn.Module):
    """The fairseq ``lightconv`` sublayer: Linear (d -> d, or d -> 2d + GLU), zero padded positions,
    DynamicConv/LightConv, Linear (d -> d). The layer adds the residual, dropout and norm; the FFN
    is the layer's second sublayer."""

    def __init__(self, *, dim: int, conv: DynamicConv, glu: bool, input_dropout: float = 0.0,
                 mask_padding: bool = True):
        super().__init__()
        self.input_dropout = nn.Dropout(input_dropout)
        self.linear_in = nn.Linear(dim, 2 * dim if glu else dim)
        self.glu, self.conv, self.mask_padding = glu, conv, mask_padding
        self.linear_out = nn.Linear(dim, dim)
        for linear in (self.linear_in, self.linear_out):  # fairseq's Linear: Xavier-uniform weights, zero biases
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
        # The kernel predictor keeps PyTorch's default init: fairseq builds it with its Xavier Linear,
        # but DynamicConv1dTBC.reset_parameters() then calls nn.Linear.reset_parameters() on it.

    def forward(self, x: Tensor, *, positions: Positions, cache: ConvState | None = None, use_cache: bool = False,
                need_trace: bool = False) -> AttentionOutput:
        h = self.linear_in(self.input_dropout(x))  # [b, i, h*d] (or 2x before the GLU)
        if self.glu:
            h = F.glu(h, dim=-1)  # [b, i, h*d]
        if self.mask_padding and positions.query_valid is not None:
            h = h * positions.query_mask(h.dtype)
        trace = {} if need_trace else None
        h, state = self.conv(h, state=cache, use_cache=use_cache, trace=trace)
        return AttentionOutput(self.linear_out(h), state, trace)


def _build_block(config: DynamicConvMixerConfig, ctx: BuildContext, kernels: nn.Module) -> ConvBlock:
    conv = DynamicConv(kernels=kernels, causal=ctx.causal, weight_dropout=config.weight_dropout,
                       algorithm=config.algorithm)
    return ConvBlock(dim=ctx.dim, conv=conv, glu=config.glu, input_dropout=config.input_dropout,
                     mask_padding=config.mask_padding)


def _heads(config: DynamicConvMixerConfig, ctx: BuildContext) -> int:
    heads = config.heads or ctx.heads
    if ctx.dim % heads:
        raise ValueError(f"{config.type}: width {ctx.dim} is not divisible by {heads} convolution heads")
    return heads


def build_dynamic_conv(config: DynamicConvMixerConfig, ctx: BuildContext, *, attention: AttentionConfig) -> ConvBlock:
    width = config.width_for(ctx.layer_index, ctx.num_layers)
    return _build_block(config, ctx, PredictedKernels(dim=ctx.dim, heads=_heads(config, ctx), kernel_size=width))


def build_light_conv(config: LightConvMixerConfig, ctx: BuildContext, *, attention: AttentionConfig) -> ConvBlock:
    width = config.width_for(ctx.layer_index, ctx.num_layers)
    return _build_block(config, ctx, SharedKernels(heads=_heads(config, ctx), kernel_size=width))
