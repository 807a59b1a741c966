"""Dufter et al.'s tagger with each of their attention modifications: parameter counts of spec C.9
(derived from the layer shapes, and equal to the paper's Table 1c), Glorot-normal attention init,
a few training steps per variant, and the shipped recipes."""

import functools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sanlab.config import TaggerConfig, load_config
from sanlab.models.builders import build_tagger, count_parameters

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# PTB setting of spec C.9: 20,000 words + PAD + OOV, 84 characters, 45 tags + PAD + OOV, t = 60.
PTB = dict(vocab_size=20_002, num_chars=84, num_tags=47)
T, HEADS, LAYERS, WORD, CHAR = 60, 4, 4, 300, 64


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny tensors gain nothing from a second thread, and on an oversubscribed CPU OpenMP's spinning
    makes 2 threads 10-20x slower than 1; restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@functools.lru_cache(maxsize=None)  # the two baselines are shared by several deltas
def _ptb_parameters(position: str = "none", parts: tuple = ()) -> int:
    config = TaggerConfig(word_dim=WORD, char_dim=CHAR, char_filters=CHAR, char_width=5, char_layers=3,
                          position=position, position_dim=64, max_len=T, layer_style="dufter",
                          encoder=dict(layers=LAYERS, ffn_dim=0, attention=dict(
                              heads=HEADS, bias=False, out_proj=False, parts=[dict(p) for p in parts])))
    return count_parameters(build_tagger(config, **PTB))


# Part configs as hashable (key, value) tuples, for the cache above.
P = (("type", "abs_position"),)
R = (("type", "rel_position"),)
R_CODE = (("type", "rel_position"), ("rel_param", "circulant_real"))
TEMP = (("type", "temperature"),)
CONV = (("type", "conv_attention"), ("dims", 1))
CONV2D = (("type", "conv_attention"), ("dims", 2))


def _san_formula(width: int) -> int:
    words = PTB["vocab_size"] * WORD
    chars = PTB["num_chars"] * CHAR + 3 * (5 * CHAR * CHAR + CHAR)
    attention = LAYERS * HEADS * 3 * width * (width // HEADS)
    classifier = 2 * width * PTB["num_tags"] + PTB["num_tags"]
    return words + chars + attention + classifier


def test_ptb_san_total_matches_the_layer_shapes_and_table_1c():
    san = _ptb_parameters()
    assert san == _san_formula(WORD + CHAR)
    assert san == 7_691_823  # Dufter et al., Table 1c


@pytest.mark.parametrize("position,parts,base,delta", [
    ("add", (), "none", T * WORD),                                                        # +PE[add]  18,000
    ("none", (P,), "none", HEADS * T * T),                                                # +P        14,400
    ("none", (R,), "none", HEADS * 2 * T),                                                # +R           480
    ("none", (R_CODE,), "none", HEADS * 2 * T),
    ("none", (P, R), "none", HEADS * (T * T + 2 * T)),
    ("add", (TEMP,), "add", LAYERS * HEADS * 3),                                          # +Temp         48
    ("add", (CONV,), "add", LAYERS * HEADS * (3 * T * T + T)),                            # +Conv    173,760
    ("add", (CONV2D,), "add", LAYERS * HEADS * (9 + 1)),                                  # +Conv2d      160
], ids=["pe-add", "p", "r-paper", "r-circulant", "p+r", "temp", "conv", "conv2d"])
def test_ptb_parameter_deltas(position, parts, base, delta):
    assert _ptb_parameters(position, parts) - _ptb_parameters(base) == delta


def test_ptb_parameter_deltas_equal_table_1c():
    assert (T * WORD, HEADS * T * T, HEADS * 2 * T, LAYERS * HEADS * 3,
            LAYERS * HEADS * (3 * T * T + T), LAYERS * HEADS * 10) == (18_000, 14_400, 480, 48, 173_760, 160)


def test_pe_concat_widens_the_model_to_428():
    width = WORD + 64 + CHAR
    assert _ptb_parameters("concat") == _san_formula(width) + T * 64


def test_attention_matrices_start_glorot_normal_per_head():
    config = TaggerConfig(word_dim=WORD, position="none")
    model = build_tagger(config, vocab_size=10, num_chars=10, num_tags=5)
    width = WORD + 64
    w = model.encoder.layers[0].mixer.q_proj.weight.detach()  # [h*d, width]
    target = math.sqrt(2.0 / (width + width // 4))  # fan_in = d_in, fan_out = d_h
    assert abs(w.std().item() - target) < 0.03 * target
    assert w.abs().max() <= 2 * target / 0.87962566103423978


@pytest.mark.parametrize("dense_init", ["glorot_uniform", "torch"])
def test_char_cnn_and_classifier_start_as_keras_defaults_in_the_reproduce_profile(dense_init):
    """Spec C.10: Glorot-uniform kernels (a Conv1D's fans count its width) and zero biases; "torch" keeps
    PyTorch's U(+-1/sqrt(fan_in)) weights and biases, with which the clean recipe's grids were trained."""
    torch.manual_seed(0)
    config = TaggerConfig(word_dim=WORD, position="none", dense_init=dense_init)
    model = build_tagger(config, vocab_size=10, num_chars=10, num_tags=47)
    width = WORD + 64
    layers = [(conv, 5 * CHAR, 5 * CHAR) for conv in model.char_cnn.convs] + [(model.classifier, 2 * width, 47)]
    for layer, fan_in, fan_out in layers:
        w, bound = layer.weight.detach(), math.sqrt(6 / (fan_in + fan_out))
        if dense_init == "glorot_uniform":
            assert 0.95 * bound < w.abs().max() <= bound and not layer.bias.any()
        else:
            assert w.abs().max() <= 1 / math.sqrt(fan_in) < 0.95 * bound and layer.bias.any()


VARIANTS = {
    "pe-add": ("add", []),
    "pe-con": ("concat", []),
    "p+r": ("none", [{"type": "abs_position"}, {"type": "rel_position", "rel_param": "circulant_real"}]),
    "temp": ("add", [{"type": "temperature"}]),
    "conv": ("add", [{"type": "conv_attention", "dims": 1}]),
    "conv2d": ("add", [{"type": "conv_attention", "dims": 2}]),
}


def _tiny(position: str, parts: list, *, mask_padding: bool = True) -> torch.nn.Module:
    config = TaggerConfig(word_dim=8, char_dim=4, char_filters=4, char_width=3, char_layers=1, position=position,
                          position_dim=4, max_len=10, mask_padding=mask_padding,
                          encoder=dict(layers=2, ffn_dim=0, attention=dict(
                              heads=2, bias=False, out_proj=False, parts=parts)))
    return build_tagger(config, vocab_size=30, num_chars=10, num_tags=5)


def _batch(length: int = 10):
    g = torch.Generator().manual_seed(1)
    words = torch.randint(2, 30, (4, length), generator=g)
    words[1, 7:] = 0
    words[3, 4:] = 0
    chars = torch.randint(1, 10, (4, length, 5), generator=g)
    tags = torch.randint(0, 5, (4, length), generator=g)
    return words, chars, tags


@pytest.mark.parametrize("name,mask_padding", [(name, True) for name in VARIANTS]
                         + [(name, False) for name in ("p+r", "conv", "conv2d")])  # the reference masks nothing
def test_tiny_tagger_trains_without_nan(name, mask_padding):
    position, parts = VARIANTS[name]
    torch.manual_seed(0)  # the model's initialisation, whatever ran before in this process
    model = _tiny(position, parts, mask_padding=mask_padding)
    words, chars, tags = _batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    part_params = [p for layer in model.encoder.layers for p in layer.mixer.parts.parameters()]
    assert bool(part_params) == bool(parts)
    losses = []
    for step in range(30):
        logits = model(words, chars)
        loss = F.cross_entropy(logits[words.ne(0)], tags[words.ne(0)])  # PAD tokens weigh 0
        opt.zero_grad()
        loss.backward()
        if step == 0:  # the parts are wired in (asked at the start: 30 steps at this rate may saturate a softmax)
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in part_params)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]


def test_position_interactions_refuse_chunks_longer_than_t():
    model = _tiny(*VARIANTS["p+r"])
    words, chars, _ = _batch(length=11)
    with pytest.raises(ValueError, match="t = 10"):
        model(words, chars)


@pytest.mark.parametrize("mask_padding", [True, False], ids=["masked", "reference"])
@pytest.mark.parametrize("name", [*VARIANTS, "none"])
def test_one_word_and_t_word_chunks_are_tagged_and_a_longer_chunk_is_refused(name, mask_padding):
    """t = model.max_len = 10: a one-word sentence (alone, and beside a full chunk) and a chunk of exactly t words
    give finite tags, the one word the same alone as in the batch; t + 1 words is a clear error in every position
    mode, also without a learned table or a part sized t (position none) that would refuse it on its own."""
    position, parts = VARIANTS.get(name, ("none", []))
    torch.manual_seed(0)
    model = _tiny(position, parts, mask_padding=mask_padding).eval()
    words, chars, _ = _batch(length=10)
    words[0, 1:] = 0  # one word, then padding
    with torch.no_grad():
        together = model(words, chars)
        assert torch.isfinite(together).all()
        if mask_padding:  # (unmasked, the reference pads every chunk to t: no shorter batch exists)
            torch.testing.assert_close(model(words[:1, :1], chars[:1, :1]), together[:1, :1])
        longer, longer_chars, _ = _batch(length=11)
        with pytest.raises(ValueError, match=r"11 words.* t = 10 \(model.max_len\)"):
            model(longer, longer_chars)


@pytest.mark.parametrize("name,position,types", [
    ("ud-ewt-pr.yaml", "none", ["abs_position", "rel_position"]),
    ("ud-ewt-p.yaml", "none", ["abs_position"]),
    ("ud-ewt-r.yaml", "none", ["rel_position"]),
    ("ud-ewt-temp.yaml", "add", ["temperature"]),
    ("ud-ewt-conv.yaml", "add", ["conv_attention"]),
    ("ud-ewt-conv2d.yaml", "add", ["conv_attention"]),
    ("ud-ewt-pe-con.yaml", "concat", []),
])
def test_recipes_load_with_the_intended_parts(name, position, types):
    config = load_config(CONFIGS / name)
    assert config.model.position == position
    assert [p.type for p in config.model.encoder.attention.parts] == types


@pytest.mark.parametrize("parts", [
    [], [{"type": "abs_position"}, {"type": "rel_position"}], [{"type": "temperature"}],
    [{"type": "conv_attention", "dims": 1}], [{"type": "conv_attention", "dims": 2}],
    [{"type": "window", "size": 3}], [{"type": "csan2d", "size": 3, "heads_area": 3}], [{"type": "capsule"}],
], ids=lambda parts: "+".join(p["type"] + str(p.get("dims", "")) for p in parts) or "vanilla")
def test_tagger_outputs_do_not_depend_on_batch_padding(parts):
    config = TaggerConfig(word_dim=16, char_dim=8, char_filters=8, char_layers=1, position="add", max_len=12,
                          encoder=dict(layers=2, ffn_dim=0, attention=dict(heads=4, parts=parts)))
    torch.manual_seed(0)
    model = build_tagger(config, vocab_size=30, num_chars=20, num_tags=5).eval()
    with torch.no_grad():  # at the Keras init (±0.05, no norm) the scores are ~1e-3 and capsule routing's
        model.word_embed.weight.mul_(20)  # term ~1e-7, below the tolerance: scale up so that padding would show
        model.positions.table.weight.mul_(20)
    words = torch.randint(2, 30, (1, 5))
    chars = torch.randint(1, 20, (1, 5, 20)) * (torch.arange(20) < 4)   # words of 4 characters
    other_words = torch.randint(2, 30, (1, 9))
    other_chars = torch.randint(1, 20, (1, 9, 20)) * (torch.arange(20) < 7)
    alone = model(words, chars)
    batch_words = torch.cat([F.pad(words, (0, 4)), other_words])          # sentence 0 padded to 9 words
    batch_chars = torch.cat([F.pad(chars, (0, 0, 0, 4)), other_chars])
    together = model(batch_words, batch_chars)[:1, :5]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("train_pad_rows", [False, True])
def test_pad_rows_of_the_word_and_char_tables_train_only_in_the_reproduce_profile(train_pad_rows):
    """Keras trains every embedding row, PAD (index 0) included (spec C.10); the clean profile keeps the
    PAD rows as drawn. Either way they start as drawn (uniform ±0.05), not at zero."""
    from sanlab.config import TaggerConfig
    from sanlab.models.builders import build_tagger

    torch.manual_seed(0)
    model = build_tagger(TaggerConfig(mask_padding=not train_pad_rows, train_pad_rows=train_pad_rows),
                         vocab_size=30, num_chars=20, num_tags=5)
    words = torch.tensor([[5, 6, 0, 0]])                    # two words, then PAD words
    chars = torch.tensor([[[3, 4, 0], [5, 0, 0], [0, 0, 0], [0, 0, 0]]])  # words padded with PAD characters
    model(words, chars).sum().backward()
    for table in (model.word_embed, model.char_cnn.embed):
        assert table.weight[0].abs().max() > 0
        assert bool(table.weight.grad[0].abs().max() > 0) == train_pad_rows


def test_char_cnn_on_distinct_words_equals_every_slot_in_values_and_gradients():
    """The fast path (each distinct character sequence once, gathered back; found in the forward or brought
    by the batch, as ``encode_batch`` does) against the reference (every word slot of the batch), with repeats
    and padding words as in a real batch."""
    from sanlab.models.tagger import CharCNN, CharWords

    g = torch.Generator().manual_seed(0)
    chars = torch.randint(1, 9, (4, 7, 6), generator=g)
    chars[:, :, 4:] = 0                               # words padded with PAD characters
    chars[1, 2] = chars[0, 0]                         # repeated words
    chars[3, 5] = chars[0, 0]
    chars[2, 4:] = 0                                  # padding words
    results = []
    for distinct, brought in ((False, None), (True, None), (True, CharWords.of(chars))):
        torch.manual_seed(1)
        cnn = CharCNN(num_chars=9, dim=8, filters=5, width=3, layers=2, train_pad_row=True).double()
        cnn.distinct_words = distinct
        out = cnn(chars, brought)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append((out, {n: p.grad.clone() for n, p in cnn.named_parameters()}))
    (ref, ref_grads), *fast_paths = results
    assert CharWords.of(chars).distinct.shape[0] < 4 * 7  # the repeats are run once
    for fast, fast_grads in fast_paths:
        assert fast.shape == (4, 7, 5)
        torch.testing.assert_close(fast, ref)
        for name in ref_grads:
            torch.testing.assert_close(fast_grads[name], ref_grads[name], msg=name)


def test_char_cnn_on_distinct_words_keeps_bf16_gradients_of_frequent_words():
    """Under bf16 autocast the gradients of a word repeated in most slots (padding words without the
    mask) are summed in fp32, so the distinct path is as close to fp32 as running every slot."""
    from sanlab.models.tagger import CharCNN

    g = torch.Generator().manual_seed(0)
    chars = torch.randint(1, 30, (32, 60, 20), generator=g)
    chars[:, 30:] = chars[0, 0]  # half the slots: one repeated word

    def grads(distinct: bool, bf16: bool) -> dict:
        torch.manual_seed(1)
        cnn = CharCNN(num_chars=30, dim=16, filters=16, width=5, layers=2, train_pad_row=True)
        cnn.distinct_words = distinct
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = cnn(chars)
        out.float().sum().backward()
        return {n: p.grad for n, p in cnn.named_parameters()}

    exact = grads(False, bf16=False)
    for distinct in (False, True):
        approx = grads(distinct, bf16=True)
        for name in ("embed.weight", "convs.0.bias"):
            error = (approx[name] - exact[name]).norm() / exact[name].norm()
            assert error < 0.02, (distinct, name, float(error))
