"""Duan, Cao, Zhao, "Capsule-Transformer for Neural Machine Translation", https://arxiv.org/abs/2004.14649,
Eq. 8-14 (``docs/spec/capsule-routing.md`` sections 4-8): capsule routing self-attention, part ``type: capsule``.

The attention cube E [b, h, i, j] is routed two ways, in parallel, and both output cubes are added to
the scores before the mask and softmax:

    E' = E + Ver + Hor                        encoder (Ver: vertical routing + acceptance, Eq. 10-11)
    E' = E + Hor                              decoder (masked routing, no vertical part, no parameters)

Ver[b, h, i, :] = a[b, h, i] * v[b, i, :] with a[b, :, i] = W gamma[b, :, i] + bias (one H x H matrix and
bias per encoder layer); Hor is the positional (prefix) routing of ``routing.positional_routing``.
Routing runs in fp32 even under autocast. Cross-attention is never modified.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sanlab.attention import routing
from sanlab.attention.masks import at_least_fp32, masked_softmax
from sanlab.attention.parts.capsule_config import CapsuleConfig
from sanlab.attention.parts_base import AttentionContext, AttentionPart
from sanlab.registry import BuildContext


class NoRouting(AttentionPart):
    """Both routings switched off (``use_vertical = use_horizontal = false``, or vertical-only in the
    decoder): exactly plain attention, with no hook, so the fused plan stays available."""


class CapsuleRouting(AttentionPart):
    """Adds Ver + Hor to the scores of a self-attention (the ``score`` stage).

    Decoding (spec section 8): row t routes over the cube rows of every earlier query, which cached
    keys/values alone do not give, so the part keeps those rows itself ([b, h, t, t], one row and one
    zero column more each step) and routes only the new rows: O(R·H·t²) a step instead of recomputing
    the prefix. Vertical and global routing let every token see every other one, so a part with either
    is not causal-safe, and not incremental.
    """

    square_keys = True  # routes over the [i, j] score matrix of one sequence

    def __init__(self, *, heads: int, iters: int, routing_input: str, vertical: bool, horizontal: str | None,
                 acceptance_init: str = "xavier", acceptance_act: str = "none", detach_logits: bool = False):
        super().__init__()
        self.iters, self.routing_input, self.horizontal = iters, routing_input, horizontal
        self.acceptance_act, self.detach_logits = acceptance_act, detach_logits
        self.acceptance = nn.Linear(heads, heads) if vertical else None  # W^acc, b^acc (Eq. 10)
        self.causal_safe = not vertical and horizontal != "global"
        self.incremental = self.causal_safe  # decoder routing: the new rows need only the earlier rows
        if self.acceptance is not None:
            init = {"xavier": nn.init.xavier_uniform_, "zeros": nn.init.zeros_, "identity": nn.init.eye_}
            init[acceptance_init](self.acceptance.weight)
            nn.init.zeros_(self.acceptance.bias)

    def score(self, scores: Tensor, ctx: AttentionContext) -> Tensor:
        """scores [b, h, i, j] -> scores + Ver + Hor, same dtype; routing itself in fp32 (fp64 for fp64 input).

        Self-attention: i = j, or, while decoding, i new queries after j - i cached cube rows."""
        earlier = ctx.cache.previous(self)  # [b, h, t0, t0]: the cube rows of the queries of earlier steps
        queries, keys = scores.shape[-2:]
        known = 0 if earlier is None else earlier.shape[-1]
        if known + queries != keys:
            raise ValueError(f"capsule routing needs the scores of every query against the same sequence "
                             f"(self-attention, i = j); got {queries} queries"
                             + (f" after {known} cached" if known else "") + f" and {keys} keys")
        layout_known = ctx.positions.query_start == known  # the constructors' layout: no need to read it
        if known and not layout_known and not torch.equal(ctx.q_pos, ctx.k_pos[known:]):  # rows sit at k_pos
            raise ValueError(f"capsule routing decodes the queries after its {known} cached rows; got query "
                             f"positions {ctx.q_pos.tolist()} for keys {ctx.k_pos.tolist()}")
        if ctx.causal and not self.causal_safe:
            raise ValueError("capsule routing with vertical or global horizontal routing sees later tokens; "
                             "build the part for the decoder side (horizontal positional routing only)")
        row_valid = ctx.positions.query_valid  # [b, i] or None
        wide = scores.to(at_least_fp32(scores.dtype))  # fp32, or fp64 if given fp64
        with torch.autocast(device_type=scores.device.type, enabled=False):
            cube = self.routing_cube(wide, ctx.allowed, row_valid)  # [b, h, i, j]
            if earlier is not None:  # earlier rows get a zero column: they never see the new keys
                cube = torch.cat([F.pad(earlier.to(cube.dtype), (0, queries)), cube], dim=2)  # [b, h, j, j]
            ctx.cache.keep(self, cube)  # for the next decoding step (dropped when the call keeps no cache)
            out = wide  # Ver and Hor are both routed from the same cube, in parallel (spec section 7)
            if self.acceptance is not None:  # encoder only: nothing is cached, the cube holds every row
                out = out + self.vertical(cube, row_valid)
            if self.horizontal == "positional":
                rows_at = None if earlier is None else ctx.k_pos  # None: every row, as in the full forward
                out = out + routing.positional_routing(cube, q_pos=ctx.q_pos, token_pos=rows_at, iters=self.iters,
                                                       detach_logits=self.detach_logits)
            elif self.horizontal == "global":
                out = out + routing.global_routing(cube, iters=self.iters, detach_logits=self.detach_logits)
            return out.to(scores.dtype)

    def routing_cube(self, scores: Tensor, allowed: Tensor | None, row_valid: Tensor | None) -> Tensor:
        """The routing input E-bar [b, h, i, j] (spec section 4): scores, or softmax probabilities, with
        every invisible entry and every padded query row set to 0 (never -inf: squash needs finite votes)."""
        cube = masked_softmax(scores, allowed) if self.routing_input == "probs" else scores
        keep = allowed
        if row_valid is not None:
            rows = row_valid[:, None, :, None]  # [b, 1, i, 1]
            keep = rows if keep is None else keep & rows
        return cube if keep is None else cube.masked_fill(~keep, 0.0)

    def vertical(self, cube: Tensor, row_valid: Tensor | None) -> Tensor:
        """Ver [b, h, i, j] (Eq. 9-11): head h absorbs token i's output capsule v_i by its acceptance a_hi."""
        v, gamma = routing.vertical_routing(cube, iters=self.iters, row_valid=row_valid,
                                            detach_logits=self.detach_logits)  # [b, i, j], [b, h, i]
        weight, bias = self.acceptance.weight.to(cube.dtype), self.acceptance.bias.to(cube.dtype)
        accept = F.linear(gamma.transpose(1, 2), weight, bias).transpose(1, 2)  # [b, h, i]
        if self.acceptance_act == "sigmoid":
            accept = torch.sigmoid(accept)
        return accept[..., None] * v[:, None]  # [b, h, i, j]


def build_capsule(config: CapsuleConfig, ctx: BuildContext) -> AttentionPart:
    """Encoder: vertical + horizontal (H^2 + H parameters with vertical). Decoder: masked horizontal
    positional routing only, no parameters. Cross-attention: an error (the paper routes self-attention only)."""
    where = f"{ctx.side} layer {ctx.layer_index}"
    if ctx.side == "cross":
        raise ValueError(f"capsule routing is defined for self-attention only; remove it from the cross-attention "
                         f"parts ({where})")
    decoder = ctx.side == "decoder"
    if decoder and config.use_horizontal and config.horizontal_mode == "global":
        raise ValueError(f"capsule horizontal_mode 'global' routes over future tokens and is not allowed in the "
                         f"decoder ({where}); use horizontal_mode 'positional'")
    vertical = config.use_vertical and not decoder  # the paper removes vertical routing in the decoder
    horizontal = config.horizontal_mode if config.use_horizontal else None
    if not vertical and horizontal is None:
        return NoRouting()
    return CapsuleRouting(heads=ctx.heads, iters=config.routing_iters, routing_input=config.routing_input,
                          vertical=vertical, horizontal=horizontal, acceptance_init=config.acceptance_init,
                          acceptance_act=config.acceptance_act, detach_logits=config.routing_detach_logits)
