"""CSAN baselines as attention parts: Rel_Pos, Neighbor, Local_Hard, Local_Soft, Bi_Direct (spec B.1-B.4, B.7).

Expectations are hand-computed on tiny cases or re-derived naively (Rel_Pos with an explicit [i, j, d] tensor).
"""

import math
from dataclasses import replace

import pytest
import torch

from sanlab.attention import Attention, AttentionContext, Positions
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.parts.directional import DirectionalHeads
from sanlab.attention.parts.gaussian import LocalHard, LocalSoft, NeighborCSAN, NeighborSperber
from sanlab.attention.parts import rel_pos
from sanlab.attention.parts.rel_pos import RelativePositions, relative_index
from sanlab.attention.registry import PARTS
from sanlab.registry import BuildContext


def _ctx(*, heads=4, dim=16, b=1, length=5, valid=None, causal=False, offset=0, q_full=None):
    pos = Positions.self_attention(valid, length=length, offset=offset, causal=causal)
    q_full = torch.zeros(b, length, dim) if q_full is None else q_full
    return AttentionContext(positions=pos, heads=heads, head_dim=dim // heads, q_full=q_full)


def _fix_sigmoid(predictor, values):
    """Make a Predictor output the constants sigmoid(logit(values)) = values, whatever its input."""
    with torch.no_grad():
        predictor.out.weight.zero_()
        predictor.out.bias.copy_(torch.logit(torch.tensor(values, dtype=torch.float32)))


def _build(part_cfg, *, side="encoder", heads=4, dim=16):
    ctx = BuildContext(dim=dim, heads=heads, layer_index=0, num_layers=2, side=side, max_len=64)
    return build_attention(AttentionConfig(heads=heads, parts=[part_cfg]), ctx)


# ----------------------------------------------------------------------------- Rel_Pos
def test_relative_index_is_clipped_and_follows_absolute_positions():
    full = relative_index(torch.arange(4), torch.arange(4), 1)
    assert full.tolist() == [[1, 2, 2, 2], [0, 1, 2, 2], [0, 0, 1, 2], [0, 0, 0, 1]]
    # a cached decoding step at position 3 sees the same row as the full forward
    assert relative_index(torch.tensor([3]), torch.arange(4), 1).tolist() == [[0, 0, 0, 1]]


def _naive_rel_pos(attn: Attention, part: RelativePositions, x, positions):
    """Shaw et al. Eq. 3-4 with an explicit [i, j, d] tensor of relative embeddings."""
    b, t, _ = x.shape
    h, d = attn.heads, attn.head_dim
    q, k, v = (p(x).view(b, t, h, d).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    idx = relative_index(positions.q_pos, positions.k_pos, part.max_distance)
    a_k, a_v = part.key_table[idx], part.value_table[idx]  # [i, j, d]
    scores = torch.einsum("bhid,bhijd->bhij", q, k[:, :, None] + a_k) / math.sqrt(d)
    allowed = torch.ones(t, t, dtype=torch.bool)
    if positions.causal:
        allowed = torch.tril(allowed)
    allowed = allowed & positions.key_valid[:, None, None, :]
    alpha = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
    y = torch.einsum("bhij,bhijd->bhid", alpha, v[:, :, None] + a_v)
    y = y.transpose(1, 2).reshape(b, t, h * d) * positions.query_valid[..., None]
    return attn.out_proj(y)


@pytest.mark.parametrize("form", ["tables", "buckets"])
@pytest.mark.parametrize("causal", [False, True])
def test_rel_pos_equals_naive_materialised_form_values_and_gradients(causal, form, monkeypatch):
    """Both exact forms of the part (relation tables, distance buckets) against Shaw's equations written out."""
    chosen = []
    monkeypatch.setattr(rel_pos, "relation_tables_pay", lambda **sizes: chosen.append(sizes) or form == "tables")
    torch.manual_seed(0)
    attn = _build({"type": "rel_pos", "max_distance": 2}, side="decoder" if causal else "encoder").double()
    part = attn.parts[0]
    x = torch.randn(2, 7, 16, dtype=torch.double, requires_grad=True)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[1, 4:] = False
    pos = Positions.self_attention(valid, length=7, causal=causal)
    fast = attn(x, positions=pos).output
    naive = _naive_rel_pos(attn, part, x, pos)
    torch.testing.assert_close(fast, naive)
    wrt = [x, part.key_table, part.value_table, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
    grads = [torch.autograd.grad(out.pow(2).sum(), wrt) for out in (fast, naive)]
    for g_fast, g_naive in zip(*grads):
        torch.testing.assert_close(g_fast, g_naive)
    assert chosen and all(sizes == {"batch_heads": 2 * 4, "head_dim": 4, "device": torch.device("cpu")}
                          for sizes in chosen)


@pytest.mark.parametrize("form", ["tables", "buckets"])
def test_rel_pos_cached_decoding_equals_the_full_forward_in_both_forms(form, monkeypatch):
    """The registry's contract runs the form its sizes choose (the tables, there): here each form, token by token."""
    monkeypatch.setattr(rel_pos, "relation_tables_pay", lambda **sizes: form == "tables")
    torch.manual_seed(0)
    attn = _build({"type": "rel_pos", "max_distance": 2}, side="decoder").double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.double)
    valid = torch.ones(2, 6, dtype=torch.bool)
    full = attn(x, positions=Positions.self_attention(valid, length=6, causal=True)).output
    cache, steps = None, []
    with torch.no_grad():
        for t in range(6):
            pos = Positions.self_attention(valid[:, :t + 1], length=1, offset=t, causal=True)
            result = attn(x[:, t:t + 1], positions=pos, cache=cache, use_cache=True)
            cache = result.cache
            steps.append(result.output)
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("form", ["tables", "buckets"])
def test_rel_pos_extra_padding_leaves_real_positions_unchanged_in_both_forms(form, monkeypatch):
    """The registry's contract runs the CPU's form (the buckets): here each form, padded keys past the sentences."""
    monkeypatch.setattr(rel_pos, "relation_tables_pay", lambda **sizes: form == "tables")
    torch.manual_seed(0)
    attn = _build({"type": "rel_pos", "max_distance": 2}).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.double)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    out = attn(x, positions=Positions.self_attention(valid, length=6)).output
    longer = torch.cat([x, torch.randn(2, 3, 16, dtype=torch.double) * 5.0], dim=1)  # 3 more padded tokens
    longer[1, 4:6] = torch.randn(2, 16, dtype=torch.double) * 5.0                  # and new values in the old padding
    longer_valid = torch.cat([valid, torch.zeros(2, 3, dtype=torch.bool)], dim=1)
    out_long = attn(longer, positions=Positions.self_attention(longer_valid, length=9)).output
    torch.testing.assert_close(out_long[:, :6][valid], out[valid])


def test_rel_pos_takes_the_relation_tables_off_the_cpu_where_they_are_no_larger_than_the_scores():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert rel_pos.relation_tables_pay(batch_heads=64 * 8, head_dim=64, device=cuda)  # a training batch
    assert rel_pos.relation_tables_pay(batch_heads=8, head_dim=8, device=cuda)
    assert not rel_pos.relation_tables_pay(batch_heads=1 * 8, head_dim=64, device=cuda)  # one long sequence
    assert not rel_pos.relation_tables_pay(batch_heads=64 * 8, head_dim=64, device=cpu)  # the CPU: buckets


def test_rel_pos_parameters_are_two_clipped_tables_shared_by_heads():
    part = _build({"type": "rel_pos"}, heads=8, dim=512).parts[0]
    k, d = 16, 64
    assert sum(p.numel() for p in part.parameters()) == 2 * (2 * k + 1) * d == 4224


def test_rel_pos_in_cross_attention_needs_the_flag():
    with pytest.raises(ValueError, match="set cross: true"):
        _build({"type": "rel_pos"}, side="cross")
    assert isinstance(_build({"type": "rel_pos", "cross": True}, side="cross").parts[0], RelativePositions)


# ----------------------------------------------------------------------------- Gaussian biases
def test_local_hard_bias_matches_hand_formula_and_only_last_heads():
    part = LocalHard(dim=16, heads=4, local_heads=2, head_dim=4, window=10.0)
    _fix_sigmoid(part.predict, [0.5, 0.5])
    valid = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    bias = part.score(torch.zeros(2, 4, 5, 5), _ctx(b=2, valid=valid))
    # sentence 0: L = 5, P = (5-1)*0.5 = 2; sentence 1: L = 3, P = 1; bias = -2 (j - P)^2 / 10^2
    torch.testing.assert_close(bias[0, 3, 0], torch.tensor([-0.08, -0.02, 0.0, -0.02, -0.08]))
    torch.testing.assert_close(bias[1, 2, 4], torch.tensor([-0.02, 0.0, -0.02, -0.08, -0.18]))
    assert torch.all(bias[:, :2] == 0)  # the first H - H_loc heads are untouched


def test_a_truncated_local_hard_window_below_half_a_position_is_refused():
    """|j - c| <= D holds for no key j when the predicted centre c falls between two positions and D < 0.5: the
    query's local head would attend to nothing and give a zero output, silently. D = 0.5 always holds a key."""
    with pytest.raises(ValueError, match=r"local_hard.*window D = 0.2 with truncate: true leaves a query no key "
                                         r"when its centre falls between two positions; use D >= 0.5"):
        PARTS.parse({"type": "local_hard", "window": 0.2, "truncate": True})
    assert PARTS.parse({"type": "local_hard", "window": 0.2}).window == 0.2  # untruncated: a narrow Gaussian
    part = LocalHard(dim=16, heads=2, local_heads=1, head_dim=8, window=0.5, truncate=True)
    for p in (0.5, 0.125, 0.375, 1.0):  # centres 2, 0.5, 1.5 and 4 on 5 keys
        _fix_sigmoid(part.predict, [p])
        assert part.mask(_ctx(heads=2))[0, 1].any(-1).all()


def test_local_hard_under_causal_mask_uses_i_plus_one_valid_keys():
    part = LocalHard(dim=16, heads=2, local_heads=1, head_dim=8, window=10.0)
    _fix_sigmoid(part.predict, [0.5])
    full = part.score(torch.zeros(1, 2, 5, 5), _ctx(heads=2, causal=True))
    # L(i) = i + 1, so P_i = i / 2: row 2 is centred on key 1, row 4 on key 2
    torch.testing.assert_close(full[0, 1, 2, :3], torch.tensor([-0.02, 0.0, -0.02]))
    torch.testing.assert_close(full[0, 1, 4], torch.tensor([-0.08, -0.02, 0.0, -0.02, -0.08]))
    step_ctx = _ctx(heads=2, causal=True, length=1, offset=4, q_full=torch.zeros(1, 1, 16))
    step = part.score(torch.zeros(1, 2, 1, 5), step_ctx)
    torch.testing.assert_close(step[0, 1, 0], full[0, 1, 4])


def test_local_hard_truncate_and_luong_exact():
    part = LocalHard(dim=16, heads=2, local_heads=1, head_dim=8, window=1.0, truncate=True, luong_exact=True)
    _fix_sigmoid(part.predict, [0.5])
    assert part.stages() == ("mask", "weights")
    ctx = _ctx(heads=2)  # L = 5, P = 2
    assert part.mask(ctx)[0, 1, 0].tolist() == [False, True, True, True, False]  # |j - 2| <= 1
    assert part.mask(ctx)[0, 0].all()
    uniform = torch.full((1, 2, 5, 5), 0.2)
    scaled = part.weights(uniform, ctx)  # Luong Eq. 10: 0.2 * exp(-2 (j - 2)^2 / 1^2), not renormalised
    torch.testing.assert_close(scaled[0, 1, 3], 0.2 * torch.exp(torch.tensor([-8.0, -2.0, 0.0, -2.0, -8.0])))
    torch.testing.assert_close(scaled[0, 0], uniform[0, 0])


def test_neighbor_csan_centres_on_the_query_with_predicted_width():
    part = NeighborCSAN(dim=16, heads=4, local_heads=2, head_dim=4)
    _fix_sigmoid(part.predict, [0.5, 0.5])
    bias = part.score(torch.zeros(1, 4, 5, 5), _ctx())
    width = 5 * 0.5 + 0.1  # L * sigmoid + 0.1 = 2.6
    offsets = torch.tensor([-1.0, 0.0, 1.0, 2.0, 3.0])  # j - i for i = 1
    torch.testing.assert_close(bias[0, 2, 1], -2 * offsets ** 2 / width ** 2)


def test_neighbor_csan_reads_the_full_width_query():
    torch.manual_seed(0)
    part = NeighborCSAN(dim=16, heads=4, local_heads=2, head_dim=4)
    q_full = torch.randn(1, 5, 16)
    bias = part.score(torch.zeros(1, 4, 5, 5), _ctx(q_full=q_full))
    hidden = torch.tanh(q_full @ part.predict.hidden.weight.T + part.predict.hidden.bias)  # [b, i, 8]
    width = 5 * torch.sigmoid(hidden @ part.predict.out.weight.T + part.predict.out.bias) + 0.1  # [b, i, 2]
    j_minus_i = torch.arange(5.0)[None, :] - torch.arange(5.0)[:, None]
    torch.testing.assert_close(bias[0, 3], -2 * j_minus_i ** 2 / width[0, :, 1:2] ** 2)


@pytest.mark.parametrize("square, sigma", [(True, 4.0), (False, 2.0)])
def test_neighbor_sperber_is_query_independent(square, sigma):
    part = NeighborSperber(heads=2, local_heads=2, sigma_init=2.0, square=square)
    bias = part.score(torch.zeros(1, 2, 4, 4), _ctx(heads=2, length=4))
    i_minus_j = torch.arange(4.0)[:, None] - torch.arange(4.0)[None, :]
    torch.testing.assert_close(bias[0, 0], -i_minus_j ** 2 / (2 * sigma ** 2))  # sigma = s^2 or s
    assert sum(p.numel() for p in part.parameters()) == 2  # one scalar per local head


@pytest.mark.parametrize("sigma_init", [0, 0.0, -1.0])
def test_neighbor_sperber_refuses_an_initial_width_not_above_zero(sigma_init):
    """s = 0 is a zero width, -(i - j)^2 / 0: every score of the local heads NaN (squared or not); a negative s
    is no width either. ``rand`` and a positive s give finite scores."""
    with pytest.raises(ValueError, match=r"sigma_init\b.*: Input should be greater than 0"):
        _build({"type": "neighbor", "neighbor_mode": "sperber", "sigma_init": sigma_init})
    for sigma in ("rand", 0.5):
        for square in (True, False):
            part = _build({"type": "neighbor", "neighbor_mode": "sperber", "sigma_init": sigma,
                           "square_sigma": square}).parts[0]
            assert torch.isfinite(part.score(torch.zeros(1, 4, 5, 5), _ctx())).all()


def test_local_soft_query_predicts_centre_and_width():
    part = LocalSoft(dim=16, heads=2, local_heads=2, head_dim=8, window="query", fixed_window=10.0)
    _fix_sigmoid(part.predict, [0.5, 0.5, 0.75, 0.75])  # first H_loc outputs: positions, then widths
    bias = part.score(torch.zeros(1, 2, 4, 4), _ctx(heads=2, length=4))
    centre, width = 3 * 0.5, 4 * 0.75 + 0.1  # (L-1) sigmoid, L sigmoid + 0.1
    torch.testing.assert_close(bias[0, 1, 0], -2 * (torch.arange(4.0) - centre) ** 2 / width ** 2)


def test_local_soft_layer_window_uses_the_visible_mean_key():
    keys = torch.tensor([1.0, 2.0, 6.0])[None, None, :, None]  # [b, h, j, d] = [1, 1, 3, 1]
    encoder = replace(_ctx(heads=1, dim=1, length=3), k=keys)
    lengths = torch.full((1, 1, 3, 1), 3.0)
    assert LocalSoft.mean_key(encoder, lengths)[0, :, 0].tolist() == [3.0, 3.0, 3.0]
    decoder = replace(_ctx(heads=1, dim=1, length=3, causal=True), k=keys)
    prefix = torch.tensor([1.0, 2.0, 3.0])[None, None, :, None]
    assert LocalSoft.mean_key(decoder, prefix)[0, :, 0].tolist() == [1.0, 1.5, 3.0]  # prefix means


def test_gaussian_parameter_counts_reproduce_the_table():
    d, heads, head_dim = 512, 8, 64
    count = lambda cfg: sum(p.numel() for p in _build(cfg, heads=heads, dim=d).parts[0].parameters())  # noqa: E731
    hidden4, hidden8 = 4 * head_dim, 8 * head_dim
    assert count({"type": "neighbor"}) == d * hidden4 + hidden4 + hidden4 * 4 + 4 == 132_356
    assert count({"type": "local_hard"}) == 132_356
    assert count({"type": "local_soft"}) == d * hidden8 + hidden8 + hidden8 * 16 + 16 == 270_864
    assert count({"type": "neighbor", "neighbor_mode": "sperber"}) == 4


def test_local_heads_are_checked_against_the_head_count():
    with pytest.raises(ValueError, match="local_heads = 5 must be between 1 and the attention's 4 heads"):
        _build({"type": "local_soft", "local_heads": 5})
    assert _build({"type": "local_hard"}).parts[0].local_heads == 2  # half of 4


# ----------------------------------------------------------------------------- Bi_Direct
def test_directional_masks_on_length_four():
    part = DirectionalHeads(heads=4, pairs=1)
    allowed = part.mask(_ctx(length=4))[0]  # [h, i, j]
    forward = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    backward = [[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]]
    assert allowed[0].all() and allowed[1].all()  # the first H - 2 H_di heads are plain
    assert allowed[2].int().tolist() == forward  # diagonal included
    assert allowed[3].int().tolist() == backward
    every = DirectionalHeads(heads=4, pairs=2).mask(_ctx(length=4))[0]
    assert [every[h].int().tolist() for h in range(4)] == [forward, backward, forward, backward]


def test_bi_direct_is_encoder_only_and_parameter_free():
    attn = _build({"type": "bi_direct"})
    assert sum(p.numel() for p in attn.parts[0].parameters()) == 0
    with pytest.raises(ValueError, match="no causal version"):
        _build({"type": "bi_direct"}, side="decoder")
    with pytest.raises(ValueError, match="pairs = 3 needs 6 heads; the attention has 4, so pairs must be between 1 and 2"):
        _build({"type": "bi_direct", "pairs": 3})


def test_bi_direct_runs_on_the_fused_plan_and_equals_dense():
    from tests_helpers import spy_plans

    torch.manual_seed(0)
    dense = _build({"type": "bi_direct", "pairs": 1}).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.double)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[0, 4:] = False
    pos = Positions.self_attention(valid, length=6)
    with spy_plans() as ran:
        fused = dense(x, positions=pos).output  # auto -> SDPA: the part only masks
        traced = dense(x, positions=pos, need_trace=True)  # a trace forces the dense plan
    assert ran == ["sdpa", "dense"]
    torch.testing.assert_close(fused, traced.output)
    assert torch.all(traced.trace["weights"][:, 2].triu(1) == 0)  # forward head: nothing above the diagonal


# ----------------------------------------------------------------------------- the Gaussian parts under autocast
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("part_cfg", [
    {"type": "neighbor"},
    {"type": "neighbor", "neighbor_mode": "sperber"},  # sigma_init rand, squared: widths up to 1000^2
    {"type": "local_hard", "truncate": True},
    {"type": "local_soft"},
    {"type": "local_soft", "window": "layer"},
], ids=lambda c: "-".join(str(v) for v in c.values()))
def test_gaussian_geometry_is_fp32_under_autocast(part_cfg, low):
    """Under bf16/fp16 autocast the centre, width and bias are the fp32 ones from the same (low-precision)
    query: in bf16, positions past 256 are not whole numbers; in fp16, (j - c)^2 overflows from 182 apart
    (NaN scores where w^2 overflows too). A 600-token sentence reaches both."""
    torch.manual_seed(0)
    attn = _build(part_cfg, dim=16)
    part, length = attn.parts[0], 600
    q_full = torch.randn(1, length, 16).to(low)  # what the query projection gives under autocast
    k = torch.randn(1, 4, length, 4).to(low)
    low_ctx = replace(_ctx(length=length, q_full=q_full), k=k)
    wide_ctx = replace(_ctx(length=length, q_full=q_full.float()), k=k.float())
    with torch.autocast("cpu", dtype=low):
        got = part.bias(low_ctx)
        mask = part.mask(low_ctx) if part_cfg.get("truncate") else None
    want = part.bias(wide_ctx)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if mask is not None:
        assert torch.equal(mask, part.mask(wide_ctx))
