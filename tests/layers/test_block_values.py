"""Values and gradients of the Block mixer (spec B.5) against hand-written references.

The references below are written from the equations (Shen et al. 2018b, arXiv 1804.00857, Sec. 4, as
restated in spec B.5 for ``block_mode: bibosan``; spec B.5 "CSAN author's multi-head simplification"
for ``block_mode: reference``), NOT from ``sanlab.layers.block_attention``. They loop over the *real*
tokens of each sentence only: a block is simply the list of real token indices it holds, so padding
(a short last block, a padded batch row, a fully padded block) is handled by never creating the
padded tokens at all rather than by masks. Padded output rows are zero (spec 0.2).

Weights are read from the module by parameter name and copied into leaf tensors, so values and the
gradients of (out * probe).sum() w.r.t. the input and *every* parameter can be compared.

Ambiguities of the spec and how they are resolved here:
* bibosan, W_1 / W_2 of f_pq: W_1 acts on the key x~_q, W_2 on the query x~_p (spec B.5 step 3;
  DiSAN's "dependent" / "head"); the module stores them as one ``key_query`` linear, first half W_1.
* bibosan, fusion gate of the inter-block DiSA: e = F * v~ + (1 - F) * o with
  F = sigmoid(W_a v~ + b_a + W_b o + b_b + b) (spec B.5 step 5; the extra bias b is DiSAN's o_bias).
* bibosan: fully padded blocks do not exist (spec B.5 choice: padded blocks masked in step 5).
* reference: the spec's sigma in Linear_{d->H}(sigma(Linear_{d->d}(intra))) is the logistic sigmoid,
  and the inter-block dot product is scaled by 1/sqrt(D) like the intra-block one (both as in the
  released ``layers/attention_block.py``); padded tokens are excluded from the block summary and
  padded blocks from the inter-block attention (spec 0.2: key padding masked for every variant).
  The spec fixes blocks of 4; the module accepts any block length, and the same equations are
  checked for lengths 2, 3 and 4.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from sanlab.attention import Positions
from sanlab.attention.config import AttentionConfig
from sanlab.layers.block_attention import BlockSelfAttention
from sanlab.layers.mixers import MIXERS
from sanlab.registry import BuildContext

DIM, HEADS = 8, 2


def _valid(t, lengths):
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # [b, t]


def _build(mode, block_len):
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=1, side="encoder", max_len=32)
    config = MIXERS.parse({"type": "block", "block_mode": mode, "block_len": block_len})
    mixer = MIXERS.build(config, ctx, attention=AttentionConfig(heads=HEADS)).double()
    assert isinstance(mixer, BlockSelfAttention)
    with torch.no_grad():  # random everything, so zero-initialised biases are exercised too
        for p in mixer.parameters():
            p.normal_(0.0, 0.5)
    return mixer


class _Params(dict):
    """Leaf copies of the module's parameters; remembers which names the reference read."""

    def __init__(self, module):
        super().__init__({n: p.detach().clone().requires_grad_(True) for n, p in module.named_parameters()})
        self.used = set()

    def __getitem__(self, name):
        self.used.add(name)
        return super().__getitem__(name)

    def linear(self, name, v):
        return self[name + ".weight"] @ v + self[name + ".bias"]


def _blocks(length, r):
    """Real token indices of each block: [[0..r-1], [r..2r-1], ..., [.., length-1]] (last one may be short)."""
    return [list(range(s, min(s + r, length))) for s in range(0, length, r)]


# ----------------------------------------------------------------------------- Bi-BloSAN reference
def _feature_attention(vectors, w_key, w_query, f_bias, direction):
    """DiSAN multi-dimensional token2token attention over a list of vectors (spec B.5 step 3, B.7):
    y_p = sum_{q visible from p} softmax_q(5 tanh((W_1 x_q + W_2 x_p + b_f) / 5)) * x_q, per feature;
    fw sees q < p, bw sees q > p; no visible key gives 0."""
    out = []
    for p in range(len(vectors)):
        keys = [q for q in range(len(vectors)) if (q < p if direction == "forward" else q > p)]
        if not keys:
            out.append(torch.zeros_like(vectors[p]))
            continue
        f = torch.stack([5.0 * torch.tanh((w_key @ vectors[q] + w_query @ vectors[p] + f_bias) / 5.0)
                         for q in keys])  # [keys, c]
        a = torch.softmax(f, dim=0)  # per feature, over the keys
        out.append(sum(a[k] * vectors[q] for k, q in enumerate(keys)))
    return out


def _bibosan_direction(x, P, pre, direction, r):
    """One direction of Bi-BloSA for one sentence x (list of real token vectors) -> list of [c] vectors."""
    c = DIM // 2
    x_map = [F.elu(P.linear(pre + "map", x_p)) for x_p in x]  # step 2: x~_p
    w = P[pre + "intra.key_query.weight"]
    h, summaries = [None] * len(x), []
    for block in _blocks(len(x), r):
        # step 3: intra-block masked multi-dimensional attention
        h_block = _feature_attention([x_map[p] for p in block], w[:c], w[c:], P[pre + "intra.f_bias"], direction)
        for p, h_p in zip(block, h_block):
            h[p] = h_p
        # step 4: source2token block summary, softmax over the block's tokens per feature
        g = torch.stack([P.linear(pre + "summary", h_p) for h_p in h_block])  # [tokens, c]
        a = torch.softmax(g, dim=0)
        summaries.append(sum(a[k] * h_p for k, h_p in enumerate(h_block)))
    # step 5: inter-block DiSA over the block summaries (own ELU map, feature attention, fusion gate)
    v_map = [F.elu(P.linear(pre + "inter.map", v)) for v in summaries]
    w = P[pre + "inter.attend.key_query.weight"]
    o = _feature_attention(v_map, w[:c], w[c:], P[pre + "inter.attend.f_bias"], direction)
    e = []
    for v_l, o_l in zip(v_map, o):
        gate = torch.sigmoid(P.linear(pre + "inter.gate_x", v_l) + P.linear(pre + "inter.gate_s", o_l)
                             + P[pre + "inter.gate_bias"])
        e.append(gate * v_l + (1 - gate) * o_l)
    # step 6: context fusion of token p in block l
    out = []
    for l, block in enumerate(_blocks(len(x), r)):
        for p in block:
            z = P.linear(pre + "fuse", torch.cat([x_map[p], h[p], e[l]]))
            u, gamma = z[:c], z[c:]
            out.append(torch.sigmoid(gamma) * F.elu(u) + (1 - torch.sigmoid(gamma)) * x_map[p])
    return out


def _bibosan_reference(x, lengths, P, r):
    b, t, _ = x.shape
    rows = []
    for s in range(b):
        tokens = [x[s, i] for i in range(lengths[s])]
        fw = _bibosan_direction(tokens, P, "core.directions.0.", "forward", r)
        bw = _bibosan_direction(tokens, P, "core.directions.1.", "backward", r)
        real = [torch.cat([f, g]) for f, g in zip(fw, bw)]  # step 7: [fw; bw]
        rows.append(torch.stack(real + [torch.zeros(DIM, dtype=x.dtype)] * (t - lengths[s])))
    return torch.stack(rows)


# ----------------------------------------------------------------------------- reference-mode reference
def _csan_block_reference(x, lengths, P, r):
    """The CSAN author's block attention (spec B.5), one sentence and one head at a time."""
    b, t, d = x.shape
    D = d // HEADS
    heads = [slice(k * D, (k + 1) * D) for k in range(HEADS)]
    rows = []
    for s in range(b):
        n = lengths[s]
        qkv = [P.linear("core.qkv", x[s, i]) for i in range(n)]
        q, k, v = [z[:d] for z in qkv], [z[d:2 * d] for z in qkv], [z[2 * d:] for z in qkv]
        blocks = _blocks(n, r)
        # intra-block scaled dot product per head, every real token of the block visible (no direction)
        intra = [None] * n  # intra[p] = concat over heads, [d]
        for block in blocks:
            for p in block:
                per_head = []
                for hs in heads:
                    logits = torch.stack([q[p][hs] @ k[j][hs] / math.sqrt(D) for j in block])
                    a = torch.softmax(logits, dim=0)
                    per_head.append(sum(a[m] * v[j][hs] for m, j in enumerate(block)))
                intra[p] = torch.cat(per_head)
        # per-head block summary: weights softmax_p of Linear_{d->H}(sigmoid(Linear_{d->d}(intra_p)))[head]
        summary = []  # summary[l] = concat over heads, [d]
        for block in blocks:
            logits = torch.stack([P.linear("core.summary_logits", torch.sigmoid(P.linear("core.summary_hidden",
                                                                                         intra[p])))
                                  for p in block])  # [tokens, H]
            per_head = []
            for h, hs in enumerate(heads):
                a = torch.softmax(logits[:, h], dim=0)
                per_head.append(sum(a[m] * intra[p][hs] for m, p in enumerate(block)))
            summary.append(torch.cat(per_head))
        # inter-block: queries Linear_{d->d}(summaries), keys = values = summaries, per head, all blocks
        e = []
        for l in range(len(blocks)):
            bq = P.linear("core.block_query", summary[l])
            per_head = []
            for hs in heads:
                logits = torch.stack([bq[hs] @ summary[m][hs] / math.sqrt(D) for m in range(len(blocks))])
                a = torch.softmax(logits, dim=0)
                per_head.append(sum(a[m] * summary[m][hs] for m in range(len(blocks))))
            o = torch.cat(per_head)
            gate = torch.sigmoid(P.linear("core.gate", torch.cat([summary[l], o])))  # G = sigma(W[v; o])
            e.append(gate * o + (1 - gate) * summary[l])  # e = G o + (1 - G) v
        # per-head concat [intra; e] -> output projection 2d -> d
        out = []
        for l, block in enumerate(blocks):
            for p in block:
                cat = torch.cat([torch.cat([intra[p][hs], e[l][hs]]) for hs in heads])
                out.append(P.linear("core.out", cat))
        rows.append(torch.stack(out + [torch.zeros(d, dtype=x.dtype)] * (t - n)))
    return torch.stack(rows)


# ----------------------------------------------------------------------------- comparison
CASES = [  # (padded length, real lengths, block length)
    (7, (7, 5, 4), 3),  # 7 = 2*3+1: short last block (1 token), 5: block of 2, 4: a fully padded block
    (5, (5, 2), 2),     # single-token last block; a one-block sentence (no earlier/later block)
]


def _check(mode, reference, t, lengths, r):
    torch.manual_seed(1)
    mixer = _build(mode, r)
    assert mixer.resolve_block_len(Positions.self_attention(_valid(t, lengths), length=t)) == r
    x = torch.randn(len(lengths), t, DIM, dtype=torch.double)
    for s, n in enumerate(lengths):
        x[s, n:] = 30.0  # garbage at padded positions: must not reach any real output
    probe = torch.randn(len(lengths), t, DIM, dtype=torch.double)

    x_mod = x.clone().requires_grad_(True)
    out = mixer(x_mod, positions=Positions.self_attention(_valid(t, lengths), length=t)).output
    (out * probe).sum().backward()

    P = _Params(mixer)
    x_ref = x.clone().requires_grad_(True)
    expected = reference(x_ref, list(lengths), P, r)
    (expected * probe).sum().backward()

    assert P.used == set(P), f"parameters the reference never read: {sorted(set(P) - P.used)}"
    half = DIM // 2
    if mode == "bibosan":  # compare the direction halves separately so a failure names the direction
        torch.testing.assert_close(out[..., :half], expected[..., :half], msg=lambda m: "forward half\n" + m)
        torch.testing.assert_close(out[..., half:], expected[..., half:], msg=lambda m: "backward half\n" + m)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x_mod.grad, x_ref.grad, msg=lambda m: "d/d input\n" + m)
    for name, p in mixer.named_parameters():
        torch.testing.assert_close(p.grad, P[name].grad, msg=lambda m, name=name: f"d/d {name}\n" + m)
    for s, n in enumerate(lengths):  # padding: zero outputs, zero input gradients
        assert torch.all(out[s, n:] == 0) and torch.all(x_mod.grad[s, n:] == 0)


@pytest.mark.parametrize("t, lengths, r", CASES)
def test_bibosan_values_and_gradients_match_the_equations(t, lengths, r):
    _check("bibosan", _bibosan_reference, t, lengths, r)


@pytest.mark.parametrize("t, lengths, r", CASES + [(7, (7, 5), 4)])
def test_reference_mode_values_and_gradients_match_the_equations(t, lengths, r):
    _check("reference", _csan_block_reference, t, lengths, r)


def test_bibosan_directions_really_are_directional():
    """Sanity of the reference itself: in the forward half, block 0 only sees block 0 (no earlier block
    and q < p inside), so changing a later token leaves it unchanged, while the backward half changes."""
    torch.manual_seed(2)
    mixer = _build("bibosan", 3)
    P = _Params(mixer)
    x = torch.randn(1, 7, DIM, dtype=torch.double)
    changed = x.clone()
    changed[0, 5] += 1.0
    with torch.no_grad():
        a, b = _bibosan_reference(x, [7], P, 3), _bibosan_reference(changed, [7], P, 3)
    half = DIM // 2
    torch.testing.assert_close(a[0, :3, :half], b[0, :3, :half])
    assert not torch.allclose(a[0, :3, half:], b[0, :3, half:])
