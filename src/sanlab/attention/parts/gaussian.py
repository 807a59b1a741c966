"""Gaussian localness biases: Neighbor, Local_Hard and Local_Soft (CSAN baselines, spec B.2-B.4).

Every variant adds, to the last H_loc heads, a Gaussian log-bias around a centre c with width w:

    bias_ij^h = -(j - c_i^h)^2 / (2 (w_i^h / 2)^2) = -2 (j - c_i^h)^2 / (w_i^h)^2

and they differ only in how c and w are obtained (positions are absolute, j is the key position):

* Neighbor, Sperber et al., "Self-Attentional Acoustic Models", Interspeech 2018,
  https://arxiv.org/abs/1803.09519, Sec. 3 (diagonal Gaussian mask; neulab/xnmt ``diag_gauss_mask``):
  c = i, w = 2 sigma_h with sigma_h = s_h^2 a learned scalar per head (``neighbor_mode: sperber``).
  CSAN reading (``neighbor_mode: csan``, default): c = i, w = L(i) sigmoid(U tanh(W q_i + c) + u) + 0.1.
* Local_Hard, Luong, Pham & Manning, "Effective Approaches to Attention-based Neural Machine
  Translation", EMNLP 2015, https://arxiv.org/abs/1508.04025, Eq. 9-10 (local-p), adapted to
  self-attention as in the CSAN reference code: c = (L(i) - 1) sigmoid(...), w = D = 10.
  ``truncate`` adds Luong's hard window |j - c| <= D; ``luong_exact`` multiplies the normalised
  weights by exp(bias) without renormalising (Luong's Eq. 10) instead of adding the bias to the scores.
* Local_Soft, Yang, Tu, Wong, Meng, Chao & Zhang, "Modeling Localness for Self-Attention Networks",
  EMNLP 2018, https://arxiv.org/abs/1810.10182, Sec. 3 (Gaussian bias G, central position P_i,
  window D_i): c = (L(i) - 1) sigmoid(p), w = L(i) sigmoid(d) + 0.1 with (p, d) predicted from the
  query (``window: query``, CSAN's Local_Soft), d from the mean key (``layer``), or w fixed (``fixed``).

Predictions read the full-width projected query ``ctx.q_full`` = x W_Q (before the head split and
the 1/sqrt(D) scale). L(i) is the number of keys visible to query i under padding and causality:
the sentence length in the encoder, i+1 under a causal mask -- so every variant decodes
incrementally from cached keys alone.

The ``flex`` plan (``attention/flex.py``) runs the bias as a FlexAttention ``score_mod`` and Local_Hard's
truncation as a ``mask_mod`` (``flex_score_mod``/``flex_mask_mod``, indexing c and w per (b, h, i));
``luong_exact`` scales the normalised weights, which no fused kernel exposes, so it stays dense.

Cross-attention (docs/variants.md): Neighbor is refused, like 1D/2D-CSAN -- its centre c = i is the
query's own (target) position, which says nothing about source positions. Local_Hard and Local_Soft
are allowed: their centre is predicted from the query and scaled by L = the source length, which is
Luong's local-p in its original encoder-decoder setting (p_t = S sigmoid(...)).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from sanlab.attention import masks
from sanlab.attention.parts.gaussian_config import LocalHardConfig, LocalSoftConfig, NeighborConfig
from sanlab.attention.parts.window import refuse_cross_attention
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext

WIDTH_FLOOR = 0.1         # the reference code adds 0.1 to predicted widths (no division by zero)
# Smallest |w| used: below it (j - c)^2 / w^2 leaves fp32 for sentences of 10^4 positions, and a row whose every
# bias is -inf (a centre between keys) or 0/0 (w = 0 at j = c) is a NaN softmax. A learned Sperber s, or a
# configured D, that small means attention on the nearest key, which this width still gives.
MIN_WIDTH = 1e-12


def resolve_local_heads(value: int | str, heads: int) -> int:
    """Number of local heads from ``half`` / ``all`` / a number, checked against the head count."""
    count = {"all": heads, "half": max(1, heads // 2)}.get(value, value)
    if not 1 <= count <= heads:
        raise ValueError(f"local_heads = {value} must be between 1 and the attention's {heads} heads")
    return count


def base_visibility(ctx: AttentionContext) -> Tensor:
    """Keys visible under padding and causality only (other mask parts do not change L): [b|1, 1, i, j]."""
    pos = ctx.positions
    visible = masks.combine(masks.key_padding(pos.key_valid) if pos.key_valid is not None else None,
                            masks.causal(pos.q_pos, pos.k_pos) if pos.causal else None)
    if visible is None:
        visible = torch.ones(1, 1, pos.q_pos.shape[0], pos.k_pos.shape[0], dtype=torch.bool, device=pos.q_pos.device)
    return visible


def gaussian_bias(k_pos: Tensor, centre: Tensor, width: Tensor) -> Tensor:
    """-2 (j - c)^2 / w^2 for centre/width [b|1, h|1, i|1, 1] -> [b|1, h|1, i|1, j]."""
    return -2.0 * (k_pos.to(centre.dtype) - centre).pow(2) / width.pow(2)


class Predictor(nn.Module):
    """sigmoid(U tanh(W x + c) + u): x [b, i, dim] -> [b, outputs, i, 1] (one value per local head and output)."""

    def __init__(self, *, dim: int, hidden: int, outputs: int):
        super().__init__()
        self.hidden, self.out = nn.Linear(dim, hidden), nn.Linear(hidden, outputs)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.out(torch.tanh(self.hidden(x)))).transpose(1, 2)[..., None]  # [b, n, i, 1]


class GaussianLocalness(AttentionPart):
    """Adds ``gaussian_bias`` to the scores of the last ``local_heads`` heads. Subclasses give c and w."""

    measures_keys = True  # L(i) and the mean key come from the keys as projected, one block per head

    def __init__(self, *, heads: int, local_heads: int):
        super().__init__()
        self.heads, self.local_heads = heads, local_heads

    def centre_and_width(self, ctx: AttentionContext, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """centre, width, each broadcastable to [b, local_heads, i, 1]; lengths = L(i) [b|1, 1, i, 1]."""
        raise NotImplementedError

    def geometry(self, ctx: AttentionContext) -> tuple[Tensor, Tensor]:
        """(centre, width), computed once per call (``ctx.memo``) and shared by the score/mask/weight hooks.

        In fp32 (fp64 when given fp64) whatever autocast does, the predictors included: in bf16, positions past
        256 are not whole numbers any more and a predicted centre (L - 1) p lands keys away from where fp32 puts
        it; in fp16, (j - c)^2 overflows from |j - c| = 182 and w^2 from w = 256 (inf / inf: NaN scores)."""
        def compute() -> tuple[Tensor, Tensor]:
            wide = masks.at_least_fp32(ctx.q_full.dtype)
            lengths = base_visibility(ctx).sum(-1, keepdim=True).to(wide)  # [b|1, 1, i, 1]
            with torch.autocast(device_type=ctx.q_full.device.type, enabled=False):
                centre, width = self.centre_and_width(ctx, lengths)
            return centre, width.abs().clamp_min(MIN_WIDTH)  # only w^2 is used: |w| is the same width

        return ctx.memo.once(self, compute)

    def bias(self, ctx: AttentionContext) -> Tensor:
        centre, width = self.geometry(ctx)
        return gaussian_bias(ctx.k_pos, centre, width)  # [b|1, local_heads, i, j]

    def per_head(self, ctx: AttentionContext) -> tuple[Tensor, Tensor]:
        """(centre, width) [b, h, i] over every head, for the ``flex`` plan's mods to index: the non-local heads
        hold centre 0 and width 1, which the mods never use."""
        def compute() -> tuple[Tensor, Tensor]:
            centre, width = self.geometry(ctx)
            b, i, _ = ctx.q_full.shape
            first = self.heads - self.local_heads

            def full(x: Tensor, fill: float) -> Tensor:
                local = torch.broadcast_to(x, (b, self.local_heads, i, 1))[..., 0]  # [b, local, i]
                return torch.cat([local.new_full((b, first, i), fill), local], dim=1)  # [b, h, i]

            return full(centre, 0.0), full(width, 1.0)

        return ctx.memo.once((self, "per_head"), compute)

    def flex_score_mod(self, ctx: AttentionContext):
        """``score`` as a FlexAttention score_mod: the same Gaussian bias on the local heads."""
        centre, width = self.per_head(ctx)  # [b, h, i]
        k_pos, first = ctx.k_pos.to(centre.dtype), self.heads - self.local_heads

        def mod(score, b, h, q_idx, kv_idx):
            bias = -2.0 * (k_pos[kv_idx] - centre[b, h, q_idx]).pow(2) / width[b, h, q_idx].pow(2)
            return torch.where(h >= first, score + bias.to(score.dtype), score)

        return mod

    def _on_local_heads(self, x: Tensor, fn) -> Tensor:
        first = self.heads - self.local_heads  # the non-local heads come first (reference code)
        local = fn(x[:, first:])  # in fp32 under autocast (the bias is): every head goes to that type
        return torch.cat([x[:, :first].to(local.dtype), local], dim=1)  # [b, h, i, j]

    def score(self, scores: Tensor, ctx: AttentionContext) -> Tensor:
        bias = self.bias(ctx)
        return self._on_local_heads(scores, lambda local: local + bias)  # [b, h, i, j]

    def extra_repr(self) -> str:
        return f"heads={self.heads}, local_heads={self.local_heads}"


class NeighborCSAN(GaussianLocalness):
    """c = i; w = L(i) sigmoid(U_d tanh(W q_i + c) + u) + 0.1 (spec B.2, CSAN reading)."""

    def __init__(self, *, dim: int, heads: int, local_heads: int, head_dim: int):
        super().__init__(heads=heads, local_heads=local_heads)
        self.predict = Predictor(dim=dim, hidden=local_heads * head_dim, outputs=local_heads)

    def centre_and_width(self, ctx: AttentionContext, lengths: Tensor) -> tuple[Tensor, Tensor]:
        centre = ctx.q_pos.to(lengths.dtype)[:, None]  # [i, 1]
        width = lengths * self.predict(ctx.q_full.to(lengths.dtype)) + WIDTH_FLOOR  # [b, local, i, 1]
        return centre, width


class NeighborSperber(GaussianLocalness):
    """c = i; w = 2 sigma_h, sigma_h = s_h^2: bias = -(i - j)^2 / (2 sigma_h^2), query-independent."""

    def __init__(self, *, heads: int, local_heads: int, sigma_init: float | str, square: bool):
        super().__init__(heads=heads, local_heads=local_heads)
        if sigma_init == "rand":  # xnmt: exp(U[0, 1) * ln 1000), log-uniform in [1, 1000)
            init = torch.exp(torch.rand(local_heads) * math.log(1000.0))
        else:
            init = torch.full((local_heads,), float(sigma_init))
        self.sigma_param = nn.Parameter(init)  # [local]
        self.square = square

    def centre_and_width(self, ctx: AttentionContext, lengths: Tensor) -> tuple[Tensor, Tensor]:
        sigma = self.sigma_param.pow(2) if self.square else self.sigma_param
        centre = ctx.q_pos.to(lengths.dtype)[:, None]  # [i, 1]
        return centre, 2.0 * sigma.to(lengths.dtype)[None, :, None, None]  # [i, 1], [1, local, 1, 1]


class LocalHard(GaussianLocalness):
    """c = (L(i) - 1) sigmoid(U_p tanh(W_p q_i + c) + u); w = D (spec B.3)."""

    def __init__(self, *, dim: int, heads: int, local_heads: int, head_dim: int, window: float,
                 truncate: bool = False, luong_exact: bool = False):
        super().__init__(heads=heads, local_heads=local_heads)
        self.predict = Predictor(dim=dim, hidden=local_heads * head_dim, outputs=local_heads)
        self.window, self.truncate, self.luong_exact = window, truncate, luong_exact

    def stages(self) -> tuple[str, ...]:
        """Only the hooks the options switch on: the bias on scores, or on the normalised weights."""
        return (("mask",) if self.truncate else ()) + (("weights",) if self.luong_exact else ("score",))

    def centre_and_width(self, ctx: AttentionContext, lengths: Tensor) -> tuple[Tensor, Tensor]:
        centre = (lengths - 1.0) * self.predict(ctx.q_full.to(lengths.dtype))  # [b, local, i, 1]
        return centre, torch.full_like(centre, self.window)

    def mask(self, ctx: AttentionContext) -> Tensor:
        centre, _ = self.geometry(ctx)
        inside = (ctx.k_pos.to(centre.dtype) - centre).abs() <= self.window  # [b, local, i, j]
        plain = self.heads - self.local_heads
        everything = torch.ones_like(inside[:, :1]).expand(-1, plain, -1, -1)  # [b, h - local, i, j]
        return torch.cat([everything, inside], dim=1)  # [b, h, i, j]

    def flex_mask_mod(self, ctx: AttentionContext):
        """``mask`` (the truncation |j - c| <= D on the local heads) as a FlexAttention mask_mod."""
        centre, _ = self.per_head(ctx)  # [b, h, i]
        centre, k_pos = centre.detach(), ctx.k_pos.to(centre.dtype)
        # D as a tensor, compared in centre's type as the dense mask compares it: a Python float captured by a mod
        # turns symbolic once it changes between calls, and torch 2.15's flex_attention refuses a symbolic float
        first, window = self.heads - self.local_heads, centre.new_full((), self.window)
        return lambda b, h, q_idx, kv_idx: (h < first) | ((k_pos[kv_idx] - centre[b, h, q_idx]).abs() <= window)

    def weights(self, weights: Tensor, ctx: AttentionContext) -> Tensor:
        factor = self.bias(ctx).exp()  # Luong's Eq. 10: scale the alignment, do not renormalise
        return self._on_local_heads(weights, lambda local: local * factor)  # [b, h, i, j]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, truncate={self.truncate}, luong_exact={self.luong_exact}"


class LocalSoft(GaussianLocalness):
    """c = (L(i) - 1) sigmoid(p_i); w = L(i) sigmoid(d) + 0.1 (query / layer) or a fixed D (spec B.4)."""

    def __init__(self, *, dim: int, heads: int, local_heads: int, head_dim: int, window: str, fixed_window: float):
        super().__init__(heads=heads, local_heads=local_heads)
        hidden = local_heads * head_dim
        # query: one predictor for both P and D (shared W_p, 2 H_loc outputs), as in the reference code
        self.predict = Predictor(dim=dim, hidden=hidden, outputs=local_heads * (2 if window == "query" else 1))
        self.predict_width = Predictor(dim=dim, hidden=hidden, outputs=local_heads) if window == "layer" else None
        self.window_mode, self.fixed_window = window, fixed_window

    def centre_and_width(self, ctx: AttentionContext, lengths: Tensor) -> tuple[Tensor, Tensor]:
        out = self.predict(ctx.q_full.to(lengths.dtype))  # [b, local (x2 for query), i, 1]
        centre = (lengths - 1.0) * out[:, :self.local_heads]  # [b, local, i, 1]
        if self.window_mode == "fixed":
            return centre, torch.full_like(centre, self.fixed_window)
        if self.window_mode == "query":
            return centre, lengths * out[:, self.local_heads:] + WIDTH_FLOOR
        return centre, lengths * self.predict_width(self.mean_key(ctx, lengths)) + WIDTH_FLOOR

    @staticmethod
    def mean_key(ctx: AttentionContext, lengths: Tensor) -> Tensor:
        """K-bar: mean of the full-width keys visible to each query (a prefix mean under causality)."""
        keys = ctx.k.transpose(1, 2).flatten(2).to(lengths.dtype)  # [b, j, h*d]
        visible = base_visibility(ctx)[:, 0].to(keys.dtype)  # [b|1, i, j]
        # (a query with no visible key, a row of padding only: 0 / 1, not 0 / 0, whose backward would put NaN
        # into every shared weight's gradient although the row's output is masked)
        return torch.matmul(visible, keys) / lengths[:, 0].clamp_min(1)  # [b, i, h*d]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window_mode!r}"


def build_neighbor(config: NeighborConfig, ctx: BuildContext) -> GaussianLocalness:
    refuse_cross_attention("Neighbor", ctx)  # c = i, the target position: no meaning over source positions
    local = resolve_local_heads(config.local_heads, ctx.heads)
    if config.neighbor_mode == "sperber":
        return NeighborSperber(heads=ctx.heads, local_heads=local, sigma_init=config.sigma_init,
                               square=config.square_sigma)
    return NeighborCSAN(dim=ctx.dim, heads=ctx.heads, local_heads=local, head_dim=ctx.head_dim)


def build_local_hard(config: LocalHardConfig, ctx: BuildContext) -> LocalHard:
    return LocalHard(dim=ctx.dim, heads=ctx.heads, local_heads=resolve_local_heads(config.local_heads, ctx.heads),
                     head_dim=ctx.head_dim, window=config.window, truncate=config.truncate,
                     luong_exact=config.luong_exact)


def build_local_soft(config: LocalSoftConfig, ctx: BuildContext) -> LocalSoft:
    return LocalSoft(dim=ctx.dim, heads=ctx.heads, local_heads=resolve_local_heads(config.local_heads, ctx.heads),
                     head_dim=ctx.head_dim, window=config.window, fixed_window=config.fixed_window)
