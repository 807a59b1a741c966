"""Block baseline: Bi-directional block self-attention replacing the self-attention sublayer (spec B.5).

Shen, Zhou, Long, Jiang & Zhang, "Bi-Directional Block Self-Attention for Fast and Memory-Efficient
Sequence Modeling", ICLR 2018, https://arxiv.org/abs/1804.00857, Sec. 3 (masked block
self-attention: intra-block attention, block summary, inter-block attention, context fusion),
following ``simple_block_attention`` of taoshen58/BiBloSA. Per direction, block length r:

    x~_p  = ELU(W_m x_p + b_m)                                      (d_h = d/2, so fw;bw has width d)
    f_pq  = 5 tanh((W_1 x~_q + W_2 x~_p + b_f) / 5)                 feature-wise, same block, fw: q < p, bw: q > p
    h_p   = sum_q softmax_q(f_pq) * x~_q                            (an empty row gives 0)
    v_l   = sum_{p in block l} softmax_p(W_s h_p + b_s) * h_p      block summary
    e_l   = DiSA over v_1..v_m with the same direction mask (ELU map, feature-wise attention, fusion gate)
    [u; g] = W_c [x~_p; h_p; e_l] + b_c,   out_p = sigmoid(g) * ELU(u) + (1 - sigmoid(g)) * x~_p

``block_mode: reference`` is the CSAN author's multi-head simplification (``layers/attention_block.py``):
per-head dot-product attention inside blocks of 4 (no direction masks), a per-head block summary,
dot-product attention between block summaries, a gate, and [intra; e] -> W_O.

Choices (spec B.5): padding is masked everywhere, including the block summaries and padded
blocks in the inter-block attention (the released codes do not), so extra padding never changes
real outputs; ``block_len: auto`` is ceil((2 L)^(1/3)) with L the longest *real* length in the batch.
Encoder only: the block summary of a token's own block contains later tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention.config import AttentionConfig
from sanlab.attention.core import AttentionOutput
from sanlab.attention.masks import softmax_dtype
from sanlab.attention.positions import Positions
from sanlab.layers.block_attention_config import BlockMixerConfig
from sanlab.registry import BuildContext

REFERENCE_BLOCK_LEN = 4  # hard-coded in the CSAN reference code


def masked_softmax(logits: Tensor, allowed: Tensor, *, dim: int) -> Tensor:
    """Softmax over ``dim`` restricted to ``allowed`` (broadcastable); an empty slice gives zeros (DiSAN's
    masked softmax followed by a multiplication with the mask, so no NaN appears even in gradients)."""
    logits = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
    dtype = softmax_dtype(logits.dtype)  # fp32 under autocast, on every device
    return torch.softmax(logits, dim=dim, dtype=dtype) * allowed.to(dtype)


def direction_mask(size: int, direction: str, *, device: torch.device | None = None) -> Tensor:
    """[p, q] for query p and key q: forward sees q < p, backward q > p (diagonal excluded)."""
    index = torch.arange(size, device=device)
    p, q = index[:, None], index[None, :]  # [p, 1], [1, q]
    return q < p if direction == "forward" else q > p  # [p, q]


def intra_block_mask(valid: Tensor, direction: str) -> Tensor:
    """valid [b, m, r] (token inside the sentence) -> allowed [b, m, r(p), r(q)]."""
    return both_valid(valid) & direction_mask(valid.shape[-1], direction, device=valid.device)  # [b, m, r, r]


def both_valid(valid: Tensor) -> Tensor:
    """valid [b, m, r] -> [b, m, r(p), r(q)]: query and key both inside the sentence."""
    return valid[..., :, None] & valid[..., None, :]


def split_blocks(x: Tensor, valid: Tensor, block_len: int) -> tuple[Tensor, Tensor]:
    """Pad the sequence to a multiple of r: x [b, i, c] -> [b, m, r, c], valid [b, i] -> [b, m, r]."""
    b, i, c = x.shape
    blocks = math.ceil(i / block_len)
    extra = blocks * block_len - i
    x = F.pad(x, (0, 0, 0, extra)).view(b, blocks, block_len, c)  # [b, m, r, c]
    valid = F.pad(valid, (0, extra), value=False).view(b, blocks, block_len)  # [b, m, r]
    return x, valid


class FeatureAttention(nn.Module):
    """Multi-dimensional token2token attention: y_p = sum_q softmax_q(5 tanh((W_1 x_q + W_2 x_p + b_f)/5)) * x_q."""

    def __init__(self, dim: int):
        super().__init__()
        self.key_query = nn.Linear(dim, 2 * dim, bias=False)  # W_1 (dependent) and W_2 (head)
        self.f_bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        """x [..., n, c]; allowed [..., n(p), n(q)] -> [..., n, c]."""
        dependent, head = self.key_query(x).chunk(2, dim=-1)  # [..., n, c] each
        pair = dependent[..., None, :, :] + head[..., :, None, :] + self.f_bias  # [..., p, q, c]
        logits = 5.0 * torch.tanh(pair / 5.0)  # [..., p, q, c]
        weights = masked_softmax(logits, allowed[..., None], dim=-2)  # [..., p, q, c]
        return (weights * x[..., None, :, :]).sum(-2)  # [..., p, c]


class DiSA(nn.Module):
    """Directional self-attention (DiSAN's block, used between block summaries): map, attend, gate."""

    def __init__(self, dim: int):
        super().__init__()
        self.map = nn.Linear(dim, dim)
        self.attend = FeatureAttention(dim)
        self.gate_x, self.gate_s = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.gate_bias = nn.Parameter(torch.zeros(dim))  # the reference has this on top of both linear biases

    def forward(self, v: Tensor, allowed: Tensor, valid: Tensor) -> Tensor:
        """v [b, m, c]; allowed [b, m, m]; valid [b, m] -> [b, m, c]."""
        mapped = F.elu(self.map(v))  # [b, m, c]
        attended = self.attend(mapped, allowed)  # [b, m, c]
        gate = torch.sigmoid(self.gate_x(mapped) + self.gate_s(attended) + self.gate_bias)
        return (gate * mapped + (1 - gate) * attended) * valid[..., None].to(v.dtype)  # [b, m, c]


class BlockDirection(nn.Module):
    """One direction of Bi-BloSA: x [b, m, r, d], valid [b, m, r] -> [b, m, r, d_h]."""

    def __init__(self, *, dim: int, hidden: int, direction: str):
        super().__init__()
        self.direction = direction
        self.map = nn.Linear(dim, hidden)
        self.intra = FeatureAttention(hidden)
        self.summary = nn.Linear(hidden, hidden)
        self.inter = DiSA(hidden)
        self.fuse = nn.Linear(3 * hidden, 2 * hidden)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        mapped = F.elu(self.map(x))  # [b, m, r, c]
        intra = self.intra(mapped, intra_block_mask(valid, self.direction))  # [b, m, r, c]
        summary_w = masked_softmax(self.summary(intra), valid[..., None], dim=2)  # [b, m, r, c]
        summary = (summary_w * intra).sum(2)  # [b, m, c]
        block_valid = valid.any(-1)  # [b, m]
        order = direction_mask(summary.shape[1], self.direction, device=x.device)  # [m, m]
        allowed = order & block_valid[:, None, :]  # [b, m, m]
        context = self.inter(summary, allowed, block_valid)  # [b, m, c]
        context = context[:, :, None].expand_as(intra)  # [b, m, r, c]
        new, gate = self.fuse(torch.cat([mapped, intra, context], dim=-1)).chunk(2, dim=-1)  # [b, m, r, c] each
        gate = torch.sigmoid(gate)
        return gate * F.elu(new) + (1 - gate) * mapped  # [b, m, r, c]


class BiBloSA(nn.Module):
    """Forward and backward block self-attention, concatenated: [b, i, d] -> [b, i, 2 d_h] (= d).

    Each direction keeps its ``BlockDirection`` (its parameters, and ``BlockDirection.forward`` as the
    reference); ``_directions`` runs a group of them as one computation over a leading direction axis."""

    def __init__(self, *, dim: int):
        super().__init__()
        if dim % 2:
            raise ValueError(f"Bi-BloSA concatenates two directions of width d/2; model width {dim} is odd")
        self.directions = nn.ModuleList(BlockDirection(dim=dim, hidden=dim // 2, direction=d)
                                        for d in ("forward", "backward"))

    def forward(self, x: Tensor, valid: Tensor, *, block_len: int) -> Tensor:
        blocks, block_valid = split_blocks(x, valid, block_len)  # [b, m, r, d], [b, m, r]
        if directions_together(x.device):
            out = _directions(list(self.directions), blocks, block_valid)  # [2, b, m, r, c]
            out = out.movedim(0, -2).flatten(-2)  # [b, m, r, 2c]: forward then backward, as a concatenation
        else:
            out = torch.cat([_directions([d], blocks, block_valid)[0] for d in self.directions], dim=-1)
        return out.flatten(1, 2)[:, :x.shape[1]]  # [b, i, d]


def directions_together(device: torch.device) -> bool:
    """Both directions in one computation on an accelerator, where an update's eager time goes into launching
    kernels: 30% fewer launches a layer (results/launch-counts.md). One after the other on the CPU, whose time is
    the arithmetic, and where tensors of twice the size were slower (beyond its caches: 4-16% a layer,
    bench/block_layer.py)."""
    return device.type != "cpu"


def _stacked(directions: list[BlockDirection], name: str) -> Tensor:
    """One parameter of each direction, [n, ...]."""
    return _stack([direction.get_parameter(name) for direction in directions])


def _stack(tensors: list[Tensor]) -> Tensor:
    """torch.stack, or a view for one tensor (no copy)."""
    return tensors[0][None] if len(tensors) == 1 else torch.stack(tensors)


def _linear(x: Tensor, directions: list[BlockDirection], name: str) -> Tensor:
    """Each direction's ``name`` linear over its own input: x [n, ..., in] -> [n, ..., out], one batched product."""
    return _batched_linear(x, _stacked(directions, f"{name}.weight"), _stacked(directions, f"{name}.bias"))


def _batched_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x W^T + bias per direction: x [n, ..., in], weight [n, out, in], bias [n, out] or None -> [n, ..., out]."""
    rows = x.reshape(x.shape[0], -1, x.shape[-1])  # [n, rows, in] (a view where the layout allows)
    weight = weight.transpose(1, 2)
    out = torch.bmm(rows, weight) if bias is None else torch.baddbmm(bias[:, None], rows, weight)  # [n, rows, out]
    return out.view(*x.shape[:-1], out.shape[-1])


def _feature_attention(x: Tensor, allowed: Tensor, directions: list[BlockDirection], name: str) -> Tensor:
    """``FeatureAttention.forward`` of each direction: x [n, ..., k, c]; allowed [n, ..., k, k] -> [n, ..., k, c].

    The [..., p, q, c] tensors are Block's cost, so fewer passes over them than the reference: the 1/5 and
    f_bias act on the [..., k, c] projections before they are paired, and a row with no allowed key is zeroed
    in the output instead of in its weights (the softmax over its finite fills is uniform, not NaN, and a
    zeroed output passes no gradient back). Elsewhere a masked weight is exactly 0 either way.

    Under autocast the projections are cast up before the bias and the 1/5 (no operator without autocast): the
    pair tensors are then in the softmax's precision from the start, as the reference's are (its fp32 f_bias
    promotes them); with the bias and the 1/5 inside a bf16 product the input gradient was 15% further off."""
    kq = _batched_linear(x, _stacked(directions, f"{name}.key_query.weight"))  # [n, ..., k, 2c]
    f_bias = F.pad(_stacked(directions, f"{name}.f_bias"), (x.shape[-1], 0))  # [n, 2c]: on the head half only
    kq = (kq.to(softmax_dtype(kq.dtype)) + f_bias.view(len(directions), *[1] * (x.dim() - 2), -1)) * 0.2
    dependent, head = kq.chunk(2, dim=-1)  # (W_1 x_q) / 5 and (W_2 x_p + b_f) / 5: [n, ..., k, c] each
    logits = torch.tanh(dependent[..., None, :, :] + head[..., :, None, :]) * 5.0  # [n, ..., p, q, c]
    logits = logits.masked_fill(~allowed[..., None], torch.finfo(logits.dtype).min)
    weights = torch.softmax(logits, dim=-2, dtype=softmax_dtype(logits.dtype))  # [n, ..., p, q, c]
    out = (weights * x[..., None, :, :]).sum(-2)  # [n, ..., p, c]
    return out * allowed.any(-1, keepdim=True).to(out.dtype)  # rows without a key: 0


def _direction_masks(size: int, directions: list[BlockDirection], device: torch.device) -> Tensor:
    """[n, size, size]: each direction's ``direction_mask``."""
    return _stack([direction_mask(size, d.direction, device=device) for d in directions])


def _directions(directions: list[BlockDirection], x: Tensor, valid: Tensor) -> Tensor:
    """``BlockDirection.forward`` of n directions at once: x [b, m, r, d], valid [b, m, r] -> [n, b, m, r, c].
    Every step is the reference's, over a leading direction axis."""
    n, (m, r) = len(directions), x.shape[1:3]
    weight = _stacked(directions, "map.weight").flatten(0, 1)  # [n c, d]: every map reads the same x
    bias = _stacked(directions, "map.bias").flatten()
    mapped = F.elu(F.linear(x, weight, bias)).unflatten(-1, (n, -1)).movedim(-2, 0)  # [n, b, m, r, c]
    intra_allowed = _direction_masks(r, directions, x.device)[:, None, None] & both_valid(valid)  # [n, b, m, r, r]
    intra = _feature_attention(mapped, intra_allowed, directions, "intra")  # [n, b, m, r, c]
    summary_w = masked_softmax(_linear(intra, directions, "summary"), valid[..., None], dim=-2)
    summary = (summary_w * intra).sum(-2)  # [n, b, m, c]
    block_valid = valid.any(-1)  # [b, m]
    allowed = _direction_masks(m, directions, x.device)[:, None] & block_valid[None, :, None, :]  # [n, b, m, m]
    # DiSA between the block summaries (DiSA.forward)
    inter_mapped = F.elu(_linear(summary, directions, "inter.map"))  # [n, b, m, c]
    attended = _feature_attention(inter_mapped, allowed, directions, "inter.attend")
    gate_bias = _stacked(directions, "inter.gate_bias")[:, None, None]  # [n, 1, 1, c]
    gate = torch.sigmoid(_linear(inter_mapped, directions, "inter.gate_x")
                         + _linear(attended, directions, "inter.gate_s") + gate_bias)
    context = (gate * inter_mapped + (1 - gate) * attended) * block_valid[..., None].to(summary.dtype)
    context = context[:, :, :, None].expand_as(intra)  # [n, b, m, r, c]
    new, fuse_gate = _linear(torch.cat([mapped, intra, context], dim=-1), directions, "fuse").chunk(2, dim=-1)
    fuse_gate = torch.sigmoid(fuse_gate)
    return fuse_gate * F.elu(new) + (1 - fuse_gate) * mapped  # [n, b, m, r, c]


class ReferenceBlockAttention(nn.Module):
    """The CSAN author's multi-head block attention: intra-block heads, summaries, gated inter-block."""

    def __init__(self, *, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"block attention width {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.summary_hidden, self.summary_logits = nn.Linear(dim, dim), nn.Linear(dim, heads)
        self.block_query = nn.Linear(dim, dim)
        self.gate = nn.Linear(2 * dim, dim)
        self.out = nn.Linear(2 * dim, dim)

    def _split(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim)).movedim(-2, 1)  # [b, h, ..., d]

    def _merge(self, x: Tensor) -> Tensor:
        return x.movedim(1, -2).flatten(-2)  # [b, ..., h*d]

    def forward(self, x: Tensor, valid: Tensor, *, block_len: int) -> Tensor:
        blocks, block_valid = split_blocks(x, valid, block_len)  # [b, m, r, dim], [b, m, r]
        q, k, v = (self._split(t) for t in self.qkv(blocks).chunk(3, dim=-1))  # [b, h, m, r, d] each
        scale = self.head_dim ** -0.5
        key_ok = block_valid[:, None, :, None, :]  # [b, 1, m, 1, r]
        intra = masked_softmax(q @ k.transpose(-1, -2) * scale, key_ok, dim=-1) @ v  # [b, h, m, r, d]
        hidden = torch.sigmoid(self.summary_hidden(self._merge(intra)))  # [b, m, r, dim]
        logits = self.summary_logits(hidden).movedim(-1, 1)  # [b, h, m, r]
        summary_w = masked_softmax(logits, block_valid[:, None], dim=-1)  # [b, h, m, r]
        summary = (summary_w[..., None] * intra).sum(-2)  # [b, h, m, d]
        bq = self._split(self.block_query(self._merge(summary))) * scale  # [b, h, m, d]
        block_ok = block_valid.any(-1)[:, None, None, :]  # [b, 1, 1, m]
        inter = masked_softmax(bq @ summary.transpose(-1, -2), block_ok, dim=-1) @ summary  # [b, h, m, d]
        s, o = self._merge(summary), self._merge(inter)  # [b, m, dim] each
        gate = torch.sigmoid(self.gate(torch.cat([s, o], dim=-1)))
        context = self._split(gate * o + (1 - gate) * s)[:, :, :, None].expand_as(intra)  # [b, h, m, r, d]
        out = self.out(self._merge(torch.cat([intra, context], dim=-1)))  # [b, m, r, dim]
        return out.flatten(1, 2)[:, :x.shape[1]]  # [b, i, dim]


class BlockSelfAttention(nn.Module):
    """Mixer wrapper: valid mask and block length from the positions, zeroed padded outputs."""

    def __init__(self, *, core: nn.Module, block_len: int | str, mode: str):
        super().__init__()
        self.core, self.block_len, self.mode = core, block_len, mode

    def resolve_block_len(self, positions: Positions) -> int:
        if self.block_len != "auto":
            return int(self.block_len)
        if self.mode == "reference":
            return REFERENCE_BLOCK_LEN
        lengths = positions.lengths()

        def read_longest() -> int:  # a shape, so read on the host (on a GPU, a wait for the device)
            return int(lengths.max())

        # once per positions, which every layer of the stack shares: not a wait per layer
        longest = positions.once("block_longest", read_longest) if lengths is not None else positions.q_pos.numel()
        # Bi-BloSA's r = ceil((2n)^(1/3)) over the batch's longest sentence: as in the reference, a
        # sentence's output depends on what it is batched with (an integer block_len does not)
        return max(1, math.ceil((2 * longest) ** (1 / 3)))

    def forward(self, x: Tensor, *, positions: Positions, cache=None, use_cache: bool = False,
                need_trace: bool = False, memory: Tensor | None = None) -> AttentionOutput:
        if positions.causal or use_cache or memory is not None:
            raise ValueError("block self-attention is encoder-only (non-causal self-attention without a cache)")
        valid = positions.query_valid
        if valid is None:
            valid = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        out = self.core(x, valid, block_len=self.resolve_block_len(positions))  # [b, i, dim]
        if positions.query_valid is not None:  # padded outputs zeroed (the mask made once per positions)
            out = out * positions.query_mask(out.dtype)
        return AttentionOutput(out, None, {} if need_trace else None)


def build_block_mixer(config: BlockMixerConfig, ctx: BuildContext, *, attention: AttentionConfig) -> nn.Module:
    if ctx.side != "encoder":
        raise ValueError(f"the block mixer is encoder-only (not causal: a block summary sees later tokens); "
                         f"it was configured for the {ctx.side} side")
    if config.block_mode == "reference":
        core = ReferenceBlockAttention(dim=ctx.dim, heads=attention.heads)
    else:
        core = BiBloSA(dim=ctx.dim)
    return BlockSelfAttention(core=core, block_len=config.block_len, mode=config.block_mode)
