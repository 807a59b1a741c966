"""Duan, Cao, Zhao, "Capsule-Transformer for Neural Machine Translation", https://arxiv.org/abs/2004.14649,
Eq. 6-7 (dynamic routing, after Sabour et al. 2017, https://arxiv.org/abs/1710.09829), Eq. 8-9 (vertical
routing), Eq. 12-14 (horizontal positional routing): capsule routing over the attention cube.

The paper's displayed equations are lost; the forms here follow the reconstruction in
``docs/spec/capsule-routing.md`` sections 3-6.

The routing input is an attention cube ``cube [b, h, i, j]`` whose invisible entries (padding, future)
are already zero: a zero vote adds nothing to a weighted sum nor to an agreement. Every function here is
parameter-free; the acceptance step of vertical routing (Eq. 10-11) lives in ``parts/capsule.py``.

Beside the package legend, the generic primitive ``dynamic_routing`` writes ``u`` for input capsules and
``o`` for output capsules (``D`` is the capsule length, the key axis j in every caller).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sanlab.attention.masks import masked_softmax

SQUASH_EPS = 1e-9


def squash(s: Tensor, *, dim: int = -1, eps: float = SQUASH_EPS) -> Tensor:
    """squash(s) = |s|^2 / (1 + |s|^2) * s / |s|  (Eq. 6), written ``s * sqrt(|s|^2 + eps) / (1 + |s|^2)``
    so that it is finite, and 0 with a finite gradient, at s = 0 (fully padded rows)."""
    norm2 = s.pow(2).sum(dim=dim, keepdim=True)
    return s * torch.sqrt(norm2 + eps) / (1.0 + norm2)


def dynamic_routing(votes: Tensor, *, iters: int, output_valid: Tensor | None = None,
                    detach_logits: bool = False) -> tuple[Tensor, Tensor]:
    """Routing-by-agreement (Sabour et al. Procedure 1; the paper's Eq. 6-7).

    votes [..., u, o, D]: the vote of input capsule u for output capsule o. The coupling of each input
    is a softmax over the OUTPUT capsules; ``output_valid`` (broadcastable to [..., u, o]) removes outputs
    from that softmax (an input with no valid output gets coupling 0, not NaN).
    Returns the output capsules [..., o, D] and the couplings [..., u, o] of the last iteration.
    """
    logits = votes.new_zeros(votes.shape[:-1])  # [..., u, o]
    for step in range(iters):
        coupling = masked_softmax(logits, output_valid)  # [..., u, o]
        outputs = squash(torch.einsum("...uo,...uoD->...oD", coupling, votes))  # [..., o, D]
        if step + 1 < iters:  # the last agreement would never be used
            agreement = torch.einsum("...uoD,...oD->...uo", votes, outputs)  # [..., u, o]
            logits = logits + (agreement.detach() if detach_logits else agreement)
    return outputs, coupling


def vertical_routing(cube: Tensor, *, iters: int, row_valid: Tensor | None = None,
                     detach_logits: bool = False) -> tuple[Tensor, Tensor]:
    """Head-wise routing (Eq. 8-9): H input capsules (heads), I output capsules (tokens).

    Head h votes with its row i, ``cube[b, h, i, :]``, for output capsule i; each head's coupling is a
    softmax over tokens, from which padded query rows (``row_valid`` [b, i] False) are excluded so that
    real tokens do not depend on the amount of padding in the batch (spec A10).
    Returns v [b, i, j] (one output capsule per token) and gamma [b, h, i] (last-iteration couplings).
    """
    valid = None if row_valid is None else row_valid[:, None, :]  # [b, 1, i]
    return dynamic_routing(cube, iters=iters, output_valid=valid, detach_logits=detach_logits)


def positional_routing(cube: Tensor, *, q_pos: Tensor, iters: int, token_pos: Tensor | None = None,
                       detach_logits: bool = False) -> Tensor:
    """Horizontal positional routing (Eq. 12-14), all prefixes at once (spec 6.3).

    ``cube`` [b, h, t, j] has one row per token, at positions ``token_pos`` [t] (default ``q_pos``). For
    every query i at ``q_pos`` [i] a separate routing runs over the token capsules i' with
    token_pos[i'] <= q_pos[i] (I input capsules of H votes each, H output capsules). The prefix index i is
    a batch axis: logits lam [b, h, i, i'] hold token i' -> head h for prefix i; the softmax over heads
    never couples different tokens, and the prefix mask removes tokens after i from every sum. A full
    forward asks for every row (i = t; rows must then be in ascending position order, as ``Attention``
    passes them); cached decoding asks for the newest rows only, over all the token rows kept so far
    (spec section 8). Returns Hor [b, h, i, j].
    """
    heads = cube.shape[1]
    every_row = token_pos is None
    token_pos = q_pos if every_row else token_pos
    prefix = (token_pos[None, :] <= q_pos[:, None]).to(cube.dtype)  # [i, t]: token i' lies in prefix i
    # couplings are all 1/H at first: the prefix mean, a cumulative sum when every row is asked for, except under
    # deterministic algorithms (train.deterministic): CUDA's floating-point cumsum has no deterministic form
    cumulative = every_row and not torch.are_deterministic_algorithms_enabled()
    summed = cube.cumsum(dim=2) if cumulative else torch.matmul(prefix, cube)  # [b, h, i, j]
    out = squash(summed / heads)
    logits = None
    for _ in range(1, iters):
        agreement = torch.matmul(out, cube.transpose(-1, -2))  # [b, h, i, i'] = <v^(i)_h, cube[b, h, i']>
        agreement = agreement.detach() if detach_logits else agreement
        logits = agreement if logits is None else logits + agreement
        coupling = torch.softmax(logits, dim=1) * prefix  # [b, h, i, i'], softmax over heads
        out = squash(torch.matmul(coupling, cube))  # [b, h, i, j]
    return out


def positional_routing_loop(cube: Tensor, *, iters: int) -> Tensor:
    """Reference for ``positional_routing``: one ``dynamic_routing`` per prefix, in a Python loop
    (rows in position order). For tests only: I sequential routings per call."""
    rows = []
    for i in range(cube.shape[2]):
        votes = cube[:, :, : i + 1].transpose(1, 2)  # [b, i', h, j]: token i' votes for head h
        rows.append(dynamic_routing(votes, iters=iters)[0])  # [b, h, j]
    return torch.stack(rows, dim=2)  # [b, h, i, j]


def global_routing(cube: Tensor, *, iters: int, detach_logits: bool = False) -> Tensor:
    """Horizontal routing over ALL tokens at once (ablation ``horizontal_mode: global``): one routing per
    sentence, its H output capsules broadcast to every query row. Sees the future: encoder only."""
    votes = cube.transpose(1, 2)  # [b, i', h, j]
    out, _ = dynamic_routing(votes, iters=iters, detach_logits=detach_logits)  # [b, h, j]
    return out[:, :, None, :].expand_as(cube)  # [b, h, i, j]
