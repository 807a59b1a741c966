"""Banded plan: local-window attention in O(I*M) time and memory (O(I*N*M) for 2D-CSAN).

Yang et al., "Convolutional Self-Attention Network", https://arxiv.org/abs/1810.13320, Eq. 4-8
(1D-CSAN window, 2D-CSAN joint softmax over N heads x M positions); spec
``locality-variants.md`` A.6. The papers' own code forms the dense [b, h, i, n*j] logits and masks
them; this plan never forms an i x j matrix.

Queries are cut into blocks of c; block beta (queries p0+beta*c .. +c-1) only needs the keys
p0+beta*c-left .. p0+beta*c+c-1+right. Keys/values are padded by ``left``/``right`` on the time
axis and gathered into overlapping spans of c+left+right (the ``look_around`` of
lucidrains/local-attention; the "sliding chunks" of A.6), from the n head slots for 2D, scored
with one matmul per block, masked (out of range, padding, window, causal, head validity),
softmaxed jointly over the n head slots and the span, and summed over the same spans of values.
Memory O(b*h*i*n*(c+left+right)). The spans are gathered with ``index_select``/indexing, whose
backward is an index-add; with ``unfold`` (strided backward) the plan was 1.5-1.7x slower on this CPU.

A part is window-local (the plan can run it) if it only masks, through
``band_offsets(causal=...) -> (left, right)`` describing the same band as its ``mask``; a 2D-CSAN
extend part also gives ``head_sources(heads, device) -> (k_src, v_src, valid)`` [h, n]. The plan holds
under cached decoding: queries at positions p0.. attend to the window of cached keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sanlab.attention import masks
from sanlab.attention.parts_base import AttentionContext, StageParts
from sanlab.traceable import replace, replaceable

BLOCK = 16        # queries per block; each block reads BLOCK + left + right keys
MIN_KEYS = 128    # ``plans.choose`` takes this plan for ``auto`` from this many keys on (dense is as fast below)
# on CUDA where SDPA could run the window as a mask instead: on an H200 (fp32, forward + backward, B 8, H 8,
# D 64, M 11; results/gpu.md) SDPA + mask was 2.1x faster than this plan at I = 512 and 3x slower at 2048
CUDA_MIN_KEYS = 1024


@replaceable  # the forward copies it with changes under torch.compile (sanlab.traceable)
@dataclass(frozen=True)
class Band:
    """What the window-local parts let through: keys q-left .. q+right of the head slots of each head.

    k_src, v_src, head_valid [h, n]: head feeding slot delta of query head h (None: 1D, n = 1).
    """

    left: int
    right: int
    k_src: Tensor | None = None
    v_src: Tensor | None = None
    head_valid: Tensor | None = None


def supports(parts: StageParts) -> bool:
    """True if every part is window-local: mask parts with a band, at most one head-area extend.
    Asked by ``plans.runnable`` only, so the plan choice stays in one place (``plans.choose``)."""
    if parts.score or parts.weights or parts.values or not parts.mask or len(parts.extend) > 1:
        return False
    return (all(hasattr(p, "band_offsets") for p in parts.mask)
            and all(hasattr(p, "head_sources") for p in parts.extend))


def describe(parts: StageParts, *, heads: int, causal: bool, device: torch.device | None = None) -> Band:
    """The intersection of the parts' bands (an AND of intervals is the tightest interval)."""
    offsets = [p.band_offsets(causal=causal) for p in parts.mask]
    left = min(o[0] for o in offsets)
    right = min(o[1] for o in offsets)
    right = min(right, 0) if causal else right
    if not parts.extend:
        return Band(left, right)
    k_src, v_src, valid = parts.extend[0].head_sources(heads, device=device)
    return Band(left, right, k_src, v_src, valid)


def _start(ctx: AttentionContext, *, queries: int, keys: int) -> int:
    """Position of the first query; checks the layout the plan relies on (key j at position j,
    queries at consecutive positions), which every ``Positions`` constructor produces and records as
    ``query_start`` (a plain int: nothing to read from the device). Positions built otherwise are checked."""
    if ctx.positions.query_start is not None:
        return ctx.positions.query_start
    q_pos, k_pos = ctx.q_pos, ctx.k_pos
    p0 = int(q_pos[0]) if queries else 0
    if not (torch.equal(k_pos, torch.arange(keys, device=k_pos.device))
            and torch.equal(q_pos, torch.arange(p0, p0 + queries, device=q_pos.device))):
        raise ValueError(f"the banded plan needs key j at position j and consecutive query positions; "
                         f"got k_pos {k_pos.tolist()} for {keys} keys, q_pos {q_pos.tolist()}")
    return p0


def _span_index(*, start: int, blocks: int, block: int, left: int, right: int, device) -> Tensor:
    """[blocks, span] index of every key of every span on the time axis padded by ``left``.

    Span beta holds positions start+beta*c-left .. start+beta*c+c-1+right (padded index = position + left).
    """
    span = block + left + right
    return (start + block * torch.arange(blocks, device=device)[:, None]
            + torch.arange(span, device=device)[None, :])  # [blocks, span]


def _allowed(ctx: AttentionContext, band: Band, index: Tensor, *, start: int, block: int, keys: int,
             pad: int) -> Tensor:
    """Visibility [b|1, h|1, blocks, c, n*span] of each query block against its key spans."""
    blocks, span = index.shape
    q_pos = start + torch.arange(blocks * block, device=index.device).view(blocks, block)  # [blocks, c]
    k_pos = index - band.left  # [blocks, span]
    offset = k_pos[:, None, :] - q_pos[:, :, None]  # [blocks, c, span]
    ok = (offset >= -band.left) & (offset <= band.right) & ((k_pos >= 0) & (k_pos < keys))[:, None, :]
    allowed = ok[None, None, :, :, None, :]  # [1, 1, blocks, c, 1, span]
    if ctx.key_valid is not None:
        valid = F.pad(ctx.key_valid, (band.left, pad), value=False)[:, index]  # [b, blocks, span]
        allowed = allowed & valid[:, None, :, None, None, :]  # [b, 1, blocks, c, 1, span]
    if band.head_valid is not None:
        allowed = allowed & band.head_valid[None, :, None, None, :, None]  # [b, h, blocks, c, n, span]
    n = 1 if band.k_src is None else band.k_src.shape[1]
    return allowed.expand(*allowed.shape[:4], n, span).flatten(-2)  # [b|1, h|1, blocks, c, n*span]


def _head_spans(x: Tensor, src: Tensor | None, index: Tensor, *, left: int, pad: int) -> Tensor:
    """Key or value spans of each head's slots: x [b, h, j, d] -> [b, h, blocks, n*span, d]."""
    padded = F.pad(x, (0, 0, left, pad))  # [b, h, left+j+pad, d]
    if src is None:
        return padded.index_select(2, index.flatten()).unflatten(2, index.shape)  # [b, h, blocks, span, d]
    heads = src[:, None, :, None]  # [h, 1, n, 1]
    spans = padded[:, heads, index[None, :, None, :]]  # [b, h, blocks, n, span, d]
    return spans.flatten(3, 4)  # [b, h, blocks, n*span, d]


def attend(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, parts: StageParts, scale: float,
           dropout: float, training: bool, block: int | None = None) -> Tensor:
    """Same contract as ``plans.dense``: q [b, h, i, d], k/v [b, h, j, d] -> [b, h, i, d]."""
    b, h, i, d = q.shape
    keys = k.shape[2]
    band = describe(parts, heads=h, causal=ctx.causal, device=q.device)
    start = _start(ctx, queries=i, keys=keys)
    # Offsets past the first/last key never hit one: a window wider than the sentence costs no more.
    band = replace(band, left=max(0, min(band.left, start + i - 1)),
                   right=max(0, min(band.right, keys - 1 - start)))
    c = max(1, min(block or BLOCK, i))
    blocks = math.ceil(i / c)
    index = _span_index(start=start, blocks=blocks, block=c, left=band.left, right=band.right, device=q.device)
    pad = max(0, start + blocks * c + band.right - keys)  # right padding: the last span may run past the keys
    q_blocks = F.pad(q, (0, 0, 0, blocks * c - i)).view(b, h, blocks, c, d)  # [b, h, blocks, c, d]
    k_spans = _head_spans(k, band.k_src, index, left=band.left, pad=pad)  # [b, h, blocks, n*span, d]
    v_spans = _head_spans(v, band.v_src, index, left=band.left, pad=pad)  # [b, h, blocks, n*span, d]
    scores = torch.matmul(q_blocks, k_spans.transpose(-1, -2)) * scale  # [b, h, blocks, c, n*span]
    allowed = _allowed(ctx, band, index, start=start, block=c, keys=keys, pad=pad)
    weights = masks.masked_softmax(scores, allowed)  # [b, h, blocks, c, n*span]
    weights = F.dropout(weights, p=dropout, training=training)
    out = torch.matmul(weights, v_spans)  # [b, h, blocks, c, d]
    return out.reshape(b, h, blocks * c, d)[:, :, :i]  # [b, h, i, d]
