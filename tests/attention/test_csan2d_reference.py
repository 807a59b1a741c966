"""2D-CSAN against a reference written from the paper's equations, on both plans, values and gradients.

Yang et al., "Convolutional Self-Attention Network", arXiv 1810.13320, Eq. 6-8 (spec locality-variants.md
A.2), with n = (N-1)/2 and m = (M-1)/2:

    e_ij^{hs}     = (x_i W_Q^h) (x_j W_K^s)^T / sqrt(D)
    alpha_ij^{hs} = exp(e_ij^{hs}) / sum_{k=h-n}^{h+n} sum_{t=i-m}^{i+m} exp(e_it^{hk})
    y_i^h         = sum_{s=h-n}^{h+n} sum_{j=i-m}^{i+m} alpha_ij^{hs} (x_j W_V^s)

The reference below loops over sentences, queries, query heads and the N x M area one (key head, value
head, key position) triple at a time. It shares only the projection weights with the module; the head-axis
boundary is spec A.3's table, out-of-range and padded keys leave the area (A.1, A.4), and a decoder query
keeps [i-m, i] or [i-2m, i] (A.7). Padded queries give 0 before W_O (spec 0.2).
"""

import math

import pytest
import torch

from sanlab.attention import Positions, banded
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.registry import BuildContext
from tests_helpers import spy_plans

LENGTHS = (7, 5, 2)  # real lengths of the batch rows; padded to 7
HEAD_DIM = 3


def _key_positions(i: int, *, m: int, length: int, causal: bool, causal_window: str) -> list[int]:
    """W_b(i): the keys of the time window of query i that exist in sentence b (spec A.1, A.7)."""
    if causal:
        left = 2 * m if causal_window == "full" else m
        return [j for j in range(i - left, i + 1) if 0 <= j < length]
    return [j for j in range(i - m, i + m + 1) if 0 <= j < length]


def _head_pairs(h: int, *, n: int, heads: int, boundary: str) -> list[tuple[int, int]]:
    """(head of the keys, head of the values) for each slot s = h-n .. h+n of query head h (spec A.3)."""
    pairs = []
    for s in range(h - n, h + n + 1):
        if boundary == "wrap":      # heads on a ring
            pairs.append((s % heads, s % heads))
        elif boundary == "clip":    # heads outside [0, H-1] do not exist
            if 0 <= s < heads:
                pairs.append((s, s))
        else:                       # released code: keys rolled, values repeat the edge head
            pairs.append((s % heads, min(max(s, 0), heads - 1)))
    return pairs


def reference_2d_csan(attn, x: torch.Tensor, lengths: tuple[int, ...], *, area: int, size: int, boundary: str,
                      causal: bool, causal_window: str) -> torch.Tensor:
    """Eq. 6-8 by loops, with the projections of ``attn``: x [b, i, dim] -> [b, i, dim]."""
    b_size, length, _ = x.shape
    heads, d = attn.heads, attn.head_dim
    n, m = (area - 1) // 2, (size - 1) // 2
    q = attn.q_proj(x).view(b_size, length, heads, d)  # [b, i, h, d]
    k = attn.k_proj(x).view(b_size, length, heads, d)  # [b, j, s, d]
    v = attn.v_proj(x).view(b_size, length, heads, d)  # [b, j, s, d]
    rows = []
    for b in range(b_size):
        for i in range(length):
            for h in range(heads):
                if i >= lengths[b]:  # padded query
                    rows.append(x.new_zeros(d))
                    continue
                cells = [(ks, vs, j) for ks, vs in _head_pairs(h, n=n, heads=heads, boundary=boundary)
                         for j in _key_positions(i, m=m, length=lengths[b], causal=causal,
                                                 causal_window=causal_window)]
                k_heads, v_heads, keys = (torch.tensor(column) for column in zip(*cells))
                energies = k[b, keys, k_heads] @ q[b, i, h] / math.sqrt(d)  # [cells]: e_ij^{hs} per cell
                alpha = torch.softmax(energies, dim=0)  # one distribution over the whole N x M area
                rows.append(alpha @ v[b, keys, v_heads])  # [d]: sum over cells of alpha_ij^{hs} v_j^s
    y = torch.stack(rows).view(b_size, length, heads * d)  # [b, i, h*d]
    return attn.out_proj(y)


SIDES = {"encoder": ("encoder", "half"), "decoder-half": ("decoder", "half"), "decoder-full": ("decoder", "full")}


@pytest.mark.parametrize("heads, area, size", [(4, 3, 5), (5, 5, 3)], ids=["H4-N3-M5", "H5-N5-M3"])
@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("boundary", ["wrap", "clip", "reference"])
def test_both_plans_equal_the_paper_equations_in_values_and_gradients(boundary, side, heads, area, size,
                                                                      monkeypatch):
    monkeypatch.setattr(banded, "BLOCK", 3)  # several query blocks over the 7 positions
    stack_side, causal_window = SIDES[side]
    causal = stack_side == "decoder"
    dim = heads * HEAD_DIM
    ctx = BuildContext(dim=dim, heads=heads, layer_index=0, num_layers=1, side=stack_side, max_len=16)
    part = {"type": "csan2d", "size": size, "heads_area": area, "head_boundary": boundary,
            "causal_window": causal_window, "layers": None}
    torch.manual_seed(0)
    dense = build_attention(AttentionConfig(heads=heads, plan="dense", parts=[part]), ctx).double()
    fast = build_attention(AttentionConfig(heads=heads, plan="banded", parts=[part]), ctx).double()
    fast.load_state_dict(dense.state_dict())

    g = torch.Generator().manual_seed(heads * 10 + size)
    length = max(LENGTHS)
    x = torch.randn(len(LENGTHS), length, dim, generator=g, dtype=torch.float64)
    probe = torch.randn(len(LENGTHS), length, dim, generator=g, dtype=torch.float64)
    valid = torch.arange(length)[None, :] < torch.tensor(LENGTHS)[:, None]  # [b, i]
    positions = Positions.self_attention(valid, length=length, causal=causal)

    def run(forward, module):
        xi = x.clone().requires_grad_(True)
        out = forward(xi)
        names, params = zip(*module.named_parameters())
        grads = torch.autograd.grad((out * probe).sum(), (xi, *params))
        return out, grads[0], dict(zip(names, grads[1:]))

    expected = run(lambda xi: reference_2d_csan(dense, xi, LENGTHS, area=area, size=size, boundary=boundary,
                                                causal=causal, causal_window=causal_window), dense)
    with spy_plans() as ran:
        for module in (dense, fast):
            out, dx, dparams = run(lambda xi: module(xi, positions=positions).output, module)
            torch.testing.assert_close(out, expected[0])
            torch.testing.assert_close(dx, expected[1])
            assert dparams.keys() == expected[2].keys()
            for name, grad in dparams.items():
                torch.testing.assert_close(grad, expected[2][name], msg=lambda msg: f"{name}: {msg}")
    assert ran == ["dense", "banded"]  # each module ran the plan it asked for: banded is not compared with dense
