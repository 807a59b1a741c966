"""2D-CSAN: each query attends to an N x M area — the time window of 1D-CSAN in N neighbouring heads.

Yang, Wang, Wong, Chao, Tu, "Convolutional Self-Attention Network", arXiv 2018,
https://arxiv.org/abs/1810.13320, Eq. 6-8; NAACL 2019 version, https://arxiv.org/abs/1904.03107,
Eq. 7-9.

    e_ij^{hs}     = q_i^h . k_j^s / sqrt(d)
    alpha_ij^{hs} = exp(e_ij^{hs}) / sum_{s' in S(h)} sum_{t in W(i)} exp(e_it^{hs'})
    y_i^h         = sum_{s in S(h)} sum_{j in W(i)} alpha_ij^{hs} v_j^s

``extend`` concatenates the keys/values of the heads S(h) = {h-n .. h+n} along the key axis
([b, h, n*j, d], block delta = -n..n in order), so the ordinary softmax over the extended key
axis IS the joint N x M softmax; ``mask`` applies the 1D window to the tiled positions (and,
for ``clip``, hides the head slots outside [0, H-1]). Head-axis boundary (spec A.3):

    wrap       keys and values of head (h+delta) mod H                       (default)
    clip       only heads inside [0, H-1]; edge heads see 2 (not 3) head blocks
    reference  keys of (h+delta) mod H but values of clamp(h+delta, 0, H-1): the released code

No parameters. The ``banded`` plan runs it in O(I*N*M) through ``band_offsets``/``head_sources``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sanlab.attention import masks
from sanlab.attention.parts.csan2d_config import Csan2dConfig
from sanlab.attention.parts.window import band_offsets, refuse_cross_attention
from sanlab.attention.parts_base import AttentionContext, AttentionPart, KeySet
from sanlab.registry import BuildContext
from sanlab.traceable import replace

BOUNDARIES = ("wrap", "clip", "reference")


def head_sources(*, heads: int, area: int, boundary: str, device: torch.device | None = None
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """Which head feeds head slot delta of query head h.

    Returns k_src [h, n] and v_src [h, n] (head indices, n = area, delta = -n//2 .. n//2) and
    valid [h, n] (False only for ``clip`` slots outside [0, H-1]; their indices are clamped).
    """
    half = area // 2
    target = (torch.arange(heads, device=device)[:, None]
              + torch.arange(-half, half + 1, device=device)[None, :])  # [h, n]
    wrapped, clamped = target % heads, target.clamp(0, heads - 1)
    valid = (target >= 0) & (target < heads)
    if boundary == "wrap":
        return wrapped, wrapped, torch.ones_like(valid)
    if boundary == "clip":
        return clamped, clamped, valid
    if boundary == "reference":
        return wrapped, clamped, torch.ones_like(valid)
    raise ValueError(f"unknown head_boundary {boundary!r}; choose one of {BOUNDARIES}")


class HeadArea(AttentionPart):
    """Borrow the keys/values of neighbouring heads (extend), then window them (mask)."""

    extends_keys = True

    def __init__(self, *, half_width: int, area: int, boundary: str, causal_window: str = "half"):
        super().__init__()
        self.half_width, self.area, self.boundary, self.causal_window = half_width, area, boundary, causal_window

    def head_sources(self, heads: int, device: torch.device | None = None) -> tuple[Tensor, Tensor, Tensor]:
        return head_sources(heads=heads, area=self.area, boundary=self.boundary, device=device)

    def band_offsets(self, *, causal: bool) -> tuple[int, int]:
        return band_offsets(self.half_width, self.causal_window, causal=causal)

    def extend(self, keys: KeySet, ctx: AttentionContext) -> KeySet:
        k_src, v_src, valid = self.head_sources(ctx.heads, device=keys.k.device)
        b, h, j, d = keys.k.shape
        n = self.area
        pos = keys.positions
        # Every head block holds the same time steps: positions and padding are tiled n times.
        positions = replace(pos, k_pos=pos.k_pos.repeat(n),  # [n*j]
                            key_valid=None if pos.key_valid is None else pos.key_valid.repeat(1, n),  # [b, n*j]
                            query_start=None)  # key column j no longer sits at position j
        return KeySet(k=keys.k[:, k_src].reshape(b, h, n * j, d),  # [b, h, n, j, d] -> [b, h, n*j, d]
                      v=keys.v[:, v_src].reshape(b, h, n * j, d),  # [b, h, n, j, d] -> [b, h, n*j, d]
                      positions=positions,
                      # source head of each key column per query head [h, n*j]; -1 = no head (clip)
                      key_head=k_src.masked_fill(~valid, -1).repeat_interleave(j, dim=1))

    def mask(self, ctx: AttentionContext) -> Tensor:
        left, right = self.band_offsets(causal=ctx.causal)
        allowed = masks.band(ctx.q_pos, ctx.k_pos, left=left, right=right)  # [1, 1, i, n*j]
        if self.boundary == "clip":
            allowed = allowed & (ctx.key_head >= 0)[None, :, None, :]  # [1, h, i, n*j]
        return allowed

    def extra_repr(self) -> str:
        return (f"half_width={self.half_width}, area={self.area}, boundary={self.boundary!r}, "
                f"causal_window={self.causal_window!r}")


def build_csan2d(config: Csan2dConfig, ctx: BuildContext) -> HeadArea:
    refuse_cross_attention("2D-CSAN", ctx)
    if config.heads_area > ctx.heads:
        raise ValueError(f"2D-CSAN heads_area N = {config.heads_area} exceeds the {ctx.heads} heads of "
                         f"layer {ctx.layer_index} ({ctx.side}); N must be <= heads")
    return HeadArea(half_width=config.m, area=config.heads_area, boundary=config.head_boundary,
                    causal_window=config.causal_window)
