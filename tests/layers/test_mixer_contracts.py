"""Contracts for every registered mixer and pre-block, enrolled automatically from the MIXERS and
PRE_BLOCKS registries.

Each mixer fills the encoder and (when it has a causal form) the decoder of a tiny Seq2Seq:
cached step-by-step decoding == the teacher-forced forward; a later target token never changes
earlier outputs; extra source padding leaves real positions unchanged; finite outputs and gradients;
a mixer with a choice of algorithm (band matrix / unfold) gives the same values and gradients with each.
A pre-block (CNNs) goes in front of the encoder's self-attention (the decoder refuses pre-blocks).
"""

import pytest
import torch

from decoder_forms import ENCODER_ONLY_MIXERS
from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.decoding.cache import reorder
from sanlab.layers.mixers import MIXERS
from sanlab.layers.pre_blocks import PRE_BLOCKS
from sanlab.models.builders import build_seq2seq
from tests_helpers import perturb, spy_conv_algorithms

import sanlab.config  # noqa: F401  (imports every mixer module, so the registry is complete)


def _model(mixer: str | dict, *, decoder: bool, pre_blocks: list[dict] = ()):
    mixer = dict({"type": mixer} if isinstance(mixer, str) else mixer)
    attention = {"heads": 4, "parts": mixer.pop("attention_parts", [])}  # (a test form's parts of the attention)
    enc = StackConfig(layers=2, ffn_dim=32, attention=attention, mixer=mixer, pre_blocks=list(pre_blocks))
    dec = StackConfig(layers=2, ffn_dim=32, attention=attention, mixer=mixer if decoder else {"type": "attention"})
    torch.manual_seed(0)
    # max_positions 16: the longest test sequence is 11, and convolved attention works on a t x t grid of it
    cfg = Seq2SeqConfig(dim=16, dropout=0.0, norm="post", encoder=enc, decoder=dec, max_positions=16)
    model = build_seq2seq(cfg, vocab_size=30, pad_id=0).double().eval()
    perturb(model, 0.1)  # off the initial values: gates, biases and scales that start neutral now matter
    return model


# (ENCODER_ONLY_MIXERS is fixed in decoder_forms.py, so that a regression refusing the decoder fails)


def _decoder_capable(mixer: str | dict) -> bool:
    name = mixer if isinstance(mixer, str) else mixer["type"]
    return name not in ENCODER_ONLY_MIXERS


def test_encoder_only_mixers_refuse_the_decoder_and_the_others_build():
    for name in MIXER_NAMES:
        if name in ENCODER_ONLY_MIXERS:
            with pytest.raises(ValueError, match="decoder|causal"):
                _model(name, decoder=True)
        else:
            _model(name, decoder=True)


MIXER_NAMES = MIXERS.names()
# every example of every mixer (its config's examples()) in every layer, and each mixer's first example in the
# upper layer only (`layers`: the other layer keeps plain attention)
MIXER_FORMS = [pytest.param({**cfg.model_dump(), "layers": layers}, id=f"{name}-{n}" + ("-upper" if layers else ""))
               for name in MIXER_NAMES for n, cfg in enumerate(MIXERS.entry(name).config.examples())
               for layers in ((None,) if n else (None, [1]))]


# every example of every pre-block type (the conv block's second is in the upper layer only)
PRE_BLOCK_CONFIGS = [cfg.model_dump() for name in PRE_BLOCKS.names()
                     for cfg in PRE_BLOCKS.entry(name).config.examples()]


def test_every_mixer_and_pre_block_has_several_examples():
    """examples() is what enrols a form in these contracts: the default alone leaves its options unchecked."""
    for registry in (MIXERS, PRE_BLOCKS):
        for name in registry.names():
            examples = registry.entry(name).config.examples()
            assert len(examples) >= (1 if name == "attention" else 2), name  # (attention's forms are its parts')
            assert all(example.type == name for example in examples), name


@pytest.mark.parametrize("mixer, pre_blocks", [pytest.param(m.values[0], [], id=m.id) for m in MIXER_FORMS]
                         + [pytest.param("attention", [block], id=f"pre-{n}")
                            for n, block in enumerate(PRE_BLOCK_CONFIGS)])
def test_source_padding_invariance_and_finite_gradients(mixer, pre_blocks):
    # the mixer on both sides where it has a decoder form: its cross-attention branch (MUSE) must mask the
    # source padding too. 9 pad tokens (16 = max_positions): Block's automatic block length would change if
    # padding counted (ceil((2 * 16) ** (1/3)) = 4 against 3 for the 7 real tokens).
    model = _model(mixer, decoder=_decoder_capable(mixer), pre_blocks=pre_blocks)
    src = torch.randint(4, 30, (1, 7))
    tgt = torch.randint(4, 30, (1, 5))
    padded = torch.cat([src, torch.zeros(1, 9, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt))
    model.train()
    model(torch.cat([padded, torch.randint(4, 30, (1, 16))]), torch.cat([tgt, tgt])).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# options that change the decoder's incremental path, beyond each mixer's defaults; attention parts that
# keep more than keys and values (capsule routing: its cube rows; convolved attention: the decoder's inputs,
# PrefixState) must follow reordered beams
DECODER_OPTION_FORMS = [
    {"type": "dynamic_conv", "kernel_size": [3, 5], "heads": 2, "glu": False},
    {"type": "light_conv", "kernel_size": [5, 3], "heads": 2, "glu": True},
    {"type": "muse", "kernel_sizes": [3, 5], "decoder_cross": "sequential"},
    {"type": "muse", "kernel_sizes": [3], "attention_parts": [{"type": "window", "size": 3}]},
    {"type": "attention", "attention_parts": [{"type": "capsule"}]},
    {"type": "attention", "attention_parts": [{"type": "conv_attention", "dims": 2}]},
    {"type": "attention", "attention_parts": [{"type": "local_hard", "truncate": True, "window": 2.0}]},
    {"type": "attention", "attention_parts": [{"type": "local_hard", "luong_exact": True, "window": 2.0}]},
]


@pytest.mark.parametrize("mixer", MIXER_FORMS + DECODER_OPTION_FORMS)
def test_decoder_cached_equals_full_and_no_future_leak(mixer):
    if not _decoder_capable(mixer):
        pytest.skip(f"mixer {mixer!r} has no causal form (its builder refuses the decoder side)")
    model = _model(mixer, decoder=True)
    src = torch.randint(4, 30, (2, 6))
    src[1, 4:] = 0
    tgt = torch.randint(4, 30, (2, 7))
    swap = torch.tensor([1, 0])  # beams reordered mid-decode: the caches must follow their rows
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)
        state, steps = model.start_decoding(src), []
        for t in range(tgt.shape[1]):
            log_probs, state = model.decode_step(tgt[:, t:t + 1], state)
            steps.append(log_probs)
        torch.testing.assert_close(torch.stack(steps, 1), full.float())  # decode_step returns fp32
        state, steps = model.start_decoding(src), []
        for t in range(tgt.shape[1]):
            if t == 3:
                state = reorder(state, swap)
            log_probs, state = model.decode_step(tgt[swap if t >= 3 else slice(None), t:t + 1], state)
            steps.append(log_probs)
        torch.testing.assert_close(torch.stack(steps[3:], 1), full[swap, 3:].float())
        changed = tgt.clone()
        changed[:, 4:] = torch.randint(4, 30, (2, 3))
        torch.testing.assert_close(torch.log_softmax(model(src, changed), dim=-1)[:, :4], full[:, :4])


def test_every_pre_block_form_is_built_where_it_says():
    for block in PRE_BLOCK_CONFIGS:
        model = _model("attention", decoder=False, pre_blocks=[block])
        config = PRE_BLOCKS.parse(block)
        assert [len(layer.pre_blocks) for layer in model.encoder.layers] == [int(config.applies_to(i)) for i in (0, 1)]
    assert [len(layer.pre_blocks) for layer in _model("attention", decoder=False, pre_blocks=[
        PRE_BLOCK_CONFIGS[1]]).encoder.layers] == [0, 1]


@pytest.mark.parametrize("mixer", MIXER_NAMES)
def test_a_mixer_fills_only_the_layers_it_selects(mixer):
    from sanlab.attention.core import Attention

    model = _model({"type": mixer, "layers": [1]}, decoder=False)
    lower, upper = model.encoder.layers
    assert isinstance(lower.mixer, Attention) and lower.ffn is not None  # plain attention + its own FFN
    if mixer != "attention":
        assert not isinstance(upper.mixer, Attention)


# every mixer with a choice of execution algorithm (fast band matrix vs memory-light unfold)
ALGORITHM_MIXERS = [name for name in MIXER_NAMES if "algorithm" in MIXERS.entry(name).config.model_fields]


@pytest.mark.parametrize("mixer", ALGORITHM_MIXERS)
@pytest.mark.parametrize("decoder", [False, True], ids=["encoder", "decoder"])
def test_algorithms_agree_in_values_and_gradients(mixer, decoder):
    if decoder and not _decoder_capable(mixer):
        pytest.skip(f"mixer {mixer!r} has no causal form")
    src = torch.randint(4, 30, (2, 9))
    src[1, 6:] = 0
    tgt = torch.randint(4, 30, (2, 7))
    outputs, grads = [], []
    for algorithm in ("band", "unfold"):
        model = _model({"type": mixer, "algorithm": algorithm}, decoder=decoder).train()  # same seed: same weights
        with spy_conv_algorithms() as ran:
            out = model(src, tgt)
        assert ran and set(ran) == {algorithm}, f"algorithm {algorithm}: {ran} ran"
        out.pow(2).sum().backward()
        outputs.append(out.detach())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(outputs[0], outputs[1])
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def _one_head_model(mixer: dict, *, heads: int, pre_blocks: list[dict] = ()):
    """``_model`` with ``heads`` attention heads (a mixer's own heads follow the stack's unless it sets them)."""
    mixer = dict(mixer)
    attention = {"heads": heads, "parts": mixer.pop("attention_parts", [])}
    decoder = _decoder_capable(mixer)
    enc = StackConfig(layers=2, ffn_dim=32, attention=attention, mixer=mixer, pre_blocks=list(pre_blocks))
    dec = StackConfig(layers=2, ffn_dim=32, attention=attention, mixer=mixer if decoder else {"type": "attention"})
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(dim=16, dropout=0.0, norm="post", encoder=enc, decoder=dec, max_positions=16)
    return perturb(build_seq2seq(cfg, vocab_size=30, pad_id=0).double().eval(), 0.1)


# kernels and blocks longer than any test sentence, and blocks of one token
EDGE_MIXER_FORMS = [{"type": "dynamic_conv", "kernel_size": 15}, {"type": "muse", "kernel_sizes": [15]},
                    {"type": "block", "block_len": 1, "layers": None},
                    {"type": "block", "block_len": 20, "layers": None}]


# Later examples whose one-token case reaches no line of sanlab that an earlier example of the same mixer does
# not (traced line by line on 2026-12-02): slow only; the edge forms and every pre-block stay fast
SAME_LINES_AS_AN_EARLIER_EXAMPLE = {"dynamic_conv-2", "light_conv-1", "light_conv-2", "muse-1", "muse-2", "muse_ff-1",
                                    "muse_ff-2"}


def _fast_unless_same_lines(case_id: str) -> tuple:
    return (pytest.mark.slow,) if case_id in SAME_LINES_AS_AN_EARLIER_EXAMPLE else ()


# 4 heads: slow only (half of this test's time); one head runs the same one-token sentences and the head edge too
@pytest.mark.parametrize("heads", [1, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("mixer, pre_blocks", [pytest.param(m.values[0], [], id=m.id,
                                                            marks=_fast_unless_same_lines(m.id)) for m in MIXER_FORMS]
                         + [pytest.param(m, [], id=f"{m['type']}-edge-{n}") for n, m in enumerate(EDGE_MIXER_FORMS)]
                         + [pytest.param({"type": "attention"}, [block], id=f"pre-{n}")
                            for n, block in enumerate(PRE_BLOCK_CONFIGS + [{"type": "conv", "kernel": 15}])])
def test_one_token_sentences_and_one_head(mixer, pre_blocks, heads):
    """A one-token source and target, alone and beside full ones (all but one position of their rows padding):
    finite values and gradients; each sentence's outputs equal it translated alone (Block's automatic length,
    which follows the batch's longest sentence by design, aside); decoding step by step equals the forward."""
    model = _one_head_model(mixer, heads=heads, pre_blocks=pre_blocks)
    batch_dependent = mixer["type"] == "block" and mixer.get("block_len", "auto") == "auto"
    g = torch.Generator().manual_seed(0)
    for src_lengths, tgt_lengths in (((1,), (1,)), ((1, 9), (1, 6)), ((9, 1), (6, 1))):
        def tokens(lengths):
            return torch.randint(4, 30, (len(lengths), max(lengths)), generator=g) * (
                torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None])
        src, tgt = tokens(src_lengths), tokens(tgt_lengths)
        model.train()
        model.zero_grad()
        out = model(src, tgt)
        assert torch.isfinite(out).all()
        out.pow(2).sum().backward()
        assert [n for n, p in model.named_parameters()
                if p.grad is not None and not torch.isfinite(p.grad).all()] == []
        model.eval()
        with torch.no_grad():
            full = torch.log_softmax(model(src, tgt), dim=-1)
            for row, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
                if not batch_dependent:
                    alone = torch.log_softmax(model(src[row:row + 1, :s], tgt[row:row + 1, :t]), dim=-1)
                    torch.testing.assert_close(full[row, :t], alone[0], msg=lambda m: f"row {row}: {m}")
            state, steps = model.start_decoding(src), []
            for i in range(tgt.shape[1]):
                log_probs, state = model.decode_step(tgt[:, i:i + 1], state)
                steps.append(log_probs)
            real = tgt.ne(0)
            torch.testing.assert_close(torch.stack(steps, 1)[real], full[real].float())
