"""The attention pipeline itself: plans agree, masks, empty rows, caches, errors."""

import pytest
import torch

from sanlab.attention import Attention, AttentionPart, Positions, PrefixState
from sanlab.attention.masks import masked_softmax
from tests_helpers import perturb, spy_plans


def _inputs(b=3, t=7, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, dim, generator=g)
    valid = torch.ones(b, t, dtype=torch.bool)
    valid[1, 5:] = False
    valid[2, 2:] = False
    return x, valid


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_plan_equals_dense_values_and_gradients(causal):
    x, valid = _inputs()
    torch.manual_seed(0)
    dense = Attention(dim=16, heads=4, plan="dense").double()
    sdpa = Attention(dim=16, heads=4, plan="sdpa").double()
    sdpa.load_state_dict(dense.state_dict())
    pos = Positions.self_attention(valid, length=7, causal=causal)
    xs = [x.double().clone().requires_grad_(True) for _ in range(2)]
    with spy_plans() as ran:
        outs = [m(xi, positions=pos).output for m, xi in zip((dense, sdpa), xs)]
    assert ran == ["dense", "sdpa"]
    torch.testing.assert_close(outs[0], outs[1])
    for out in outs:
        (out * valid[..., None]).pow(2).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    for p, q in zip(dense.parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_padded_queries_output_zero_and_padded_keys_are_ignored():
    x, valid = _inputs()
    attn = Attention(dim=16, heads=4, out_proj=False, bias=False).eval()
    pos = Positions.self_attention(valid, length=7)
    out = attn(x, positions=pos).output
    assert torch.all(out[1, 5:] == 0) and torch.all(out[2, 2:] == 0)
    x2 = x.clone()
    x2[1, 5:] = 100.0  # changing padded keys changes nothing for real queries
    torch.testing.assert_close(attn(x2, positions=pos).output[1, :5], out[1, :5])


def test_masked_softmax_empty_row_is_zero_not_nan():
    scores = torch.randn(1, 1, 2, 3)
    allowed = torch.tensor([[True, False, True], [False, False, False]])[None, None]
    w = masked_softmax(scores, allowed)
    assert torch.all(w[0, 0, 1] == 0)
    torch.testing.assert_close(w[0, 0, 0].sum(), torch.tensor(1.0))
    assert w[0, 0, 0, 1] == 0


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_softmax_runs_in_fp32_under_autocast_on_the_cpu(low):
    """CUDA's autocast runs softmax in fp32 by itself; the CPU's would keep bf16 scores in bf16 (three
    significant digits). The attention's softmax and Block's masked softmax widen it themselves, so bf16 training
    computes the same weights on either device."""
    from sanlab.layers.block_attention import masked_softmax as block_softmax

    scores = (torch.randn(2, 3, 5, 7) * 4).to(low)
    allowed = torch.rand(2, 1, 5, 7) > 0.3
    with torch.autocast("cpu", dtype=low):
        got = masked_softmax(scores, allowed)
        got_block = block_softmax(scores, allowed, dim=-1)
    want = masked_softmax(scores.float(), allowed)
    assert got.dtype == got_block.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_block, block_softmax(scores.float(), allowed, dim=-1), rtol=1e-6, atol=1e-7)
    assert masked_softmax(scores.double(), allowed).dtype == torch.float64  # (the tests' fp64 stays fp64)


def test_the_dense_plan_weights_are_fp32_under_bf16_autocast_on_the_cpu():
    x, valid = _inputs()
    attn = Attention(dim=16, heads=4, plan="dense").eval()
    pos = Positions.self_attention(valid, length=7)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trace = attn(x, positions=pos, need_trace=True).trace
    assert trace["scores"].dtype == torch.bfloat16 and trace["weights"].dtype == torch.float32


def test_trace_returns_scores_and_weights_the_model_used():
    x, valid = _inputs()
    attn = Attention(dim=16, heads=4).eval()
    result = attn(x, positions=Positions.self_attention(valid, length=7), need_trace=True)
    w = result.trace["weights"]
    assert w.shape == (3, 4, 7, 7)
    torch.testing.assert_close(w[1, :, :5].sum(-1), torch.ones(4, 5))
    assert torch.all(w[1, :, :, 5:] == 0)
    torch.testing.assert_close(result.output, _output_from_weights(attn, x, w, valid))


@pytest.mark.parametrize("part", [{"type": "conv_attention"}, {"type": "window", "size": 3}])
def test_traced_weights_are_the_ones_applied_after_every_part(part):
    """The output is out_proj(weights @ V) with the traced weights: ``weights_final`` when a part rewrote
    them after the softmax (convolved attention), else ``weights`` (a window masks before the softmax)."""
    from sanlab.attention.registry import PARTS
    from sanlab.registry import BuildContext

    x, valid = _inputs()
    config = PARTS.parse(part)
    torch.manual_seed(0)
    built = PARTS.build(config, BuildContext(dim=16, heads=4, layer_index=0, num_layers=1, side="encoder", max_len=7))
    attn = Attention(dim=16, heads=4, parts=[built], plan="dense").eval()
    perturb(attn, seed=0)
    result = attn(x, positions=Positions.self_attention(valid, length=7), need_trace=True)
    applied = result.trace.get("weights_final", result.trace["weights"])
    assert ("weights_final" in result.trace) == (part["type"] == "conv_attention")
    torch.testing.assert_close(result.output, _output_from_weights(attn, x, applied, valid))


def _output_from_weights(attn: Attention, x: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    b, i, _ = x.shape
    v = attn.v_proj(x).view(b, i, attn.heads, attn.head_dim).transpose(1, 2)  # [b, h, j, d]
    merged = (weights @ v).transpose(1, 2).reshape(b, i, attn.dim) * valid[..., None]  # padded queries: 0
    return attn.out_proj(merged)


def test_incremental_self_attention_cache_equals_full():
    x, _ = _inputs()
    attn = Attention(dim=16, heads=4).eval()
    full = attn(x, positions=Positions.self_attention(None, length=7, causal=True)).output
    cache, steps = None, []
    for t in range(7):
        pos = Positions.self_attention(None, length=1, offset=t, causal=True)
        r = attn(x[:, t:t + 1], positions=pos, cache=cache, use_cache=True)
        cache = r.cache
        steps.append(r.output)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)


class _NonIncremental(AttentionPart):
    """A score part that claims no incremental form: exercises the prefix-recompute path."""

    incremental = False

    def score(self, scores, ctx):
        return scores + 0.1 * (ctx.k_pos[None, :] - ctx.q_pos[:, None]).float()  # [i, j] broadcast


def test_prefix_recompute_path_equals_full():
    x, _ = _inputs()
    attn = Attention(dim=16, heads=4, parts=[_NonIncremental()]).eval()
    full = attn(x, positions=Positions.self_attention(None, length=7, causal=True)).output
    cache, steps = None, []
    for t in range(7):
        r = attn(x[:, t:t + 1], positions=Positions.self_attention(None, length=1, offset=t, causal=True),
                 cache=cache, use_cache=True)
        cache = r.cache
        steps.append(r.output)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("parts", [[], [_NonIncremental()]], ids=["vanilla", "non-incremental part"])
def test_recompute_prefix_switch_keeps_the_layer_input_and_decodes_the_same(parts):
    x, _ = _inputs()
    attn = Attention(dim=16, heads=4, parts=parts).eval()
    full = attn(x, positions=Positions.self_attention(None, length=7, causal=True)).output
    attn.recompute_prefix = True
    assert not attn.incremental
    cache, steps = None, []
    for t in range(7):
        r = attn(x[:, t:t + 1], positions=Positions.self_attention(None, length=1, offset=t, causal=True),
                 cache=cache, use_cache=True)
        assert isinstance(r.cache, PrefixState) and r.cache.length == t + 1
        cache, steps = r.cache, steps + [r.output]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)


def test_errors_name_the_values():
    with pytest.raises(ValueError, match="30 is not divisible by 4"):
        Attention(dim=30, heads=4)
    with pytest.raises(ValueError, match="plan 'sdpa' cannot run parts"):
        Attention(dim=16, heads=4, parts=[_NonIncremental()], plan="sdpa")
