"""Capsule routing self-attention (Duan et al. 2020, arXiv 2004.14649; spec section 14).

Expected values are derived: Sabour et al.'s Procedure 1 written out capsule by capsule (the reference of
``dynamic_routing`` and of everything built on it), a per-prefix loop for the vectorised routing,
one-iteration closed forms (couplings are uniform before any agreement), hand-computed squash values, and
vanilla attention.
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sanlab.attention import KV, Attention, Positions, routing
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.masks import masked_softmax
from sanlab.attention.parts.capsule import CapsuleRouting, NoRouting, build_capsule
from sanlab.attention.parts.capsule_config import CapsuleConfig
from sanlab.attention.parts.window import WindowMask
from sanlab.attention.parts_base import AttentionContext, PartCache
from sanlab.attention.plans import StageParts, visibility
from sanlab.config import Seq2SeqConfig, StackConfig, load_config
from sanlab.decoding.cache import reorder
from sanlab.models.builders import build_seq2seq, count_parameters
from sanlab.registry import BuildContext

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DIM, HEADS = 16, 4


def _ctx(side: str, heads: int = HEADS, layer: int = 0) -> BuildContext:
    return BuildContext(dim=DIM, heads=heads, layer_index=layer, num_layers=2, side=side, max_len=64)


def _attention(side: str, seed: int = 0, **settings) -> Attention:
    torch.manual_seed(seed)
    config = AttentionConfig(heads=HEADS, parts=[CapsuleConfig(**settings)])
    return build_attention(config, _ctx(side)).double().eval()


def _cube(b=2, h=3, i=6, j=6, seed=0) -> torch.Tensor:
    return torch.randn(b, h, i, j, generator=torch.Generator().manual_seed(seed), dtype=torch.double)


def _score_ctx(valid, *, length, causal=False, heads=HEADS) -> AttentionContext:
    ctx = AttentionContext(positions=Positions.self_attention(valid, length=length, causal=causal),
                           heads=heads, head_dim=DIM // heads)
    return replace(ctx, allowed=visibility(ctx, StageParts()))


def _padded_valid():
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 4:] = False
    return valid


# --------------------------------------------------------------------------- routing primitives
def test_squash_hand_values_and_zero():
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.double, requires_grad=True)
    out = routing.squash(s)
    # |s|^2 = 25: length 25/26 along (3, 4)/5 (eps = 1e-9 is far below the tolerance)
    torch.testing.assert_close(out[0], torch.tensor([15 / 26, 20 / 26], dtype=torch.double))
    assert torch.all(out[1] == 0)
    out.sum().backward()
    assert torch.isfinite(s.grad).all()


def _procedure_1(votes: torch.Tensor, iters: int, output_valid=None, with_couplings: bool = False):
    """Sabour et al. (2017) Procedure 1 for one example, one capsule at a time: votes [u, o, D] -> v [o, D]
    (and, ``with_couplings``, the last iteration's couplings c [u, o], the paper's gamma in Eq. 10-11).
    Input u's coupling is a softmax over the outputs it may reach (none reachable: coupling 0)."""
    n_in, n_out, _ = votes.shape
    reach = [[True] * n_out for _ in range(n_in)] if output_valid is None else output_valid.tolist()
    logits = [[0.0] * n_out for _ in range(n_in)]
    for step in range(iters):
        coupling = []
        for u in range(n_in):
            e = [torch.exp(torch.as_tensor(logits[u][o])) if reach[u][o] else None for o in range(n_out)]
            total = sum(x for x in e if x is not None) if any(x is not None for x in e) else None
            coupling.append([e[o] / total if e[o] is not None else 0.0 for o in range(n_out)])
        v = []
        for o in range(n_out):
            s_o = sum(coupling[u][o] * votes[u, o] for u in range(n_in))
            norm = s_o.norm()
            v.append(torch.zeros_like(s_o) if norm == 0 else norm ** 2 / (1 + norm ** 2) * s_o / norm)
        for u in range(n_in):
            for o in range(n_out):
                logits[u][o] = logits[u][o] + votes[u, o] @ v[o]
    if with_couplings:
        return torch.stack(v), torch.tensor([[float(c) for c in row] for row in coupling], dtype=votes.dtype)
    return torch.stack(v)


@pytest.mark.parametrize("iters", [1, 2, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_dynamic_routing_equals_procedure_1_values_and_gradients(iters, masked):
    votes = torch.randn(2, 5, 3, 4, generator=torch.Generator().manual_seed(iters), dtype=torch.double)
    valid = torch.rand(2, 5, 3, generator=torch.Generator().manual_seed(7)) > 0.3 if masked else None
    if masked:
        valid[0, 1] = False  # an input that reaches no output
    a, b = votes.clone().requires_grad_(True), votes.clone().requires_grad_(True)
    fast, _ = routing.dynamic_routing(a, iters=iters, output_valid=valid)
    reference = torch.stack([_procedure_1(b[n], iters, None if valid is None else valid[n]) for n in range(2)])
    torch.testing.assert_close(fast, reference)
    weight = torch.randn(fast.shape, generator=torch.Generator().manual_seed(3), dtype=torch.double)
    (fast * weight).sum().backward()
    (reference * weight).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("iters", [2, 3])
def test_vertical_and_global_routing_equal_procedure_1(iters):
    valid = _padded_valid()
    cube = _cube(h=3, seed=iters) * valid[:, None, :, None]
    v, _ = routing.vertical_routing(cube, iters=iters, row_valid=valid)  # heads vote for tokens
    for n in range(2):
        reach = valid[n][None, :].expand(3, 6)  # [h, i]: a head's coupling spreads over real tokens only
        torch.testing.assert_close(v[n], _procedure_1(cube[n], iters, reach))
    hor = routing.global_routing(cube, iters=iters)  # tokens vote for heads, all of them at once
    for n in range(2):
        expected = _procedure_1(cube[n].transpose(0, 1), iters)  # [h, j]
        torch.testing.assert_close(hor[n], expected[:, None, :].expand(3, 6, 6))


@pytest.mark.parametrize("iters", [1, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_vectorised_positional_routing_equals_per_prefix_loop(iters, causal):
    cube = _cube(i=7, j=7, seed=iters)
    if causal:  # masked routing: the decoder zero-fills the future first
        cube = cube * torch.tril(torch.ones(7, 7, dtype=torch.double))
    a, b = cube.clone().requires_grad_(True), cube.clone().requires_grad_(True)
    fast = routing.positional_routing(a, q_pos=torch.arange(7), iters=iters)
    loop = routing.positional_routing_loop(b, iters=iters)
    torch.testing.assert_close(fast, loop)
    weight = torch.randn_like(fast)
    (fast * weight).sum().backward()
    (loop * weight).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_deterministic_algorithms_route_every_row_by_a_product_with_the_same_result():
    """Under deterministic algorithms (``train.deterministic``) the first iteration's prefix sums are a product
    with the prefix mask, not a cumsum (CUDA's floating-point cumsum has no deterministic form): the same values
    and gradients."""
    cube = _cube(i=7, j=7, seed=3)
    a, b = cube.clone().requires_grad_(True), cube.clone().requires_grad_(True)
    summed = routing.positional_routing(a, q_pos=torch.arange(7), iters=3)
    torch.use_deterministic_algorithms(True)
    try:
        product = routing.positional_routing(b, q_pos=torch.arange(7), iters=3)
    finally:
        torch.use_deterministic_algorithms(False)
    torch.testing.assert_close(product, summed)
    weight = torch.randn_like(summed)
    (summed * weight).sum().backward()
    (product * weight).sum().backward()
    torch.testing.assert_close(b.grad, a.grad)


def test_one_iteration_horizontal_is_squashed_prefix_mean():
    cube = _cube(h=4)
    expected = routing.squash(cube.cumsum(dim=2) / 4)  # couplings are all 1/H before any agreement
    torch.testing.assert_close(routing.positional_routing(cube, q_pos=torch.arange(6), iters=1), expected)


def test_vertical_couplings_sum_to_one_over_tokens_and_padded_rows_get_zero():
    valid = _padded_valid()
    cube = _cube(h=3) * valid[:, None, :, None]
    v, gamma = routing.vertical_routing(cube, iters=3, row_valid=valid)
    torch.testing.assert_close(gamma.sum(-1), torch.ones(2, 3, dtype=torch.double))
    assert torch.all(gamma[1, :, 4:] == 0) and torch.all(v[1, 4:] == 0)
    # one iteration: each head spreads 1/n_valid over the real tokens, so s_i = sum_h cube[h, i] / n_valid
    v1, gamma1 = routing.vertical_routing(cube, iters=1, row_valid=valid)
    n_valid = valid.sum(-1).double()  # [b]
    torch.testing.assert_close(gamma1, valid[:, None, :].double() / n_valid[:, None, None].expand(2, 3, 6))
    torch.testing.assert_close(v1, routing.squash(cube.sum(1) / n_valid[:, None, None]))


def test_vertical_routing_of_a_fully_padded_sentence_is_zero_not_nan():
    cube = torch.zeros(1, 3, 4, 4, dtype=torch.double)
    v, gamma = routing.vertical_routing(cube, iters=3, row_valid=torch.zeros(1, 4, dtype=torch.bool))
    assert torch.all(v == 0) and torch.all(gamma == 0)


def test_hor_is_zero_above_the_diagonal_under_the_causal_zero_fill():
    cube = _cube(i=7, j=7) * torch.tril(torch.ones(7, 7, dtype=torch.double))
    hor = routing.positional_routing(cube, q_pos=torch.arange(7), iters=3)
    assert torch.all(torch.triu(hor, diagonal=1) == 0)


# --------------------------------------------------------------------------- the score part, hand-derived
@pytest.mark.parametrize("routing_input", ["scores", "probs"])
def test_part_adds_one_iteration_horizontal_routing_of_the_zero_filled_cube(routing_input):
    valid = _padded_valid()
    scores = _cube(h=HEADS, seed=3)
    ctx = _score_ctx(valid, length=6)
    config = CapsuleConfig(use_vertical=False, routing_iters=1, routing_input=routing_input)
    part = build_capsule(config, _ctx("encoder"))
    visible = valid[:, None, :, None] & valid[:, None, None, :]  # [b, 1, i, j]
    base = masked_softmax(scores, valid[:, None, None, :]) if routing_input == "probs" else scores
    cube = base.masked_fill(~visible, 0.0)
    expected = scores + routing.squash(cube.cumsum(2) / HEADS)
    torch.testing.assert_close(part.score(scores, ctx), expected, atol=1e-12, rtol=1e-12)  # fp64 stays fp64


@pytest.mark.parametrize("init, act, factor", [("identity", "none", "gamma"), ("zeros", "sigmoid", 0.5),
                                               ("zeros", "none", 0.0)])
def test_part_vertical_acceptance_one_iteration(init, act, factor):
    valid = _padded_valid()
    scores = _cube(h=HEADS, seed=4)
    part = build_capsule(CapsuleConfig(use_horizontal=False, routing_iters=1, acceptance_init=init,
                                       acceptance_act=act), _ctx("encoder")).double()
    cube = scores.masked_fill(~(valid[:, None, :, None] & valid[:, None, None, :]), 0.0)
    n_valid = valid.sum(-1).double()[:, None, None]  # [b, 1, 1]
    v = routing.squash(cube.sum(1) / n_valid)  # [b, i, j]; couplings 1/n_valid on real rows
    # identity acceptance: a_hi = gamma_hi = 1/n_valid; sigmoid of a zero map: 1/2; zero map: 0
    accept = 1 / n_valid if factor == "gamma" else torch.full_like(n_valid, factor)
    expected = scores + accept[:, None] * v[:, None]
    torch.testing.assert_close(part.score(scores, _score_ctx(valid, length=6)), expected, atol=1e-12, rtol=1e-12)


def test_part_with_a_general_acceptance_map_equals_eq_8_to_14_capsule_by_capsule():
    """Three iterations, both routings and an acceptance map that is neither symmetric nor diagonal, so the
    direction of Eq. 10 is pinned: a[h, i] = sum_g W[h, g] gamma[g, i] + bias[h], head h absorbing what the
    couplings of every head g gave token i. Expected: Procedure 1 per capsule (vertical: heads vote for real
    tokens; horizontal: one routing per prefix, tokens vote for heads) on the zero-filled scores."""
    valid = _padded_valid()
    scores = _cube(h=HEADS, seed=5)
    part = build_capsule(CapsuleConfig(routing_iters=3), _ctx("encoder")).double()
    weight = torch.arange(HEADS * HEADS, dtype=torch.double).view(HEADS, HEADS) / 10 - 0.7  # W != W^T
    bias = torch.tensor([0.3, -0.2, 0.1, 0.5], dtype=torch.double)
    with torch.no_grad():
        part.acceptance.weight.copy_(weight)
        part.acceptance.bias.copy_(bias)
    out = part.score(scores, _score_ctx(valid, length=6))
    expected = scores.clone()
    for n in range(2):
        real = int(valid[n].sum())
        cube = scores[n].clone()  # [h, i, j]
        cube[:, real:, :] = 0.0
        cube[:, :, real:] = 0.0
        v, gamma = _procedure_1(cube, 3, valid[n][None, :].expand(HEADS, 6), with_couplings=True)  # [i, j], [h, i]
        for h in range(HEADS):
            for i in range(real):
                accept = sum(weight[h, g] * gamma[g, i] for g in range(HEADS)) + bias[h]  # Eq. 10
                expected[n, h, i] += accept * v[i] + _procedure_1(cube[:, : i + 1].transpose(0, 1), 3)[h]
    rows = valid[:, None, :, None]  # padded query rows are never read
    # the squash's eps = 1e-9 under the square root moves the values by about 1e-9
    torch.testing.assert_close(out * rows, expected * rows, atol=1e-8, rtol=1e-8)


def test_routing_runs_in_fp32_under_autocast():
    part = build_capsule(CapsuleConfig(), _ctx("encoder"))
    scores = _cube(h=HEADS).float().to(torch.bfloat16)
    ctx = _score_ctx(_padded_valid(), length=6)
    reference = part.score(scores.float(), ctx).to(torch.bfloat16)  # no autocast: fp32 throughout
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = part.score(scores, ctx)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference, atol=0, rtol=0)


@pytest.mark.parametrize("settings", [{"use_vertical": False}, {"use_horizontal": False}])
def test_detached_logits_change_gradients_not_values(settings):
    scores = _cube(h=HEADS)
    ctx = _score_ctx(_padded_valid(), length=6)
    outs, grads = [], []
    for detach in (False, True):
        torch.manual_seed(0)
        part = build_capsule(CapsuleConfig(routing_detach_logits=detach, **settings), _ctx("encoder")).double()
        s = scores.clone().requires_grad_(True)
        outs.append(part.score(s, ctx))
        outs[-1].pow(2).sum().backward()
        grads.append(s.grad)
    torch.testing.assert_close(outs[0], outs[1])
    assert not torch.allclose(grads[0], grads[1])


# --------------------------------------------------------------------------- inside the attention
def test_decoder_causality_later_tokens_do_not_change_earlier_outputs():
    attn = _attention("decoder")
    x = torch.randn(2, 7, DIM, dtype=torch.double)
    pos = Positions.self_attention(None, length=7, causal=True)
    out = attn(x, positions=pos).output
    x2 = x.clone()
    x2[:, 4:] = torch.randn(2, 3, DIM, dtype=torch.double)
    torch.testing.assert_close(attn(x2, positions=pos).output[:, :4], out[:, :4], atol=1e-12, rtol=0)


def test_the_cache_keeps_the_cube_under_the_index_of_the_part():
    torch.manual_seed(0)
    window, routing = WindowMask(half_width=1), build_capsule(CapsuleConfig(), _ctx("decoder"))
    attn = Attention(dim=DIM, heads=HEADS, parts=[window, routing]).double().eval()
    x = torch.randn(2, 3, DIM, dtype=torch.double)
    cache = attn(x, positions=Positions.self_attention(None, length=3, causal=True), use_cache=True).cache
    assert list(cache.parts) == [1] and cache.parts[1].shape == (2, HEADS, 3, 3)
    index = torch.tensor([1, 1])  # beams follow every kept tensor on dimension 0
    assert torch.equal(reorder(cache, index).parts[1], cache.parts[1][index])


@pytest.mark.parametrize("routing_input", ["scores", "probs"])
def test_attention_step_by_step_decoding_equals_full_forward(routing_input):
    attn = _attention("decoder", routing_input=routing_input)
    x = torch.randn(2, 7, DIM, dtype=torch.double)
    full = attn(x, positions=Positions.self_attention(None, length=7, causal=True)).output
    cache, steps = None, []
    for t in range(7):  # keys, values and the routing cube's rows are cached; only row t is routed
        result = attn(x[:, t:t + 1], positions=Positions.self_attention(None, length=1, offset=t, causal=True),
                      cache=cache, use_cache=True)
        cache, steps = result.cache, steps + [result.output]
        assert isinstance(cache, KV) and cache.parts[0].shape == (2, HEADS, t + 1, t + 1)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-12, rtol=1e-12)
    # the kept rows are the full forward's zero-filled cube: scores below the diagonal, zeros above
    part = attn.parts[0]
    q, k = attn._split(attn.q_proj(x)), attn._split(attn.k_proj(x))
    scores = torch.matmul(q, k.transpose(-1, -2)) * attn.scale
    expected = part.routing_cube(scores, torch.ones(7, 7, dtype=torch.bool).tril(), None)
    torch.testing.assert_close(cache.parts[0], expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("routing_input", ["scores", "probs"])
def test_chunked_decoding_with_padding_and_beams_that_drop_and_repeat_equals_full_forward(routing_input):
    attn = _attention("decoder", routing_input=routing_input)
    x = torch.randn(3, 8, DIM, dtype=torch.double)
    valid = torch.ones(3, 8, dtype=torch.bool)
    valid[2, 4:] = False  # a padded target (its rows 4-7 are padding), kept and moved to row 0 below
    full = attn(x, positions=Positions.self_attention(valid, length=8, causal=True)).output
    rows = torch.tensor([2, 0, 0])  # after the second chunk: row 1 drops out, row 0 is repeated
    x_after, valid_after, full_after = x[rows], valid[rows], full[rows]
    cache, start, outs = None, 0, []
    for size in (3, 2, 1, 2):
        if start == 5:
            cache = reorder(cache, rows)
        inputs, keys = (x, valid) if start < 5 else (x_after, valid_after)
        end = start + size
        pos = Positions.self_attention(keys[:, :end], length=size, offset=start, causal=True)
        result = attn(inputs[:, start:end], positions=pos, cache=cache, use_cache=True)
        cache, start = result.cache, end
        outs.append(result.output)
    torch.testing.assert_close(torch.cat(outs[:2], 1), full[:, :5], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(torch.cat(outs[2:], 1), full_after[:, 5:], atol=1e-12, rtol=1e-12)


def test_routing_only_the_newest_rows_equals_those_rows_of_the_full_routing():
    cube = _cube(i=7, j=7, seed=5) * torch.tril(torch.ones(7, 7, dtype=torch.double))
    a, b = cube.clone().requires_grad_(True), cube.clone().requires_grad_(True)
    full = routing.positional_routing(a, q_pos=torch.arange(7), iters=3)[:, :, 4:]
    newest = routing.positional_routing(b, q_pos=torch.arange(4, 7), token_pos=torch.arange(7), iters=3)
    torch.testing.assert_close(newest, full)
    weight = torch.randn_like(full)
    (full * weight).sum().backward()
    (newest * weight).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("side, settings", [("encoder", {}), ("decoder", {}),
                                            ("encoder", {"horizontal_mode": "global", "routing_input": "probs"})])
def test_padding_invariance(side, settings):
    attn = _attention(side, **settings)
    causal = side == "decoder"
    sentence = torch.randn(1, 5, DIM, dtype=torch.double)
    alone = attn(sentence, positions=Positions.self_attention(None, length=5, causal=causal)).output
    batch = torch.randn(2, 8, DIM, dtype=torch.double)
    batch[0, :5] = sentence[0]
    valid = torch.ones(2, 8, dtype=torch.bool)
    valid[0, 5:] = False
    out = attn(batch, positions=Positions.self_attention(valid, length=8, causal=causal)).output
    torch.testing.assert_close(out[0, :5], alone[0])


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_both_routings_off_is_bit_identical_to_vanilla_attention(side):
    capsule = _attention(side, use_vertical=False, use_horizontal=False)
    assert isinstance(capsule.parts[0], NoRouting)
    vanilla = Attention(dim=DIM, heads=HEADS).double().eval()
    vanilla.load_state_dict(capsule.state_dict())
    x = torch.randn(2, 6, DIM, dtype=torch.double)
    pos = Positions.self_attention(_padded_valid(), length=6, causal=side == "decoder")
    assert torch.equal(capsule(x, positions=pos).output, vanilla(x, positions=pos).output)
    assert count_parameters(capsule) == count_parameters(vanilla)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_no_nan_with_fully_padded_rows_bf16_autocast_and_one_key(side):
    attn = _attention(side).float().train()
    causal = side == "decoder"
    for length, valid in [(1, None), (3, torch.tensor([[True, True, False], [False, False, False]]))]:
        x = torch.randn(2, length, DIM, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attn(x, positions=Positions.self_attention(valid, length=length, causal=causal)).output
        out.float().pow(2).sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters())


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="'global' .* not allowed in the decoder \\(decoder layer 0\\)"):
        build_capsule(CapsuleConfig(horizontal_mode="global"), _ctx("decoder"))
    with pytest.raises(ValueError, match="self-attention only.*cross layer 0"):
        build_capsule(CapsuleConfig(), _ctx("cross"))
    encoder_part = build_capsule(CapsuleConfig(), _ctx("encoder"))
    assert not encoder_part.causal_safe and build_capsule(CapsuleConfig(), _ctx("decoder")).causal_safe
    with pytest.raises(ValueError, match="sees later tokens"):
        encoder_part.score(_cube(1, HEADS, 3, 3).float(), _score_ctx(None, length=3, causal=True))
    with pytest.raises(ValueError, match="got 2 queries and 3 keys"):
        encoder_part.score(torch.randn(1, HEADS, 2, 3), _score_ctx(None, length=3))
    decoder_part, ctx = build_capsule(CapsuleConfig(), _ctx("decoder")), _score_ctx(None, length=3, causal=True)
    ctx = replace(ctx, cache=PartCache({decoder_part: torch.zeros(1, HEADS, 1, 1)}))  # one row short of 3 keys
    with pytest.raises(ValueError, match="got 1 queries after 1 cached and 3 keys"):
        decoder_part.score(torch.randn(1, HEADS, 1, 3), ctx)
    ctx = replace(ctx, cache=PartCache({decoder_part: torch.zeros(1, HEADS, 2, 2)}),  # the query must be
                  positions=Positions(q_pos=torch.tensor([0]), k_pos=torch.arange(3), causal=True))  # at 2
    with pytest.raises(ValueError, match=r"after its 2 cached rows; got query positions \[0\] for keys \[0, 1, 2\]"):
        decoder_part.score(torch.randn(1, HEADS, 1, 3), ctx)


# --------------------------------------------------------------------------- whole models
def _tiny_seq2seq():
    parts = {"heads": 4, "parts": [{"type": "capsule"}]}
    cfg = Seq2SeqConfig(dim=32, norm="pre", dropout=0.0, encoder=StackConfig(layers=2, ffn_dim=48, attention=parts),
                        decoder=StackConfig(layers=2, ffn_dim=48, attention=parts))
    torch.manual_seed(0)
    return build_seq2seq(cfg, vocab_size=50, pad_id=0).eval()


def test_seq2seq_incremental_decoding_equals_teacher_forcing():
    model = _tiny_seq2seq()
    src = torch.randint(4, 50, (3, 9))
    src[1, 6:] = 0
    tgt = torch.randint(4, 50, (3, 7))
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)  # [b, i, V]
        state, steps = model.start_decoding(src), []
        for t in range(tgt.shape[1]):
            log_probs, state = model.decode_step(tgt[:, t:t + 1], state)
            steps.append(log_probs)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_seq2seq_padding_invariance():
    model = _tiny_seq2seq()
    src, tgt = torch.randint(4, 50, (1, 6)), torch.randint(4, 50, (1, 5))
    with torch.no_grad():
        alone = model(src, tgt)
        pad_src, pad_tgt = (torch.cat([t, torch.zeros(1, n, dtype=torch.long)], 1) for t, n in ((src, 5), (tgt, 3)))
        other_src, other_tgt = torch.randint(4, 50, (1, 11)), torch.randint(4, 50, (1, 8))
        batch = model(torch.cat([pad_src, other_src]), torch.cat([pad_tgt, other_tgt]))
    torch.testing.assert_close(batch[0, :5], alone[0], atol=1e-5, rtol=1e-5)


def _preset_model(tmp_path, preset: str, capsule: bool):
    parts = "{attention: {parts: [{type: capsule}]}}" if capsule else "{}"
    path = tmp_path / f"{preset}-{capsule}.yaml"
    path.write_text(f"base: preset:{preset}\ntask: translation\ndata: {{train: {{src: a, tgt: b}}, valid: "
                    f"{{src: a, tgt: b}}}}\nmodel: {{encoder: {parts}, decoder: {parts}}}\n")
    cfg = load_config(path).model
    with torch.device("meta"):  # counting only: no memory, no initialisation cost
        return cfg, build_seq2seq(cfg, vocab_size=100, pad_id=0)


@pytest.mark.parametrize("preset, paper_count", [("transformer_base", 432), ("transformer_big", 1632)])
def test_parameter_count_matches_the_paper(tmp_path, preset, paper_count):
    cfg, capsule = _preset_model(tmp_path, preset, capsule=True)
    _, vanilla = _preset_model(tmp_path, preset, capsule=False)
    h, layers = cfg.encoder.attention.heads, cfg.encoder.layers
    assert count_parameters(capsule) - count_parameters(vanilla) == layers * (h * h + h) == paper_count
    for layer in capsule.encoder.layers:  # H^2 + H per encoder layer: one acceptance map and bias
        assert count_parameters(layer.mixer.parts) == h * h + h
    for layer in capsule.decoder.layers:  # masked horizontal routing only: nothing to learn
        assert count_parameters(layer.self_mixer.parts) == 0
        assert isinstance(layer.self_mixer.parts[0], CapsuleRouting) and not layer.cross_attention.parts


@pytest.mark.parametrize("name", ["multi30k-en-de-capsule.yaml", "ud-ewt-capsule.yaml"])
def test_example_configs_turn_capsule_routing_on(name):
    cfg = load_config(CONFIGS / name)
    assert [p.type for p in cfg.model.encoder.attention.parts] == ["capsule"]
