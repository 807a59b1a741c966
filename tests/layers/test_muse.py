"""MUSE (Zhao et al. 2019): gate, fused projection, the parallel block against hand-composed formulas,
cached == full, causality of every branch, source-padding invariance, and the released parameter counts."""

import pytest
import torch
import torch.nn.functional as F

from sanlab.attention.positions import Positions
from sanlab.config import Seq2SeqConfig, StackConfig, load_config
from sanlab.decoding.cache import reorder
from sanlab.layers.muse import MultiScaleAttention, gate_weights
from sanlab.models.builders import build_seq2seq, count_parameters

D, H, F_DIM, V = 16, 4, 24, 30


def tiny(mixer, *, layers=2, norm="post", seed=0):
    stack = StackConfig(layers=layers, ffn_dim=F_DIM, attention={"heads": H}, mixer=mixer)
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(dim=D, norm=norm, dropout=0.0, share_embeddings=True, encoder=stack, decoder=stack)
    return build_seq2seq(cfg, vocab_size=V, pad_id=0).eval()


MUSE = {"type": "muse", "kernel_sizes": [3, 5]}
MIXERS = [MUSE, {**MUSE, "decoder_cross": "sequential"}, {"type": "muse_ff"},
          {"type": "muse_ff", "decoder_cross": "sequential"}]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_gate_weights_are_exactly_one_over_n_at_init(n):
    model = tiny({"type": "muse", "kernel_sizes": [3, 5, 7][:n]})
    weights = gate_weights(model)
    assert len(weights) == 4  # 2 encoder + 2 decoder layers
    for g in weights.values():
        assert torch.equal(g, torch.full((n,), 1.0 / n))
    # the softmax above is 1/n for any constant alpha; the init itself matters under weight decay
    alphas = [m.gate for m in model.modules() if isinstance(m, MultiScaleAttention)]
    assert len(alphas) == 4 and all(torch.equal(a.detach(), torch.full((n,), 1.0 / n)) for a in alphas)


def test_one_value_projection_serves_attention_and_convolutions():
    # spec 9: self-attn+conv = 3d^2+3d (in-proj) + 2d*d+d (fused out-proj) + sum_k d*H*k (predictors) + n (gate)
    block = tiny(MUSE).encoder.layers[0].mixer.mixer
    assert isinstance(block, MultiScaleAttention)
    assert count_parameters(block) == 3 * D * D + 3 * D + 2 * D * D + D + D * H * (3 + 5) + 2
    x = torch.randn(1, 5, D)
    v = block.attention.v_proj(x)
    block.attention.v_proj.bias.data += 1.0  # the conv input moves with W^V's bias (V includes it)
    assert not torch.allclose(block.attention.v_proj(x), v)
    out = block.convolve(x, positions=Positions.self_attention(None, length=5))[0]
    ref = sum(g * cell(block.attention.v_proj(x))[0] for g, cell in zip(block.gate_weights(), block.cells))
    torch.testing.assert_close(out, ref)


def _muse_ff_weights_from(muse_model):
    """MUSE_FF state dict taking MUSE's weights, with W^O = the attention half of the fused projection."""
    state = {}
    for key, value in muse_model.state_dict().items():
        if ".cells." in key or key.endswith(".gate"):
            continue
        if key.endswith("mixer.mixer.out_proj.weight"):
            value = value[:, :D]
        state[key.replace("mixer.mixer.attention.", "mixer.mixer.")] = value
    return state


def test_without_the_convolutions_muse_equals_muse_ff():
    muse, muse_ff = tiny(MUSE), tiny({"type": "muse_ff"}, seed=1)
    with torch.no_grad():
        for name, p in muse.named_parameters():
            if name.endswith("mixer.mixer.out_proj.weight"):
                p[:, D:] = 0.0  # the conv branch removed: [Z ; D] W^O = Z W^O_att
    muse_ff.load_state_dict(_muse_ff_weights_from(muse))
    src, tgt = torch.randint(1, V, (2, 7)), torch.randint(1, V, (2, 6))
    src[1, 5:] = 0
    torch.testing.assert_close(muse(src, tgt), muse_ff(src, tgt))


def _ln(layer_norm, x):
    return F.layer_norm(x, (D,), layer_norm.weight, layer_norm.bias, layer_norm.eps)


def _parts(model):
    layer = model.decoder.layers[0]
    block = layer.self_mixer
    return layer, block


def _inputs(model):
    src = torch.randint(1, V, (2, 7))
    memory, memory_valid = model.encode(src)
    pos = Positions.self_attention(None, length=5, causal=True)
    cross = Positions.cross_attention(pos, memory_valid, memory_length=7)
    return torch.randn(2, 5, D), memory, pos, cross


def test_parallel_decoder_layer_is_one_residual_over_four_terms():
    model = tiny({"type": "muse_ff"})
    layer, block = _parts(model)
    x, memory, pos, cross = _inputs(model)
    out, _ = layer(x, memory=memory, positions=pos, cross_positions=cross)
    attn = block.mixer(x, positions=pos).output
    ctx = block.cross_attention(x, positions=cross, memory=memory).output
    expected = _ln(layer.self_res.norm, x + attn + ctx + block.ffn(x))  # X' = LN(X + Self + Cross + FFN)
    torch.testing.assert_close(out, expected)
    assert layer.cross_attention is None and layer.ffn is None
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in layer.modules()) == 1


def test_sequential_decoder_layer_follows_the_iclr_text():
    model = tiny({"type": "muse_ff", "decoder_cross": "sequential"})
    layer, block = _parts(model)
    x, memory, pos, cross = _inputs(model)
    out, _ = layer(x, memory=memory, positions=pos, cross_positions=cross)
    x1 = _ln(layer.self_res.norm, x + block.mixer(x, positions=pos).output + block.ffn(x))  # MUSE sub-layer
    expected = _ln(layer.cross_res.norm, x1 + layer.cross_attention(x1, positions=cross, memory=memory).output)
    torch.testing.assert_close(out, expected)


def test_each_branch_output_gets_its_own_dropout_and_the_residual_none():
    model = tiny(MUSE)
    layer, block = _parts(model)
    assert layer.self_res.dropout.p == 0.0 and block.drops_branches
    stack = StackConfig(layers=1, ffn_dim=F_DIM, attention={"heads": H}, mixer=MUSE)
    dropped = build_seq2seq(Seq2SeqConfig(dim=D, dropout=0.3, encoder=stack, decoder=stack), vocab_size=V, pad_id=0)
    assert dropped.decoder.layers[0].self_mixer.dropout.p == 0.3
    assert dropped.decoder.layers[0].self_res.dropout.p == 0.0


@pytest.mark.parametrize("mixer", MIXERS, ids=["muse", "muse-seq", "muse_ff", "muse_ff-seq"])
def test_cached_decoding_with_beam_reorder_equals_full_forward(mixer):
    model = tiny(mixer)
    src, tgt = torch.randint(4, V, (3, 9)), torch.randint(4, V, (3, 7))
    src[1, 6:] = 0
    index = torch.tensor([2, 0, 0])  # after 3 steps the beams are reshuffled
    with torch.no_grad():
        full = torch.log_softmax(model(src[index], tgt[index]), dim=-1)
        state, steps = model.start_decoding(src), []
        for t in range(tgt.shape[1]):
            if t == 3:
                state, steps = reorder(state, index), [s[index] for s in steps]
            log_probs, state = model.decode_step((tgt if t < 3 else tgt[index])[:, t:t + 1], state)
            steps.append(log_probs)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("branch", ["attention", "conv3", "conv15"])
def test_every_decoder_branch_is_causal(branch):
    block = tiny({"type": "muse", "kernel_sizes": [3, 15]}).decoder.layers[0].self_mixer.mixer
    with torch.no_grad():  # isolate one branch: zero the other half of W^O, one-hot gate
        if branch == "attention":
            block.out_proj.weight[:, D:] = 0.0
        else:
            block.out_proj.weight[:, :D] = 0.0
            block.gate.copy_(torch.tensor([0.0, -float("inf")] if branch == "conv3" else [-float("inf"), 0.0]))
    pos = Positions.self_attention(None, length=20, causal=True)
    x = torch.randn(2, 20, D)
    x2 = x.clone()
    x2[:, 9:] = torch.randn(2, 11, D)
    out, out2 = block(x, positions=pos).output, block(x2, positions=pos).output
    torch.testing.assert_close(out2[:, :9], out[:, :9])
    assert not torch.allclose(out2[:, 9:], out[:, 9:])


def test_model_decoder_is_causal():
    model = tiny(MUSE)
    src, tgt = torch.randint(4, V, (2, 6)), torch.randint(4, V, (2, 8))
    tgt2 = tgt.clone()
    tgt2[:, 5:] = torch.randint(4, V, (2, 3))
    torch.testing.assert_close(model(src, tgt2)[:, :5], model(src, tgt)[:, :5])


@pytest.mark.parametrize("mask", [True, False])
def test_conv_mask_padding_makes_real_tokens_invariant_to_source_padding(mask):
    model = tiny({**MUSE, "conv_mask_padding": mask})
    src = torch.randint(4, V, (1, 6))
    padded = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    batch = torch.cat([padded, torch.randint(4, V, (1, 10))])
    with torch.no_grad():
        alone, padded_out = model.encode(src)[0], model.encode(batch)[0][:1, :6]
    if mask:
        torch.testing.assert_close(padded_out, alone, atol=1e-5, rtol=1e-5)
    else:  # the released code's behaviour: pad positions' values leak into the last real tokens
        assert not torch.allclose(padded_out[:, -1], alone[:, -1], atol=1e-4)


def test_reference_init_zeroes_biases_and_widens_output_projections():
    block = tiny(MUSE).encoder.layers[0].mixer
    fused = block.mixer.out_proj.weight  # fan_in 2d: Kaiming-uniform a=1 -> U(+-sqrt(3 / 2d))
    assert fused.abs().max() <= (3 / (2 * D)) ** 0.5 and fused.abs().max() > 1 / (2 * D) ** 0.5
    biases = [m.bias for m in block.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert biases and all(torch.all(b == 0) for b in biases)


def test_projection_parts_are_refused_where_they_would_miss_the_convolutions():
    """Temperature's gamma_v would scale the attention's V but not the V the convolution cells read."""
    with_temperature = {"heads": H, "parts": [{"type": "temperature"}]}
    stack = StackConfig(layers=1, ffn_dim=F_DIM, attention=with_temperature, mixer=MUSE)
    with pytest.raises(ValueError, match="LearnableTemperature.*MUSE_FF"):
        build_seq2seq(Seq2SeqConfig(dim=D, encoder=stack, decoder=StackConfig(layers=1, ffn_dim=F_DIM)),
                      vocab_size=V, pad_id=0)
    ff_stack = StackConfig(layers=1, ffn_dim=F_DIM, attention=with_temperature, mixer={"type": "muse_ff"})
    build_seq2seq(Seq2SeqConfig(dim=D, encoder=ff_stack, decoder=StackConfig(layers=1, ffn_dim=F_DIM)),
                  vocab_size=V, pad_id=0)  # no convolutions: nothing is missed


def test_muse_needs_at_least_one_kernel():
    with pytest.raises(ValueError, match="kernel_sizes"):
        StackConfig(mixer={"type": "muse", "kernel_sizes": []})


def _count(tmp_path, preset, model: str = "{}", **vocab):
    path = tmp_path / "c.yaml"
    path.write_text(f"base: preset:{preset}\ntask: translation\n"
                    "data: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
                    f"model: {model}\n")
    with torch.device("meta"):  # no memory, no init cost: only the shapes are counted
        return count_parameters(build_seq2seq(load_config(path).model, pad_id=0, **vocab))


def spec_count(*, d, f, heads, layers, vocab_rows, conv=True):
    """docs/spec/muse.md 9: encoder layer = self + 2d + FFN; decoder layer = self + 2d + cross + 2d (one unused)
    + FFN."""
    self_mix = 3 * d * d + 3 * d + ((2 * d * d + d + d * heads * (3 + 15) + 2) if conv else d * d + d)
    ffn, cross = 2 * d * f + f + d, 4 * d * d + 4 * d
    return layers * (self_mix + 2 * d + ffn) + layers * (self_mix + 4 * d + cross + ffn) + vocab_rows * d


@pytest.mark.parametrize("preset,vocab,conv,logged", [
    ("muse_iwslt", dict(vocab_size=8848, tgt_vocab_size=6632), True, 48_193_584),
    ("muse_ff_iwslt", dict(vocab_size=8848, tgt_vocab_size=6632), False, 43_991_040),
    ("muse_enfr", dict(vocab_size=44512), True, 252_088_368),
    ("muse_ff_enfr", dict(vocab_size=44512), False, 232_624_128),
])
def test_presets_reproduce_the_released_parameter_counts(tmp_path, preset, vocab, conv, logged):
    iwslt = "iwslt" in preset
    dims = dict(d=384, f=768, heads=4) if iwslt else dict(d=768, f=3072, heads=16)
    rows = 8848 + 2 * 6632 if iwslt else 44512  # untied source, target and output tables / one shared table
    expected = spec_count(**dims, layers=12, vocab_rows=rows, conv=conv)
    assert expected == logged
    assert _count(tmp_path, preset, **vocab) == logged


IWSLT_VOCAB = dict(vocab_size=8848, tgt_vocab_size=6632)
D512 = "{dim: 512, encoder: {ffn_dim: 1024, layers: %d}, decoder: {ffn_dim: 1024, layers: %d}}"
T12 = ("{share_embeddings: false, tie_output: false, dim: %d, encoder: {layers: 12, ffn_dim: %d, attention: {heads: 4}}, "
       "decoder: {layers: 12, ffn_dim: %d, attention: {heads: 4}}}")
KERNELS_12 = "[3, 7, 15, 31, 31, 31, 31, 31, 31, 31, 31, 31]"
DC12 = ("{dim: %d, encoder: {layers: 12, ffn_dim: %d, mixer: {kernel_size: " + KERNELS_12 + "}}, "
        "decoder: {layers: 12, ffn_dim: %d, mixer: {kernel_size: " + KERNELS_12 + "}}}")


@pytest.mark.parametrize("preset,model,count", [
    ("muse_iwslt", D512 % (6, 6), 46_440_472),        # MUSE Table 3 "47M"
    ("muse_iwslt", D512 % (12, 12), 81_559_600),      # MUSE Table 3 "82M"
    ("transformer_base", "{share_embeddings: false, tie_output: false, encoder: {ffn_dim: 1024, "
                         "attention: {heads: 4}}, decoder: {ffn_dim: 1024, attention: {heads: 4}}}", 42_864_640),
    ("dynamic_conv_iwslt", "{}", 38_685_184),         # MUSE Table 3 "DynamicConv 39M"
    # the deeper Table 3 rows (12+12 layers, FFN 2d, 4 heads); they diverged in training but their sizes are given
    ("transformer_base", T12 % (512, 1024, 1024), 74_407_936),   # "Transformer (12L, dim = 512) 74M"
    ("transformer_base", T12 % (384, 768, 768), 44_009_472),     # "Transformer (12L, dim = 384) 44M"
    # the paper gives no 12-layer kernel schedule: fairseq's IWSLT one continued with 31 (a width moves a layer's
    # count by d*H per tap, far below the 0.5M rounding)
    ("dynamic_conv_iwslt", DC12 % (512, 1024, 1024), 63_045_632),  # "DynamicConv (12L, dim = 512) 63M"
    ("dynamic_conv_iwslt", DC12 % (384, 768, 768), 37_847_040),    # "DynamicConv (12L, dim = 384) 38M"
])
def test_the_other_iwslt_rows_of_muse_table_3(tmp_path, preset, model, count):
    assert _count(tmp_path, preset, model, **IWSLT_VOCAB) == count


def test_sequential_decoder_has_the_same_count_without_an_unused_norm(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("base: preset:muse_iwslt\ntask: translation\n"
                    "data: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n"
                    "model: {decoder: {mixer: {decoder_cross: sequential, unused_cross_norm: false}}}\n")
    with torch.device("meta"):
        model = build_seq2seq(load_config(path).model, vocab_size=8848, tgt_vocab_size=6632, pad_id=0)
    assert count_parameters(model) == 48_193_584


def test_unused_cross_norm_is_counted_but_never_used():
    with_norm, without = tiny({**MUSE, "unused_cross_norm": True}), tiny(MUSE)
    assert count_parameters(with_norm) - count_parameters(without) == 2 * 2 * D  # one LayerNorm per decoder layer
    src, tgt = torch.randint(1, V, (2, 5)), torch.randint(1, V, (2, 4))
    with_norm(src, tgt).sum().backward()
    norms = [layer.self_mixer.reference_only for layer in with_norm.decoder.layers]
    assert all(p.grad is None for norm in norms for p in norm.parameters())
