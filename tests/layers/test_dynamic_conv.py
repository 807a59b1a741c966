"""DynamicConv / LightConv (Wu et al. 2019): the operator against a loop over taps, band == unfold,
cached == full, causality, beam reorder, and the DynamicConv mixer block and preset."""

import math

import pytest
import torch

from sanlab.attention.positions import Positions
from sanlab.config import Seq2SeqConfig, StackConfig, load_config
from sanlab.decoding.cache import reorder
from sanlab.layers import dynamic_conv as dc
from sanlab.layers.dynamic_conv import ConvState, DynamicConv, PredictedKernels, SharedKernels, band_conv, unfold_conv
from sanlab.models.builders import build_seq2seq
from tests_helpers import spy_conv_algorithms


def loop_conv(x, weights, *, first_offset):
    """Direct definition: out[i, c] = sum_k w[i, h(c), k] * x[i + first_offset + k, c], zero outside [0, T)."""
    b, t, c = x.shape
    heads, kernel = weights.shape[2:]
    out = torch.zeros_like(x)
    for i in range(t):
        for k in range(kernel):
            src = i + first_offset + k
            if 0 <= src < t:
                for ch in range(c):
                    out[:, i, ch] += weights[:, i, ch // (c // heads), k] * x[:, src, ch]
    return out


def offset(kernel, causal):
    # Wu et al.: tap j = 1..K reads X[i + j - ceil((K+1)/2)] (centred, odd K); a decoder reads X[i-K+1 .. i].
    return -(kernel - 1) if causal else 1 - math.ceil((kernel + 1) / 2)


CASES = [(k, t, causal) for causal in (False, True) for k in (1, 3, 7) for t in (2, 5, 9)]
CASES += [(4, 3, True), (4, 6, True)]  # an even causal width, also longer than the input


@pytest.mark.parametrize("kernel,t,causal", CASES)
def test_both_algorithms_equal_a_loop_over_taps_values_and_gradients(kernel, t, causal):
    x = torch.randn(2, t, 8, dtype=torch.double)
    weights = torch.softmax(torch.randn(2, t, 2, kernel, dtype=torch.double), dim=-1)
    probe = torch.randn(2, t, 8, dtype=torch.double)
    left = dc.left_padding(kernel, causal=causal)

    def run(conv):
        xi, wi = x.clone().requires_grad_(True), weights.clone().requires_grad_(True)
        out = conv(xi, wi)
        (out * probe).sum().backward()
        return out, xi.grad, wi.grad

    expected = run(lambda xi, wi: loop_conv(xi, wi, first_offset=offset(kernel, causal)))
    for name, algorithm in (("unfold", unfold_conv), ("band", band_conv)):
        got = run(lambda xi, wi: algorithm(xi, wi, left=left))
        for what, a, b in zip(("values", "input gradient", "weight gradient"), got, expected):
            torch.testing.assert_close(a, b, msg=lambda m: f"{name} {what}: {m}")


def test_even_centred_kernel_uses_fairseqs_left_padding():
    # fairseq pads (K-1)//2 on the left for even K (Wu et al.'s formula would give K/2); only odd K are used.
    x, weights = torch.randn(1, 6, 4), torch.softmax(torch.randn(1, 6, 1, 4), dim=-1)
    torch.testing.assert_close(band_conv(x, weights, left=dc.left_padding(4, causal=False)),
                               loop_conv(x, weights, first_offset=-1))


@pytest.mark.parametrize("causal", [False, True])
def test_dynamic_kernels_are_a_softmax_of_a_linear_map_of_each_position(causal):
    conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=3), causal=causal).eval()
    x = torch.randn(2, 5, 8)
    logits = (x @ conv.kernels.linear.weight.T).view(2, 5, 2, 3)  # no bias, per head K taps
    expected = loop_conv(x, torch.softmax(logits, dim=-1), first_offset=offset(3, causal))
    torch.testing.assert_close(conv(x)[0], expected)


def test_light_conv_shares_one_softmax_kernel_per_head_across_positions():
    conv = DynamicConv(kernels=SharedKernels(heads=2, kernel_size=3), causal=False).eval()
    x = torch.randn(2, 5, 8)
    weights = torch.softmax(conv.kernels.weight, dim=-1)[None, None].expand(2, 5, 2, 3)
    torch.testing.assert_close(conv(x)[0], loop_conv(x, weights, first_offset=-1))


KERNELS = {"dynamic": lambda: PredictedKernels(dim=8, heads=2, kernel_size=5),
           "light": lambda: SharedKernels(heads=2, kernel_size=5)}


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [3, 8])
def test_band_equals_unfold_in_values_and_gradients_with_dropconnect(kind, causal, t):
    torch.manual_seed(0)
    convs = {alg: DynamicConv(kernels=KERNELS[kind](), causal=causal,
                              weight_dropout=0.3, algorithm=alg).double().train() for alg in ("band", "unfold")}
    convs["unfold"].load_state_dict(convs["band"].state_dict())
    x = torch.randn(2, t, 8, dtype=torch.double)
    outs, grads = {}, {}
    for alg, conv in convs.items():
        xi = x.clone().requires_grad_(True)
        torch.manual_seed(1)  # the same DropConnect mask for both algorithms
        with spy_conv_algorithms() as ran:
            outs[alg] = conv(xi)[0]
        assert ran == [alg]
        outs[alg].pow(2).sum().backward()
        grads[alg] = (xi.grad, *(w.grad for w in conv.kernels.parameters()))
    torch.testing.assert_close(outs["band"], outs["unfold"])
    for g_band, g_unfold in zip(grads["band"], grads["unfold"]):
        torch.testing.assert_close(g_band, g_unfold)


def test_auto_picks_band_for_short_and_unfold_for_long_inputs():
    conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=3), causal=False, band_max_len=4).eval()
    with spy_conv_algorithms() as ran:
        conv(torch.randn(1, 4, 8))
        conv(torch.randn(1, 5, 8))
    assert ran == ["band", "unfold"]


@pytest.mark.parametrize("kernel", [1, 3, 6])
def test_cached_steps_equal_the_full_causal_forward(kernel):
    conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=kernel), causal=True).eval()
    x = torch.randn(3, 7, 8)
    full, _ = conv(x)
    state, outs = None, []
    for start, stop in [(0, 1), (1, 2), (2, 4), (4, 7)]:  # single steps and chunks
        out, state = conv(x[:, start:stop], state=state, use_cache=True)
        outs.append(out)
        assert state.buffer.shape == (3, kernel - 1, 8)
    torch.testing.assert_close(torch.cat(outs, dim=1), full)


@pytest.mark.parametrize("kernel", [3, 15])
def test_causal_conv_ignores_later_positions(kernel):
    conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=kernel), causal=True).eval()
    x = torch.randn(2, 20, 8)
    x2 = x.clone()
    x2[:, 9:] = torch.randn(2, 11, 8)
    torch.testing.assert_close(conv(x2)[0][:, :9], conv(x)[0][:, :9])
    assert not torch.allclose(conv(x2)[0][:, 9:], conv(x)[0][:, 9:])


def test_centred_conv_refuses_step_by_step_decoding():
    conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=3), causal=False)
    with pytest.raises(ValueError, match="causal=True"):
        conv(torch.randn(1, 1, 8), use_cache=True)


def test_conv_state_follows_the_beams():
    conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=3), causal=True).eval()
    x = torch.randn(3, 4, 8)
    _, state = conv(x[:, :3], use_cache=True)
    index = torch.tensor([2, 2, 0])
    step, _ = conv(x[index, 3:], state=reorder(state, index), use_cache=True)
    full, _ = conv(x[index])
    torch.testing.assert_close(step[:, 0], full[:, 3])
    assert isinstance(reorder(state, index), ConvState)


def test_conv_block_zeroes_padding_so_real_positions_ignore_it():
    stack = StackConfig(layers=1, ffn_dim=16, attention={"heads": 2}, mixer={"type": "dynamic_conv", "kernel_size": 5})
    block = build_seq2seq(Seq2SeqConfig(dim=8, encoder=stack, decoder=stack, dropout=0.0), vocab_size=20,
                          pad_id=0).encoder.layers[0].mixer.eval()
    x = torch.randn(1, 6, 8)
    valid = torch.tensor([[True] * 4 + [False] * 2])
    out = block(x, positions=Positions.self_attention(valid, length=6)).output
    alone = block(x[:, :4], positions=Positions.self_attention(None, length=4)).output
    torch.testing.assert_close(out[:, :4], alone)


def test_kernel_schedule_must_match_the_number_of_layers():
    stack = StackConfig(layers=3, attention={"heads": 2}, mixer={"type": "light_conv", "kernel_size": [3, 7]})
    with pytest.raises(ValueError, match=r"2 widths \[3, 7\] for a stack of 3 layers"):
        build_seq2seq(Seq2SeqConfig(dim=8, encoder=stack, decoder=stack), vocab_size=20, pad_id=0)


@pytest.mark.parametrize("mixer", [{"type": "dynamic_conv", "kernel_size": [3, 5]},
                                   {"type": "light_conv", "kernel_size": 4, "glu": False}])
def test_conv_seq2seq_cached_decoding_equals_full_forward(mixer):
    stack = StackConfig(layers=2, ffn_dim=24, attention={"heads": 2}, mixer=mixer)
    torch.manual_seed(0)
    model = build_seq2seq(Seq2SeqConfig(dim=16, norm="post", dropout=0.0, encoder=stack, decoder=stack),
                          vocab_size=30, pad_id=0).eval()
    src, tgt = torch.randint(4, 30, (2, 7)), torch.randint(4, 30, (2, 6))
    src[1, 5:] = 0
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)
        state, steps = model.start_decoding(src), []
        for t in range(tgt.shape[1]):
            log_probs, state = model.decode_step(tgt[:, t:t + 1], state)
            steps.append(log_probs)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_dynamic_conv_preset_has_the_papers_kernel_schedule(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: preset:dynamic_conv_iwslt\ntask: translation\n"
                    "data: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n")
    with torch.device("meta"):
        model = build_seq2seq(load_config(path).model, vocab_size=100, tgt_vocab_size=90, pad_id=0)
    assert [layer.mixer.conv.kernel_size for layer in model.encoder.layers] == [3, 7, 15, 31, 31, 31, 31]
    assert [layer.self_mixer.conv.kernel_size for layer in model.decoder.layers] == [3, 7, 15, 31, 31, 31]
    first = model.encoder.layers[0].mixer
    assert first.linear_in.out_features == 512 and not first.glu  # IWSLT config: Linear d -> d, no GLU
    assert first.conv.kernels.linear.out_features == 4 * 3 and first.conv.weight_dropout == 0.1
    assert [layer.self_mixer.conv.causal for layer in model.decoder.layers] == [True] * 6


def test_conv_block_init_follows_fairseq():
    """fairseq's lightconv: Xavier-uniform Linear layers with zero biases around the convolution, but the
    kernel predictor re-initialised by DynamicConv1dTBC.reset_parameters() to nn.Linear's U(+-1/sqrt(d))."""
    torch.manual_seed(0)
    d = 512
    conv = DynamicConv(kernels=PredictedKernels(dim=d, heads=4, kernel_size=3), causal=False)
    block = dc.ConvBlock(dim=d, conv=conv, glu=False)
    xavier = math.sqrt(6 / (d + d))
    assert block.linear_in.weight.abs().max() > 1 / math.sqrt(d)  # wider than nn.Linear's default: Xavier
    assert block.linear_in.weight.abs().max() <= xavier and not block.linear_in.bias.any()
    assert block.linear_out.weight.abs().max() <= xavier and not block.linear_out.bias.any()
    predictor = block.conv.kernels.linear.weight  # [h*K, d]
    assert predictor.abs().max() <= 1 / math.sqrt(d) and predictor.abs().max() > 0.9 / math.sqrt(d)


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("causal", [False, True])
def test_traced_band_is_the_operator_as_an_attention_map(kind, causal):
    """trace["weights"] [b, h, i, j] is what multiplies the inputs: band @ x == the convolution."""
    conv = DynamicConv(kernels=KERNELS[kind](), causal=causal, algorithm="unfold").double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.double)
    trace = {}
    out, _ = conv(x, trace=trace)
    band = trace["weights"]
    assert band.shape == (2, 2, 7, 7)
    xh = x.view(2, 7, 2, 4).transpose(1, 2)  # [b, h, j, d]
    torch.testing.assert_close((band @ xh).transpose(1, 2).reshape(2, 7, 8), out)
    if causal:
        assert torch.equal(band.triu(1), torch.zeros_like(band))  # no weight on later inputs
