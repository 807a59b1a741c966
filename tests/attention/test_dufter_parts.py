"""Dufter et al. (COLING 2020) parts: A^p, A^r (paper / circulant_real), temperature, convolved attention.

Expected values are hand loops over the equations of spec C.3-C.8, the FFT definition of the
circulant operator, or plain attention with rescaled weights.
"""

import math

import pytest
import torch

from sanlab.attention import Attention, AttentionContext, Positions
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.attention.masks import causal as causal_mask
from sanlab.attention.parts.conv_attention import ConvolvedAttention
from sanlab.attention.parts.position_interaction import AbsolutePositionInteraction, RelativePositionInteraction
from sanlab.attention.parts.temperature import LearnableTemperature
from sanlab.registry import BuildContext
from tests_helpers import perturb


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from a second thread, and on an oversubscribed CPU OpenMP's spinning
    makes 2 threads 10-20x slower than 1; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ctx(length: int, *, offset: int = 0, causal: bool = False, heads: int = 2) -> AttentionContext:
    pos = Positions.self_attention(None, length=length, offset=offset, causal=causal)
    return AttentionContext(positions=pos, heads=heads, head_dim=4,
                            allowed=causal_mask(pos.q_pos, pos.k_pos) if causal else None)


def _random_conv(dims: int, *, t: int = 5, heads: int = 2, causal: bool = False) -> ConvolvedAttention:
    part = ConvolvedAttention(heads=heads, t=t, dims=dims, causal=causal).double()
    with torch.no_grad():
        part.bias.normal_()  # the Keras init is zero; a random bias checks it is used per column / per head
    return part


def _conv1d_loop(a, weight, bias, *, causal):
    """A'[h, i, j'] = ReLU(b[h, j'] + sum_{k, j} W[h, k, j, j'] A[h, i + k - shift, j]); rows outside are 0.
    Scalar tensor arithmetic, so autograd gives the reference gradients too."""
    heads, n, _ = a.shape
    shift = 2 if causal else 1
    out = torch.zeros_like(a)
    for h in range(heads):
        for i in range(n):
            for jj in range(n):
                s = bias[h, jj]
                for k in range(3):
                    r = i + k - shift
                    if 0 <= r < n:
                        s = s + sum(weight[h, k, j, jj] * a[h, r, j] for j in range(n))
                out[h, i, jj] = torch.relu(s)
    return out


def _conv2d_loop(a, weight, bias, *, causal):
    """A'[h, i, j] = ReLU(b[h] + sum_{k, l} w[h, k, l] A[h, i + k - shift, j + l - 1]); outside is 0."""
    heads, n, _ = a.shape
    shift = 2 if causal else 1
    out = torch.zeros_like(a)
    for h in range(heads):
        for i in range(n):
            for j in range(n):
                s = bias[h]
                for k in range(3):
                    for l in range(3):
                        r, c = i + k - shift, j + l - 1
                        if 0 <= r < n and 0 <= c < n:
                            s = s + weight[h, k, l] * a[h, r, c]
                out[h, i, j] = torch.relu(s)
    return out


def _assert_same_values_and_gradients(got, expected, inputs):
    torch.testing.assert_close(got, expected)
    probe = torch.randn(got.shape, generator=torch.Generator().manual_seed(5), dtype=got.dtype)
    for g, e, name in zip(torch.autograd.grad((got * probe).sum(), inputs),
                          torch.autograd.grad((expected * probe).sum(), inputs), ("A", "weight", "bias")):
        torch.testing.assert_close(g, e, msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("length", [5, 3])  # a full t x t matrix, and a shorter one placed on the t-grid
def test_conv_attention_equals_hand_loop_values_and_gradients(dims, length):
    part = _random_conv(dims)
    a = torch.rand(1, 2, length, length, dtype=torch.float64, requires_grad=True)
    got = part.weights(a, _ctx(length))
    if dims == 1:  # only channels j, j' < length exist: the grid's other columns are zero inputs, then cropped
        expected = _conv1d_loop(a[0], part.weight[..., :length, :length], part.bias[:, :length], causal=False)
    else:
        expected = _conv2d_loop(a[0], part.weight, part.bias, causal=False)
    _assert_same_values_and_gradients(got[0], expected, (a, part.weight, part.bias))


@pytest.mark.parametrize("dims", [1, 2])
def test_causal_conv_attention_equals_hand_loop_with_causal_rows_and_remask(dims):
    part = _random_conv(dims, causal=True)
    ctx = _ctx(5, causal=True)
    a = torch.rand(1, 2, 5, 5, dtype=torch.float64).tril().requires_grad_(True)  # a causal softmax output
    expected = (_conv1d_loop if dims == 1 else _conv2d_loop)(a[0], part.weight, part.bias, causal=True).tril()
    _assert_same_values_and_gradients(part.weights(a, ctx)[0], expected, (a, part.weight, part.bias))


def test_circulant_real_equals_real_part_of_fft_circulant_and_is_symmetric():
    t = 5
    part = RelativePositionInteraction(heads=2, t=t, rel_param="circulant_real").double()
    pos = torch.arange(t)
    got = part.matrix(pos, pos)  # [h, t, t]
    eye = torch.eye(2 * t, dtype=torch.complex128)
    for h in range(2):
        # TF LinearOperatorCirculant(spectrum a) = F^-1 diag(a) F; applied to I_{2t}, cast to real.
        op = torch.fft.ifft(part.a[h].detach()[:, None] * torch.fft.fft(eye, dim=0), dim=0)  # [2t, 2t]
        torch.testing.assert_close(got[h].detach(), op.real[:t, :t])
    torch.testing.assert_close(got, got.transpose(1, 2))


def test_paper_rel_position_is_toeplitz_direction_aware():
    t = 5
    part = RelativePositionInteraction(heads=2, t=t, rel_param="paper")
    pos = torch.arange(t)
    got = part.matrix(pos, pos).detach()
    for i in range(t):
        for j in range(t):
            assert got[0, i, j] == part.a[0, i - j + t - 1]
    torch.testing.assert_close(got[:, 1:, 1:], got[:, :-1, :-1])  # constant along diagonals
    assert (got - got.transpose(1, 2)).abs().max() > 1e-3  # left and right offsets differ


def test_abs_position_reads_explicit_positions_while_decoding():
    part = AbsolutePositionInteraction(heads=2, t=6)
    zeros = torch.zeros(1, 2, 1, 4)
    step = part.score(zeros, _ctx(1, offset=3, causal=True))  # query at position 3, keys 0..3
    torch.testing.assert_close(step[0, :, 0], part.interaction[:, 3, :4].detach())
    full = part.score(torch.zeros(1, 2, 4, 4), _ctx(4))
    torch.testing.assert_close(full[0], part.interaction[:, :4, :4].detach())


@pytest.mark.parametrize("part", [AbsolutePositionInteraction(heads=2, t=4),
                                  RelativePositionInteraction(heads=2, t=4, rel_param="paper"),
                                  ConvolvedAttention(heads=2, t=4, dims=1, causal=False)],
                         ids=["abs", "rel", "conv"])
def test_position_beyond_t_raises_naming_t(part):
    hook = part.weights if isinstance(part, ConvolvedAttention) else part.score
    with pytest.raises(ValueError, match=r"position 4 is outside the fixed length t = 4"):
        hook(torch.zeros(1, 2, 5, 5), _ctx(5))
    # a decoding step: one query after four cached positions (the limit read from the layout, not the tensors)
    with pytest.raises(ValueError, match=r"query position 4 is outside the fixed length t = 4"):
        hook(torch.zeros(1, 2, 1, 5), _ctx(1, offset=4, causal=True))
    hook(torch.zeros(1, 2, 1, 4), _ctx(1, offset=3, causal=True))  # position 3 fits
    # positions without a promised layout are read from the tensors
    free = Positions(q_pos=torch.tensor([0, 2, 4]), k_pos=torch.tensor([0, 2, 4]))
    assert free.query_start is None
    with pytest.raises(ValueError, match=r"query position 4 is outside the fixed length t = 4"):
        hook(torch.zeros(1, 2, 3, 3), AttentionContext(positions=free, heads=2, head_dim=4))


def test_temperature_starts_at_one_and_scales_logits_and_values():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pos = Positions.self_attention(None, length=5)
    plain = Attention(dim=8, heads=2, bias=False, out_proj=False).double()
    temp = Attention(dim=8, heads=2, bias=False, out_proj=False, parts=[LearnableTemperature(heads=2)]).double()
    temp.load_state_dict(plain.state_dict(), strict=False)
    torch.testing.assert_close(temp(x, positions=pos).output, plain(x, positions=pos).output)
    with torch.no_grad():
        temp.parts[0].gamma_q.copy_(torch.tensor([2.0, 1.0]))
        temp.parts[0].gamma_k.copy_(torch.tensor([3.0, 1.0]))
        temp.parts[0].gamma_v.copy_(torch.tensor([0.5, 1.0]))
        plain.q_proj.weight[:4] *= 6.0  # head 0: gamma_q * gamma_k = 6 multiplies its logits
        plain.v_proj.weight[:4] *= 0.5  # head 0: gamma_v scales its values
    torch.testing.assert_close(temp(x, positions=pos).output, plain(x, positions=pos).output)


@pytest.mark.parametrize("parts", [[{"type": "abs_position"}, {"type": "rel_position", "rel_param": "circulant_real"}],
                                   [{"type": "temperature"}],
                                   [{"type": "conv_attention", "dims": 1}],
                                   [{"type": "conv_attention", "dims": 2}]],
                         ids=["p+r", "temp", "conv1d", "conv2d"])
def test_decoder_no_future_leak_and_cached_equals_full(parts):
    torch.manual_seed(0)
    ctx = BuildContext(dim=8, heads=2, layer_index=0, num_layers=1, side="decoder", max_len=7)
    attn = perturb(build_attention(AttentionConfig(heads=2, parts=parts), ctx).double().eval())  # temperatures != 1
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    full = attn(x, positions=Positions.self_attention(None, length=7, causal=True)).output
    x2 = x.clone()
    x2[:, 4:] += 3.0
    changed = attn(x2, positions=Positions.self_attention(None, length=7, causal=True)).output
    torch.testing.assert_close(changed[:, :4], full[:, :4])
    cache, steps = None, []
    for t in range(7):
        r = attn(x[:, t:t + 1], positions=Positions.self_attention(None, length=1, offset=t, causal=True),
                 cache=cache, use_cache=True)
        cache, steps = r.cache, steps + [r.output]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize("dims", [1, 2])
def test_centred_conv_leaks_the_future_so_the_causal_test_bites(dims):
    torch.manual_seed(0)
    attn = Attention(dim=8, heads=2, parts=[_random_conv(dims, t=7, causal=False)]).double()
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    pos = Positions.self_attention(None, length=7)
    x2 = x.clone()
    x2[:, 4] += 3.0
    assert (attn(x2, positions=pos).output[:, 3] - attn(x, positions=pos).output[:, 3]).abs().max() > 1e-6


@pytest.mark.parametrize("dims", [1, 2])
def test_conv_attention_padding_leaves_real_positions_unchanged(dims):
    torch.manual_seed(0)
    attn = Attention(dim=8, heads=2, bias=False, parts=[_random_conv(dims, t=8)]).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    alone = attn(x[:, :4], positions=Positions.self_attention(None, length=4)).output
    valid = torch.tensor([[True] * 4 + [False] * 2])
    padded = attn(x, positions=Positions.self_attention(valid, length=6)).output
    torch.testing.assert_close(padded[:, :4], alone)
    assert torch.all(padded[:, 4:] == 0)


def test_conv_attention_refuses_cross_attention():
    ctx = BuildContext(dim=8, heads=2, layer_index=0, num_layers=1, side="cross", max_len=7)
    with pytest.raises(ValueError, match="cross-attention"):
        build_attention(AttentionConfig(heads=2, parts=[{"type": "conv_attention"}]), ctx)


def test_position_parts_default_to_the_first_layer_and_count_parameters():
    cfg = AttentionConfig(heads=4, parts=[{"type": "abs_position"}, {"type": "rel_position"},
                                          {"type": "temperature"}, {"type": "conv_attention", "dims": 2}])
    t = 6

    def extra(layer: int) -> int:
        ctx = BuildContext(dim=16, heads=4, layer_index=layer, num_layers=2, side="encoder", max_len=t)
        return sum(p.numel() for p in build_attention(cfg, ctx).parts.parameters())

    assert extra(0) == 4 * t * t + 4 * 2 * t + 4 * 3 + 4 * (9 + 1)
    assert extra(1) == 4 * 3 + 4 * (9 + 1)


def test_glorot_normal_init_of_position_matrices_matches_keras_std():
    t = 60
    p = AbsolutePositionInteraction(heads=4, t=t).interaction.detach()
    std = math.sqrt(1.0 / t) / 0.87962566103423978  # glorot_normal with fan_in = fan_out = t
    assert p.abs().max() <= 2 * std
    assert abs(p.std().item() - math.sqrt(1.0 / t)) < 0.05 * math.sqrt(1.0 / t)  # truncation restores 1/t variance
