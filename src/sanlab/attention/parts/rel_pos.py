"""Rel_Pos: clipped relative position representations on keys and values.

Shaw, Uszkoreit & Vaswani, "Self-Attention with Relative Position Representations", NAACL 2018,
https://arxiv.org/abs/1803.02155, Eq. 3-4 (relation-aware attention) and Eq. 5-7 (clipping):

    a^K_ij = w^K[clip(j - i, -k, k) + k],   a^V_ij = w^V[clip(j - i, -k, k) + k],   w^K, w^V in R^{(2k+1) x D}
    e_ij^h = q_i^h . (k_j^h + a^K_ij) / sqrt(D)
    y_i^h  = sum_j alpha_ij^h (v_j^h + a^V_ij)

One pair of tables per layer, shared by all heads (Shaw's efficient form and the CSAN reference
code both share), k = 16: 2(2k+1)D parameters per attention layer (spec B.1).

Two exact forms, chosen per call by the device and the sizes (``relation_tables_pay``), never an [b, h, i, j, d]
tensor:
- relation tables (Shaw's Section 3.3): a^K, a^V as [i, j, d] tables looked up from w^K, w^V; the key term is
  q . a^K and the value term alpha . a^V, each one matrix product batched over the query positions i. No gather
  or scatter over the scores: on CUDA those are atomic additions that collide (every key beyond the clipping
  distance adds into the same edge bucket). Taken off the CPU where the tables are no larger than the
  [b, h, i, j] scores (d <= b * h: every training batch of the recipes).
- distance buckets: the key term is q . (w^K)^T -> [b, h, i, 2k+1], gathered at the relative index; the value
  term scatter-adds alpha into the 2k+1 distance buckets and multiplies by w^V. O(b h i (j + 2k+1)) memory with
  nothing of size i * j * d. The CPU's form (level there; CPU runs stay as before), and elsewhere the form for
  one long sequence or a beam search over fewer sentences than d / (h * beam) (one sentence at h = 8, d = 64,
  beam 5).
The relative index comes from the explicit absolute positions, so the part is decoder-capable and incremental
(a cached step at position t uses clip(j - t) for j <= t).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention.parts.rel_pos_config import RelPosConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


def relative_index(q_pos: Tensor, k_pos: Tensor, max_distance: int) -> Tensor:
    """[i, j] table row index clip(k_pos[j] - q_pos[i], -k, k) + k, in 0 .. 2k."""
    offset = k_pos[None, :] - q_pos[:, None]  # [i, j]
    return offset.clamp(-max_distance, max_distance) + max_distance  # [i, j]


def relation_tables_pay(*, batch_heads: int, head_dim: int, device: torch.device) -> bool:
    """Whether to take the relation tables: off the CPU (on CUDA, scatter_add and gather's backward are atomic
    additions), where the [i, j, d] tables are no larger than the [b, h, i, j] scores (d <= b * h), so the table
    form costs no more memory than the attention itself; else the distance buckets (module docstring). On the CPU
    the two were level (a Multi30k Rel_Pos update and beam search, within the bench's 2%:
    results/rel-pos-tables-cpu-2026-12-02.md), and the buckets keep CPU runs bit-identical to those trained
    before the tables (results/rel-pos-buckets-cpu-2026-12-02.md)."""
    return device.type != "cpu" and head_dim <= batch_heads


class RelativePositions(AttentionPart):
    """Adds q . a^K_ij / sqrt(D) to the scores and sum_j alpha_ij a^V_ij to the head outputs."""

    def __init__(self, *, head_dim: int, max_distance: int):
        super().__init__()
        self.max_distance = max_distance
        self.scale = head_dim ** -0.5
        rows = 2 * max_distance + 1
        # Shaw et al. do not state the init; Xavier-uniform keeps a^K on the scale of the keys.
        self.key_table = nn.Parameter(nn.init.xavier_uniform_(torch.empty(rows, head_dim)))    # [2k+1, d]
        self.value_table = nn.Parameter(nn.init.xavier_uniform_(torch.empty(rows, head_dim)))  # [2k+1, d]

    def _index(self, ctx: AttentionContext) -> Tensor:
        # the same for every layer over these positions: made once (Positions.once)
        return ctx.positions.once(("relative index", self.max_distance),
                                  lambda: relative_index(ctx.q_pos, ctx.k_pos, self.max_distance))  # [i, j]

    def score(self, scores: Tensor, ctx: AttentionContext) -> Tensor:
        b, h, i, j = scores.shape
        index = self._index(ctx)  # [i, j]
        if relation_tables_pay(batch_heads=b * h, head_dim=ctx.head_dim, device=scores.device):
            # looked up in the table's own dtype, cast after: the lookup's backward sums i*j gradients into 2k+1
            # rows, which bf16 cannot hold (under autocast the cast is what the matrix product casts anyway)
            key_rel = F.embedding(index, self.key_table).to(ctx.q.dtype)  # a^K [i, j, d]
            q_by_position = ctx.q.permute(2, 0, 1, 3).reshape(i, b * h, -1)  # [i, b*h, d]
            by_key = torch.bmm(q_by_position, key_rel.transpose(1, 2))  # [i, b*h, j]
            return torch.add(scores, by_key.view(i, b, h, j).permute(1, 2, 0, 3), alpha=self.scale)
        # over q as the projection laid it out ([b, i, h, d], contiguous): one matrix product, no copy of q
        by_distance = torch.matmul(ctx.q.transpose(1, 2), self.key_table.to(ctx.q.dtype).t()).transpose(1, 2)
        return torch.add(scores, torch.gather(by_distance, -1, index.expand(b, h, i, j)), alpha=self.scale)

    def values(self, out: Tensor, weights: Tensor, ctx: AttentionContext) -> Tensor:
        b, h, i, j = weights.shape
        d = out.shape[-1]
        index = self._index(ctx)  # [i, j]
        if relation_tables_pay(batch_heads=b * h, head_dim=d, device=out.device):
            value_rel = F.embedding(index, self.value_table).to(out.dtype)  # a^V [i, j, d], as a^K
            weights_by_position = weights.permute(2, 0, 1, 3).reshape(i, b * h, j).to(out.dtype)  # [i, b*h, j]
            by_value = torch.bmm(weights_by_position, value_rel)  # [i, b*h, d]
            return out + by_value.view(i, b, h, d).permute(1, 2, 0, 3)
        buckets = weights.new_zeros(b, h, i, 2 * self.max_distance + 1)  # [b, h, i, 2k+1]
        buckets = buckets.scatter_add(-1, index.expand(b, h, i, j), weights)  # [b, h, i, 2k+1]
        # out + buckets @ w^V as one matrix product over the rows [b*h*i, ...]
        rows = buckets.view(-1, buckets.shape[-1]).to(out.dtype)  # [b*h*i, 2k+1]
        return torch.addmm(out.reshape(-1, d), rows, self.value_table.to(out.dtype)).view(b, h, i, d)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}"


def build_rel_pos(config: RelPosConfig, ctx: BuildContext) -> RelativePositions:
    if ctx.side == "cross" and not config.cross:
        raise ValueError("rel_pos in encoder-decoder attention is not Shaw et al.'s method; "
                         "set cross: true to use relative positions (source minus target position) there")
    return RelativePositions(head_dim=ctx.head_dim, max_distance=config.max_distance)
