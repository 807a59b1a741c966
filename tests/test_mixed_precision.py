"""Mixed precision: every attention part, mixer and pre-block, and whole models, under autocast against their own fp32
forward and backward (``amp_reference``: outputs, input and weight gradients within a few units of roundoff).

    parts     every example of every registered part in a tiny ``Attention``, encoder and decoder sides; the parts
              that compute with positions over a sentence of 264 tokens (bf16 holds whole numbers up to 256)
    layers    every example of every mixer in a 2-layer encoder stack and (where it has a causal form) decoder stack,
              every pre-block example in front of the encoder's attention
    models    Seq2Seq (vanilla, MUSE, DynamicConv, Block with the conv pre-block, capsule and Gaussian parts) and the
              tagger, token ids to logits

On the CPU in bf16 (what ``train.precision: bf16`` runs there); the same on CUDA in bf16 and fp16, marked ``gpu``
and skipped without a device (``pytest -m gpu``, ``make gpu-check``). Dropout off (``eval()``), relu smooth
(``amp_reference.smooth_relu``: its kink flips gradients under rounding, whatever the precision path does).
"""

import pytest
import torch

from amp_reference import assert_matches_fp32, autocast_runs, smooth_relu
from decoder_forms import DECODER_UNSAFE, ENCODER_ONLY_MIXERS
from sanlab.attention import Attention, Positions
from sanlab.attention.registry import PARTS
from sanlab.config import Seq2SeqConfig, StackConfig, TaggerConfig
from sanlab.layers.mixers import MIXERS
from sanlab.layers.pre_blocks import PRE_BLOCKS
from sanlab.models.builders import build_decoder, build_encoder, build_seq2seq, build_tagger
from sanlab.registry import BuildContext
from tests_helpers import perturb

DIM, HEADS, LENGTHS, MAX_LEN = 16, 4, (9, 6, 3), 16
# 0.1: off the initial values (gates, temperatures and biases that start neutral then matter), with the scores
# still moderate. At the contracts' 0.3 some softmaxes are sharp enough that small bias gradients, differences of
# much larger terms, move by ~30 u when the fp32 weights alone move by u/2: conditioning, not precision.
PERTURB = 0.1


def _device_cases():
    cases = [pytest.param("cpu", torch.bfloat16, id="cpu-bf16")]
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        cases.append(pytest.param("cuda", dtype, id=f"cuda-{name}", marks=[
            pytest.mark.gpu, pytest.mark.skipif(not autocast_runs("cuda", dtype),
                                                reason=f"needs a CUDA device with {name} (torch sees none)")]))
    return cases


DEVICES = _device_cases()


@pytest.fixture(autouse=True)
def _smooth_relu():
    with smooth_relu():
        yield


def _inputs(device: str, length: int = max(LENGTHS)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(len(LENGTHS), length, DIM, generator=g)  # [b, i, dim]
    valid = torch.arange(length)[None, :] < torch.tensor(LENGTHS)[:, None]  # [b, i]
    return x.to(device), valid.to(device)


def _tokens(device: str, shape: tuple[int, int], pad_from: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 30, shape, generator=g)
    tokens[-1, pad_from:] = 0  # a padded row
    return tokens.to(device)


# ----------------------------------------------------------------------------- parts
PART_CASES = [pytest.param(cfg, side, id=f"{name}-{n}-{side}")
              for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())
              for side in ("encoder", "decoder") if not (side == "decoder" and name in DECODER_UNSAFE)]


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("cfg, side", PART_CASES)
def test_attention_parts_under_autocast_match_fp32(cfg, side, device, dtype):
    torch.manual_seed(0)
    layer = cfg.layers[0] if cfg.layers else 0
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=MAX_LEN)
    attention = perturb(Attention(dim=DIM, heads=HEADS, parts=[PARTS.build(cfg, ctx)]), PERTURB).to(device).eval()
    x, valid = _inputs(device)
    positions = Positions.self_attention(valid, length=x.shape[1], causal=side == "decoder")
    assert_matches_fp32(attention, (x,), forward=lambda m, x: m(x, positions=positions).output,
                        device_type=device, dtype=dtype)


# parts that compute with positions as numbers: past 256 tokens bf16 cannot hold them (257 reads as 256), so these
# must keep them in fp32. One sentence of 264 tokens, the default of each (the Gaussian widths D = 10: a width of 2
# notices how far bf16's rounding of the query projection, the predictors' input, moves a centre: docs/variants.md,
# "Choices shared by the three Gaussian parts").
LONG_PARTS = ["abs_position", "local_hard", "local_soft", "neighbor", "rel_pos", "rel_position"]


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("name", LONG_PARTS)
def test_parts_over_positions_past_256_under_autocast_match_fp32(name, device, dtype):
    cfg, length = PARTS.entry(name).config(), 264
    torch.manual_seed(0)
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=2, side="encoder", max_len=length)
    attention = perturb(Attention(dim=DIM, heads=HEADS, parts=[PARTS.build(cfg, ctx)]), PERTURB).to(device).eval()
    x = torch.randn(1, length, DIM, generator=torch.Generator().manual_seed(1)).to(device)
    positions = Positions.self_attention(None, length=length, device=device)
    assert_matches_fp32(attention, (x,), forward=lambda m, x: m(x, positions=positions).output,
                        device_type=device, dtype=dtype)


@pytest.mark.parametrize("device, dtype", DEVICES)
def test_rel_pos_relation_tables_under_autocast_match_fp32(device, dtype, monkeypatch):
    """The CPU runs Rel_Pos's distance buckets; CUDA its relation tables, forced here on every device: looked up
    in bf16, the lookup's backward summed a table row's i * j gradients in bf16 (0.65 of the norm off)."""
    from sanlab.attention.parts import rel_pos

    monkeypatch.setattr(rel_pos, "relation_tables_pay", lambda **sizes: True)
    test_parts_over_positions_past_256_under_autocast_match_fp32("rel_pos", device, dtype)


# ----------------------------------------------------------------------------- layers
def _stack(mixer: dict | None = None, pre_blocks: list[dict] = ()) -> StackConfig:
    return StackConfig(layers=2, ffn_dim=2 * DIM, attention={"heads": HEADS}, mixer=mixer or {"type": "attention"},
                       pre_blocks=list(pre_blocks))


def _check_encoder(stack: StackConfig, device: str, dtype: torch.dtype, norm: str = "pre") -> None:
    torch.manual_seed(0)
    encoder = perturb(build_encoder(stack, dim=DIM, norm=norm, dropout=0.0, max_len=MAX_LEN), PERTURB)
    x, valid = _inputs(device)
    positions = Positions.self_attention(valid, length=x.shape[1])
    assert_matches_fp32(encoder.to(device).eval(), (x,), forward=lambda m, x: m(x, positions=positions),
                        device_type=device, dtype=dtype)


MIXER_CASES = [pytest.param({**cfg.model_dump(), "layers": None}, id=f"{name}-{n}")
               for name in MIXERS.names() for n, cfg in enumerate(MIXERS.entry(name).config.examples())]


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("mixer", MIXER_CASES)
def test_mixers_in_an_encoder_stack_under_autocast_match_fp32(mixer, device, dtype):
    _check_encoder(_stack(mixer), device, dtype)




@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("mixer", [case for case in MIXER_CASES if case.values[0]["type"] not in ENCODER_ONLY_MIXERS])
def test_mixers_in_a_decoder_stack_under_autocast_match_fp32(mixer, device, dtype):
    torch.manual_seed(0)
    decoder = perturb(build_decoder(_stack(mixer), dim=DIM, norm="post", dropout=0.0, max_len=MAX_LEN), PERTURB)
    x, _ = _inputs(device, length=7)
    memory, memory_valid = _inputs(device)
    positions = Positions.self_attention(None, length=x.shape[1], causal=True, device=device)
    cross = Positions.cross_attention(positions, memory_valid, memory_length=memory.shape[1])
    # the memory is an input too: its gradient is what the encoder receives
    assert_matches_fp32(decoder.to(device).eval(), (x, memory),
                        forward=lambda m, x, memory: m(x, memory=memory, positions=positions,
                                                       cross_positions=cross)[0],
                        device_type=device, dtype=dtype)


PRE_BLOCK_CASES = [pytest.param(cfg.model_dump(), id=f"{name}-{n}")
                   for name in PRE_BLOCKS.names() for n, cfg in enumerate(PRE_BLOCKS.entry(name).config.examples())]


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("block", PRE_BLOCK_CASES)
def test_pre_blocks_under_autocast_match_fp32(block, norm, device, dtype):
    _check_encoder(_stack(pre_blocks=[block]), device, dtype, norm=norm)


# ----------------------------------------------------------------------------- models
# each with the norm placement of its recipe (vanilla with both)
MODELS = {
    "vanilla-pre": ("pre", {}, {}),
    "vanilla-post": ("post", {}, {}),
    "muse": ("post", {"mixer": {"type": "muse"}}, {"mixer": {"type": "muse"}}),
    "dynamic_conv": ("post", {"mixer": {"type": "dynamic_conv"}}, {"mixer": {"type": "light_conv", "kernel_size": 4}}),
    "block+conv": ("pre", {"mixer": {"type": "block"}, "pre_blocks": [{"type": "conv", "kernel": 3}]}, {}),
    "capsule+gaussian": ("pre", {"attention": {"heads": HEADS, "parts": [{"type": "capsule"}]}},
                         {"attention": {"heads": HEADS, "parts": [{"type": "local_soft"}]},
                          "cross_attention": {"heads": HEADS, "parts": [{"type": "local_hard"}]}}),
}


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("model", MODELS)
def test_seq2seq_under_autocast_matches_fp32(model, device, dtype):
    norm, encoder, decoder = MODELS[model]
    stacks = [StackConfig(**{"layers": 2, "ffn_dim": 2 * DIM, "attention": {"heads": HEADS}, **side})
              for side in (encoder, decoder)]
    config = Seq2SeqConfig(dim=DIM, dropout=0.0, norm=norm, encoder=stacks[0], decoder=stacks[1],
                           max_positions=MAX_LEN)
    torch.manual_seed(0)
    seq2seq = perturb(build_seq2seq(config, vocab_size=30, pad_id=0), PERTURB).to(device).eval()
    src, tgt = _tokens(device, (3, 9), 5, seed=1), _tokens(device, (3, 7), 4, seed=2)
    assert_matches_fp32(seq2seq, (src, tgt), device_type=device, dtype=dtype)


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("position, parts", [("add", []), ("concat", [{"type": "rel_position"}]),
                                             ("none", [{"type": "abs_position"}, {"type": "temperature"}])])
def test_tagger_under_autocast_matches_fp32(position, parts, device, dtype):
    config = TaggerConfig(word_dim=8, char_dim=4, char_filters=4, char_width=3, char_layers=2, position=position,
                          position_dim=4, max_len=10, dropout=0.0,
                          encoder=dict(layers=2, ffn_dim=16, attention=dict(heads=2, parts=parts)))
    torch.manual_seed(0)
    tagger = perturb(build_tagger(config, vocab_size=30, num_chars=10, num_tags=5), PERTURB).to(device).eval()
    words = _tokens(device, (4, 10), 7, seed=1)
    chars = torch.randint(1, 10, (4, 10, 5), generator=torch.Generator().manual_seed(2)).to(device)
    assert_matches_fp32(tagger, (words, chars), device_type=device, dtype=dtype)
