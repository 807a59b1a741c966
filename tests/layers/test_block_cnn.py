"""Block (Bi-BloSAN mixer) and CNNs (QANet convolution pre-blocks) baselines, spec B.5-B.6."""

import copy
import math

import pytest
import torch

from sanlab.attention import Attention, Positions
from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.layers import block_attention
from sanlab.layers.block_attention import (BiBloSA, BlockSelfAttention, FeatureAttention, ReferenceBlockAttention,
                                           direction_mask, intra_block_mask, split_blocks)
from sanlab.layers.conv_blocks import QANetConvBlock
from sanlab.layers.mixers import MIXERS
from sanlab.models.builders import build_decoder, build_encoder, build_seq2seq
from sanlab.registry import BuildContext


def _valid(b=2, t=9, lengths=(9, 5)):
    return torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]  # [b, t]


def _n(module):
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------- Bi-BloSAN masks
def test_direction_masks_exclude_the_diagonal():
    assert direction_mask(3, "forward").int().tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
    assert direction_mask(3, "backward").int().tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]


def test_intra_block_masks_on_a_padded_sentence():
    x, valid = split_blocks(torch.zeros(1, 5, 2), _valid(1, 5, (5,)), 3)  # 5 tokens -> 2 blocks of 3
    assert x.shape == (1, 2, 3, 2) and valid.int().tolist() == [[[1, 1, 1], [1, 1, 0]]]
    fw, bw = intra_block_mask(valid, "forward")[0], intra_block_mask(valid, "backward")[0]
    assert fw[0].int().tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
    assert fw[1].int().tolist() == [[0, 0, 0], [1, 0, 0], [0, 0, 0]]  # the padded slot sees and is seen by nothing
    assert bw[0].int().tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert bw[1].int().tolist() == [[0, 1, 0], [0, 0, 0], [0, 0, 0]]


def test_feature_attention_equals_a_hand_loop_and_empty_rows_are_zero():
    torch.manual_seed(0)
    att = FeatureAttention(3).double()
    x = torch.randn(4, 3, dtype=torch.double)
    allowed = direction_mask(4, "forward")
    out = att(x, allowed)
    w1, w2 = att.key_query.weight[:3], att.key_query.weight[3:]  # dependent (key) and head (query) maps
    for p in range(4):
        keys = [q for q in range(4) if q < p]
        if not keys:
            assert torch.all(out[p] == 0)  # the first token of a forward block attends to nothing
            continue
        f = torch.stack([5 * torch.tanh((w1 @ x[q] + w2 @ x[p] + att.f_bias) / 5) for q in keys])  # [q, c]
        torch.testing.assert_close(out[p], (torch.softmax(f, dim=0) * x[keys]).sum(0))


@pytest.mark.parametrize("together", [True, False], ids=["directions together", "one after the other"])
@pytest.mark.parametrize("t, lengths, r", [(9, (9, 5), 3), (7, (7, 1), 4), (6, (6, 6), 1), (10, (10, 3), 12)])
def test_the_fast_path_equals_block_direction_forward(t, lengths, r, together, monkeypatch):
    """The fast path (a leading direction axis, fewer passes over the pair tensors), both directions in one
    computation (an accelerator's choice) or one after the other (the CPU's), against ``BlockDirection.forward``
    per direction: values and the gradients of input and every parameter, padded rows and blocks, rows without
    a key (r = 1: every row), a block longer than the sentence."""
    monkeypatch.setattr(block_attention, "directions_together", lambda device: together)
    torch.manual_seed(0)
    core = BiBloSA(dim=8).double()
    with torch.no_grad():  # random everything, so zero-initialised biases are exercised too
        for p in core.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(len(lengths), t, 8, dtype=torch.double)
    valid = _valid(len(lengths), t, lengths)
    probe = torch.randn(len(lengths), t, 8, dtype=torch.double)

    def run(forward):
        core.zero_grad()
        x_in = x.clone().requires_grad_(True)
        out = forward(x_in)
        (out * probe).sum().backward()
        return out, x_in.grad, {name: p.grad.clone() for name, p in core.named_parameters()}

    def per_direction(x_in):
        blocks, block_valid = split_blocks(x_in, valid, r)
        out = torch.cat([direction(blocks, block_valid) for direction in core.directions], dim=-1)
        return out.flatten(1, 2)[:, :t]

    fast, reference = run(lambda x_in: core(x_in, valid, block_len=r)), run(per_direction)
    torch.testing.assert_close(fast[0], reference[0])
    torch.testing.assert_close(fast[1], reference[1], msg=lambda m: "d/d input\n" + m)
    for name, grad in reference[2].items():
        torch.testing.assert_close(fast[2][name], grad, msg=lambda m, name=name: f"d/d {name}\n" + m)


@pytest.mark.parametrize("together", [True, False], ids=["directions together", "one after the other"])
def test_the_fast_path_is_as_precise_as_the_reference_under_bf16_autocast(together, monkeypatch):
    """Under bf16 autocast the fast path's output and gradients are no further from a float64 run than the
    reference's (its pair tensors in fp32, as the reference's are: they were bf16 in a first version, whose
    input gradient was 15% further off)."""
    monkeypatch.setattr(block_attention, "directions_together", lambda device: together)
    torch.manual_seed(0)
    core, r = BiBloSA(dim=128), 5
    with torch.no_grad():  # weights of some size: logits of a few units, where bf16 pair tensors lose digits
        for p in core.parameters():
            p.normal_(0.0, 0.3)
    x = torch.randn(6, 40, 128)
    valid = _valid(6, 40, (40, 33, 20, 7, 2, 1))

    def per_direction(core, x_in):
        blocks, block_valid = split_blocks(x_in, valid, r)
        out = torch.cat([direction(blocks, block_valid) for direction in core.directions], dim=-1)
        return out.flatten(1, 2)[:, :x_in.shape[1]]

    def run(core, forward, x, *, bf16):
        core.zero_grad()
        x_in = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = forward(core, x_in)
        out.double().square().sum().backward()
        return [out.double(), x_in.grad.double(), torch.cat([p.grad.double().flatten() for p in core.parameters()])]

    truth = run(copy.deepcopy(core).double(), per_direction, x.double(), bf16=False)
    fast = run(core, lambda core, x_in: core(x_in, valid, block_len=r), x, bf16=True)
    reference = run(core, per_direction, x, bf16=True)
    for name, t, f, ref in zip(["output", "d/d input", "d/d the weights (all)"], truth, fast, reference):
        error, reference_error = (f - t).norm() / t.norm(), (ref - t).norm() / t.norm()
        print(f"{name}: {error:.4g} against the reference's {reference_error:.4g}")
        assert error <= 1.05 * reference_error, f"{name}: {error:.3g} against the reference's {reference_error:.3g}"


# ----------------------------------------------------------------------------- Block mixer
@pytest.mark.parametrize("together", [False, True], ids=["one direction after the other", "directions together"])
@pytest.mark.parametrize("core", [lambda: BiBloSA(dim=8), lambda: ReferenceBlockAttention(dim=8, heads=2)])
def test_block_attention_padding_invariance_and_zero_padded_outputs(core, together, monkeypatch):
    monkeypatch.setattr(block_attention, "directions_together", lambda device: together)  # (Bi-BloSA's paths)
    torch.manual_seed(0)
    mixer = BlockSelfAttention(core=core(), block_len=3, mode="x").double()
    x = torch.randn(2, 9, 8, dtype=torch.double)
    pos = Positions.self_attention(_valid(), length=9)
    out = mixer(x, positions=pos).output
    assert torch.all(out[1, 5:] == 0)
    x_longer = torch.cat([x, torch.randn(2, 4, 8, dtype=torch.double)], dim=1)  # 13 = extra padded blocks
    longer = mixer(x_longer, positions=Positions.self_attention(_valid(2, 13, (9, 5)), length=13)).output
    torch.testing.assert_close(longer[:, :9], out)
    x_garbage = x.clone()
    x_garbage[1, 5:] = 50.0
    torch.testing.assert_close(mixer(x_garbage, positions=pos).output, out)


def test_auto_block_length_uses_the_longest_real_sentence():
    mixer = BlockSelfAttention(core=BiBloSA(dim=8), block_len="auto", mode="bibosan")
    r = mixer.resolve_block_len(Positions.self_attention(_valid(2, 20, (13, 5)), length=20))
    assert r == math.ceil((2 * 13) ** (1 / 3)) == 3
    assert BlockSelfAttention(core=None, block_len="auto", mode="reference").resolve_block_len(
        Positions.self_attention(None, length=20)) == 4


def test_block_parameter_counts():
    d, heads = 512, 8
    c = d // 2  # per direction: map, intra f, summary, DiSA (map, f, 2 gates, gate bias), fusion
    per_direction = (d * c + c) + (2 * c * c + c) + (c * c + c) + (5 * c * c + 5 * c) + (3 * c * 2 * c + 2 * c)
    mha = 4 * d * d + 4 * d
    assert _n(BiBloSA(dim=d)) == 2 * per_direction
    assert 2 * per_direction - mha == 1_051_648  # spec B.5: ~1.05M extra per layer
    assert _n(ReferenceBlockAttention(dim=d, heads=heads)) - mha == 5 * d * d + 3 * d + d * heads + heads == 1_316_360


def test_block_mixer_only_in_selected_encoder_layers():
    stack = StackConfig(layers=3, ffn_dim=16, attention={"heads": 2}, mixer={"type": "block", "layers": [0]})
    encoder = build_encoder(stack, dim=8, norm="pre", dropout=0.0, max_len=32)
    assert isinstance(encoder.layers[0].mixer, BlockSelfAttention)
    assert all(isinstance(layer.mixer, Attention) for layer in encoder.layers[1:])
    with pytest.raises(ValueError, match="encoder-only"):
        build_decoder(stack, dim=8, norm="pre", dropout=0.0, max_len=32)
    ctx = BuildContext(dim=8, heads=2, layer_index=0, num_layers=1, side="encoder", max_len=32)
    mixer = MIXERS.build(MIXERS.parse({"type": "block"}), ctx, attention=stack.attention)
    with pytest.raises(ValueError, match="encoder-only"):
        mixer(torch.zeros(1, 3, 8), positions=Positions.self_attention(None, length=3, causal=True))


# ----------------------------------------------------------------------------- CNNs
def test_conv_block_parameter_counts():
    d, k = 512, 7
    separable = QANetConvBlock(dim=d, count=1, kernel=k, conv_type="separable", norm="pre", dropout=0.0)
    full = QANetConvBlock(dim=d, count=1, kernel=k, conv_type="full", norm="pre", dropout=0.0)
    assert _n(separable) == k * d + d * d + d + 2 * d == 267_264  # depthwise (no bias) + pointwise + LayerNorm
    assert _n(full) == k * d * d + d + 2 * d


def _hand_conv(conv, window):
    """One output position of a conv pre-block by hand: ``window`` is the k padded inputs [k, d] it reads."""
    if hasattr(conv, "depthwise"):  # DW_k (per channel, no bias) then PW
        w = conv.depthwise.weight[:, 0]  # [d, k]
        dw = torch.stack([sum(w[c, t] * window[t, c] for t in range(window.shape[0])) for c in range(window.shape[1])])
        return conv.pointwise.weight @ dw + conv.pointwise.bias
    w = conv.conv.weight  # [d_out, d_in, k]: one dense kernel
    return conv.conv.bias + sum(w[:, :, t] @ window[t] for t in range(window.shape[0]))


@pytest.mark.parametrize("conv_type", ["separable", "full"])
@pytest.mark.parametrize("causal", [False, True])
def test_conv_block_equals_a_hand_loop(conv_type, causal):
    torch.manual_seed(0)
    k, d, t = 3, 4, 5
    block = QANetConvBlock(dim=d, count=1, kernel=k, conv_type=conv_type, norm="none", dropout=0.0,
                           causal=causal).double()
    with torch.no_grad():  # unit-scale weights, so that the ReLUs are not all closed
        for p in block.parameters():
            p.normal_()
    x = torch.randn(1, t, d, dtype=torch.double, requires_grad=True)
    out = block(x, positions=Positions.self_attention(None, length=t, causal=causal))
    assert (out - x).ne(0).any(dim=-1).all(), "every position's convolution must contribute for the check to bite"
    left, right = (k - 1, 0) if causal else (k // 2, k // 2)  # causal: i-k+1 .. i; same: i-1 .. i+1
    padded = torch.cat([torch.zeros(left, d, dtype=torch.double), x[0], torch.zeros(right, d, dtype=torch.double)])
    expected = torch.stack([x[0, i] + torch.relu(_hand_conv(block.convs[0], padded[i:i + k]))  # residual, no norm
                            for i in range(t)])
    torch.testing.assert_close(out[0], expected)
    weights = torch.randn_like(expected)
    params = [x, *block.parameters()]
    got = torch.autograd.grad((out[0] * weights).sum(), params)
    want = torch.autograd.grad((expected * weights).sum(), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("conv_type", ["separable", "full"])
def test_conv_block_masks_padding_and_ignores_extra_padding(conv_type):
    torch.manual_seed(0)
    block = QANetConvBlock(dim=8, count=4, kernel=7, conv_type=conv_type, norm="pre", dropout=0.0).double()
    x = torch.randn(2, 9, 8, dtype=torch.double)
    pos = Positions.self_attention(_valid(), length=9)
    out = block(x, positions=pos)
    x_garbage = x.clone()
    x_garbage[1, 5:] = 50.0
    torch.testing.assert_close(block(x_garbage, positions=pos)[1, :5], out[1, :5])
    longer = torch.cat([x, torch.randn(2, 3, 8, dtype=torch.double)], dim=1)
    torch.testing.assert_close(block(longer, positions=Positions.self_attention(_valid(2, 12, (9, 5)), length=12))
                               [:, :9][_valid()], out[_valid()])


def test_causal_conv_block_never_sees_the_future():
    torch.manual_seed(0)
    block = QANetConvBlock(dim=8, count=2, kernel=4, conv_type="separable", norm="pre", dropout=0.0, causal=True).double()
    x = torch.randn(1, 7, 8, dtype=torch.double)
    pos = Positions.self_attention(None, length=7, causal=True)
    changed = x.clone()
    changed[0, 4:] = torch.randn(3, 8, dtype=torch.double)  # not a constant shift: the pre-norm would remove it
    out, out_changed = block(x, positions=pos), block(changed, positions=pos)
    torch.testing.assert_close(out_changed[0, :4], out[0, :4])
    assert not torch.allclose(out_changed[0, 4:], out[0, 4:])  # the change does reach the block
    with pytest.raises(ValueError, match="odd kernel width, got 4"):
        QANetConvBlock(dim=8, count=1, kernel=4, conv_type="separable", norm="pre", dropout=0.0)


def test_pre_blocks_config_hook_in_the_encoder_only():
    stack = StackConfig(layers=3, ffn_dim=16, attention={"heads": 2},
                        pre_blocks=[{"type": "conv", "layers": [0, 2], "count": 2, "kernel": 3}])
    encoder = build_encoder(stack, dim=8, norm="post", dropout=0.0, max_len=32)
    assert [len(layer.pre_blocks) for layer in encoder.layers] == [1, 0, 1]
    assert len(encoder.layers[0].pre_blocks[0].convs) == 2
    with pytest.raises(ValueError, match="pre_blocks are encoder-only"):
        build_decoder(stack, dim=8, norm="post", dropout=0.0, max_len=32)


def test_seq2seq_with_block_and_cnns_decodes_like_the_full_forward():
    encoder = StackConfig(layers=2, ffn_dim=16, attention={"heads": 2}, mixer={"type": "block", "layers": [1]},
                          pre_blocks=[{"type": "conv", "layers": [0], "count": 2, "kernel": 3}])
    decoder = StackConfig(layers=2, ffn_dim=16, attention={"heads": 2})
    torch.manual_seed(0)
    model = build_seq2seq(Seq2SeqConfig(dim=8, norm="pre", dropout=0.0, encoder=encoder, decoder=decoder),
                          vocab_size=20, pad_id=0).eval()
    src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))
    src[1, 4:] = 0
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)
        state, steps = model.start_decoding(src), []
        for t in range(5):
            log_probs, state = model.decode_step(tgt[:, t:t + 1], state)
            steps.append(log_probs)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)
