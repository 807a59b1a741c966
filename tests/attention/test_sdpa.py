"""The sdpa plan hands causality and key padding to the fused kernel without a [b, h, i, j] mask where it can,
equals the dense plan in values and gradients (also for cached decoding steps, whose queries sit after the
keys: torch's ``is_causal`` aligns top-left, so it is used only without a cache offset), and on the CPU
computes bit for bit what the materialised masks computed before."""

import pytest
import torch
import torch.nn.functional as F

from sanlab.attention import Attention, AttentionContext, Positions, plans
from sanlab.attention.plans import StageParts
from tests_helpers import spy_plans

B, HEADS, DIM = 3, 4, 16


def _valid(lengths, total) -> torch.Tensor:
    return torch.arange(total)[None] < torch.tensor(lengths)[:, None]  # [b, j]


# (name, positions of the queries (6, 1 or 2 of them) over 6 keys, how many queries, what the kernel gets:
# the shape of attn_mask and is_causal)
FULL, STEP, CHUNK = 6, 1, 2
CASES = [
    ("encoder", lambda: Positions.self_attention(None, length=FULL), FULL, (None, False)),
    ("encoder-padded", lambda: Positions.self_attention(_valid((6, 4, 1), 6), length=FULL), FULL,
     ((B, 1, 1, 6), False)),
    ("encoder-empty-sentence", lambda: Positions.self_attention(_valid((6, 0, 2), 6), length=FULL), FULL,
     ((B, 1, 1, 6), False)),
    ("decoder", lambda: Positions.self_attention(None, length=FULL, causal=True), FULL, (None, True)),
    ("decoder-step", lambda: Positions.self_attention(None, length=STEP, offset=5, causal=True), STEP, (None, False)),
    ("decoder-step-padded", lambda: Positions.self_attention(_valid((6, 4, 6), 6), length=STEP, offset=5, causal=True),
     STEP, ((B, 1, 1, 6), False)),
    ("decoder-chunk", lambda: Positions.self_attention(None, length=CHUNK, offset=4, causal=True), CHUNK,
     ((1, 1, 2, 6), False)),
    ("decoder-padded", lambda: Positions.self_attention(_valid((6, 4, 1), 6), length=FULL, causal=True), FULL,
     ((B, 1, 6, 6), False)),  # SDPA takes no is_causal with a mask: one [b, 1, i, j] mask, as before
    ("cross-padded", lambda: Positions.cross_attention(Positions.self_attention(None, length=FULL),
                                                       _valid((6, 3, 5), 6), memory_length=6), FULL,
     ((B, 1, 1, 6), False)),
]


def _spy(monkeypatch) -> list:
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append((None if attn_mask is None else tuple(attn_mask.shape), is_causal))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def _inputs(queries: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(queries)
    q = torch.randn(B, HEADS, queries, 5, generator=g, dtype=dtype)
    k, v = (torch.randn(B, HEADS, 6, 5, generator=g, dtype=dtype) for _ in range(2))
    probe = torch.randn(B, HEADS, queries, 5, generator=g, dtype=dtype)
    return q, k, v, probe


def _grads(plan, q, k, v, probe, positions):
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    ctx = AttentionContext(positions=positions, heads=HEADS, head_dim=5, q=q, k=k)
    out = plan(q, k, v, ctx, parts=StageParts(), scale=0.4, dropout=0.0, training=False)
    (out * probe).sum().backward()
    return out, q.grad, k.grad, v.grad


@pytest.mark.parametrize("name, positions, queries, expected", CASES, ids=[c[0] for c in CASES])
def test_sdpa_passes_masks_to_the_kernel_and_equals_dense(name, positions, queries, expected, monkeypatch):
    q, k, v, probe = _inputs(queries)
    calls = _spy(monkeypatch)
    fused = _grads(plans.sdpa, q, k, v, probe, positions())
    reference = _grads(lambda *a, **kw: plans.dense(*a, trace=None, **kw), q, k, v, probe, positions())
    assert calls == [expected]
    for got, want in zip(fused, reference):
        torch.testing.assert_close(got, want)


def _before(q, k, v, ctx, *, parts, scale, dropout, training):
    """The sdpa plan as it was: the combined mask expanded to [b, h|1, i, j], empty rows opened and zeroed."""
    allowed = plans.visibility(ctx, parts)
    empty = None
    if allowed is not None:
        allowed = allowed.expand(q.shape[0], -1, q.shape[2], k.shape[2])
        empty = ~allowed.any(dim=-1, keepdim=True)
        allowed = allowed | empty
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=0.0, scale=scale)
    return out if empty is None else out.masked_fill(empty, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name, positions, queries, expected", CASES, ids=[c[0] for c in CASES])
def test_on_the_cpu_the_results_are_those_of_the_materialised_masks_bit_for_bit(name, positions, queries,
                                                                               expected, dtype):
    q, k, v, probe = _inputs(queries, dtype)
    for got, want in zip(_grads(plans.sdpa, q, k, v, probe, positions()),
                         _grads(_before, q, k, v, probe, positions())):
        assert torch.equal(got, want)


def test_cached_decoding_with_sdpa_equals_the_full_dense_forward():
    dense = Attention(dim=DIM, heads=HEADS, plan="dense").double().eval()
    fused = Attention(dim=DIM, heads=HEADS, plan="sdpa").double().eval()
    fused.load_state_dict(dense.state_dict())
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    for valid in (None, torch.tensor([[True] * 7, [True] * 5 + [False] * 2])):
        with torch.no_grad():
            full = dense(x, positions=Positions.self_attention(valid, length=7, causal=True)).output
            cache, steps, start = None, [], 0
            with spy_plans() as ran:
                for size in (3, 1, 2, 1):
                    keys = None if valid is None else valid[:, :start + size]
                    pos = Positions.self_attention(keys, length=size, offset=start, causal=True)
                    result = fused(x[:, start:start + size], positions=pos, cache=cache, use_cache=True)
                    cache, start = result.cache, start + size
                    steps.append(result.output)
        assert ran == ["sdpa"] * 4
        torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_positions_built_by_hand_fall_back_to_the_materialised_mask(monkeypatch):
    calls = _spy(monkeypatch)
    q, k, v, probe = _inputs(FULL)
    hand = Positions(q_pos=torch.arange(FULL), k_pos=torch.arange(FULL), causal=True)  # no layout promised
    fused = _grads(plans.sdpa, q, k, v, probe, hand)
    reference = _grads(lambda *a, **kw: plans.dense(*a, trace=None, **kw), q, k, v, probe, hand)
    assert calls == [((B, 1, FULL, FULL), False)]
    for got, want in zip(fused, reference):
        torch.testing.assert_close(got, want)
