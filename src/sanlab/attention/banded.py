"""Banded plan: local-window attention in O(I*M) time and memory (O(I*N*M) for 2D-CSAN).

Yang et al., "Convolutional Self-Attention Network", https://arxiv.org/abs/1810.13320, Eq. 4-8
(1D-CSAN window, 2D-CSAN joint softmax over N heads x M positions); spec
``locality-variants.md`` A.6. The papers' own code forms the dense [b, h, i, n*j] logits and masks
them; this plan never forms an i x j matrix.

Queries are cut into blocks of c; block beta (queries p0+beta*c .. +c-1) only needs the keys
p0+beta*c-left .. p0+beta*c+c-1+right. Keys/values are gathered into overlapping spans of c+left+right
(the ``look_around`` of lucidrains/local-attention; the "sliding chunks" of A.6), from the n head slots for
2D, scored with one matmul per block, masked (out of range, padding, window, causal, head validity),
softmaxed jointly over the n head slots and the span, and summed over the same spans of values.
Memory O(b*h*i*n*(c+left+right)). The spans are gathered with ``index_select``/indexing, whose
backward is an index-add; with ``unfold`` (strided backward) the plan was 1.5-1.7x slower on this CPU.

Few operators: in eager mode on a GPU each is a kernel launch, and at the lengths where a window plan pays
(I ~ 10^3) the launches, not the arithmetic, set its time (an H200 took 2.5 ms at I = 512, 3.3 ms at 4096;
results/gpu.md). So slots before the first or past the last key read a clamped key instead of a padded copy
of k and v (the mask hides them), the window is one [c, span] mask shared by every block, and the span index
is one arange cut into windows (``unfold`` on that index only: on k and v its strided backward was slower, above).
``bench/attention_window.py`` counts the operators (results/launch-counts.md).

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


@dataclass(frozen=True)
class _Spans:
    """Where the key span of every query block sits: ``key_index`` [blocks * span] the key read at each slot
    (positions clamped into 0 .. keys-1, so keys and values are read without padding them first), ``in_range``
    [1, blocks, span] whether that slot holds a real position (None when every slot does). Slots outside are
    masked, so their clamped keys get zero weight and zero gradient."""

    key_index: Tensor
    in_range: Tensor | None


def _spans(*, start: int, blocks: int, block: int, left: int, right: int, keys: int, device) -> _Spans:
    """Span beta holds positions start+beta*c-left .. start+beta*c+c-1+right: one arange cut into overlapping
    windows (a view), not a grid of indices built from several (each op is a kernel launch on a GPU)."""
    span = block + left + right
    first, end = start - left, start + blocks * block + right  # the first and one past the last position
    positions = torch.arange(first, end, device=device)  # [blocks*c + left + right]
    clamped = positions.clamp(0, keys - 1)
    in_range = (clamped == positions).unfold(0, span, block)[None] if first < 0 or end > keys else None
    return _Spans(clamped.unfold(0, span, block).reshape(-1), in_range)  # [blocks*span]


def _window(*, block: int, span: int, width: int, device) -> Tensor:
    """[c, span]: query t of a block sees span slot s iff 0 <= s - t <= left + right (the same for every block:
    slot s of block beta sits at offset s - t - left from its query t)."""
    return torch.ones(block, span, dtype=torch.bool, device=device).triu(0).tril(width)


def _allowed(ctx: AttentionContext, band: Band, spans: _Spans, *, blocks: int, block: int) -> Tensor:
    """Visibility [b|1, h|1, blocks, c, n*span] of each query block against its key spans."""
    span = block + band.left + band.right
    allowed = _window(block=block, span=span, width=band.left + band.right, device=spans.key_index.device)
    keys_ok = spans.in_range  # [1, blocks, span] or None
    if ctx.key_valid is not None:
        valid = ctx.key_valid.index_select(1, spans.key_index).view(-1, blocks, span)  # [b, blocks, span]
        keys_ok = valid if keys_ok is None else valid & keys_ok
    allowed = allowed[None, None, None, :, None, :]  # [1, 1, 1, c, 1, span]
    if keys_ok is not None:
        allowed = allowed & keys_ok[:, None, :, None, None, :]  # [b|1, 1, blocks, c, 1, span]
    if band.head_valid is not None:
        allowed = allowed & band.head_valid[None, :, None, None, :, None]  # [b|1, h, blocks, c, n, span]
    n = 1 if band.k_src is None else band.k_src.shape[1]
    return allowed.expand(*allowed.shape[:2], blocks, block, n, span).flatten(-2)  # [b|1, h|1, blocks, c, n*span]


def _head_spans(x: Tensor, src: Tensor | None, key_index: Tensor, *, blocks: int) -> Tensor:
    """Key or value spans of each head's slots: x [b, h, j, d] -> [b, h, blocks, n*span, d]."""
    if src is None:
        return x.index_select(2, key_index).unflatten(2, (blocks, -1))  # [b, h, blocks, span, d]
    heads = src[:, None, :, None]  # [h, 1, n, 1]
    spans = x[:, heads, key_index.view(1, blocks, 1, -1)]  # [b, h, blocks, n, span, d]
    return spans.flatten(3, 4)  # [b, h, blocks, n*span, d]


def attend(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, parts: StageParts, scale: float,
           dropout: float, training: bool, block: int | None = None) -> Tensor:
    """Same contract as ``plans.dense``: q [b, h, i, d], k/v [b, h, j, d] -> [b, h, i, d]."""
    b, h, i, d = q.shape
    keys = k.shape[2]
    if not i or not keys:  # an empty batch: what dense gives (zeros, in the graph), without spans to cut
        return q * 0
    band = describe(parts, heads=h, causal=ctx.causal, device=q.device)
    start = _start(ctx, queries=i, keys=keys)
    # Offsets past the first/last key never hit one: a window wider than the sentence costs no more.
    band = replace(band, left=max(0, min(band.left, start + i - 1)),
                   right=max(0, min(band.right, keys - 1 - start)))
    c = max(1, min(block or BLOCK, i))
    blocks = math.ceil(i / c)
    spans = _spans(start=start, blocks=blocks, block=c, left=band.left, right=band.right, keys=keys,
                   device=q.device)
    if blocks * c > i:
        q = F.pad(q, (0, 0, 0, blocks * c - i))
    q_blocks = q.view(b, h, blocks, c, d)  # [b, h, blocks, c, d]
    k_spans = _head_spans(k, band.k_src, spans.key_index, blocks=blocks)  # [b, h, blocks, n*span, d]
    v_spans = _head_spans(v, band.v_src, spans.key_index, blocks=blocks)  # [b, h, blocks, n*span, d]
    scores = torch.matmul(q_blocks, k_spans.transpose(-1, -2)) * scale  # [b, h, blocks, c, n*span]
    weights = masks.masked_softmax(scores, _allowed(ctx, band, spans, blocks=blocks, block=c))
    weights = F.dropout(weights, p=dropout, training=training)
    out = torch.matmul(weights, v_spans)  # [b, h, blocks, c, d]
    return out.reshape(b, h, blocks * c, d)[:, :, :i]  # [b, h, i, d]
