"""Seq2Seq invariants: cached step-by-step == teacher-forced forward; padding invariance; presets."""

import pytest
import torch

from sanlab.config import Seq2SeqConfig, StackConfig, load_config
from sanlab.models.builders import build_seq2seq, count_parameters
from sanlab.models.embeddings import LearnedPositions
from tests_helpers import perturb


def tiny(norm="pre", positions="sinusoidal", share=True):
    stack = StackConfig(layers=2, ffn_dim=48, attention={"heads": 4})
    cfg = Seq2SeqConfig(dim=32, norm=norm, positions=positions, share_embeddings=share, dropout=0.0,
                        encoder=stack, decoder=stack)
    torch.manual_seed(0)
    return build_seq2seq(cfg, vocab_size=50, pad_id=0).eval()


def _assert_cached_decoding_equals_full_forward(model):
    src = torch.randint(4, 50, (3, 9))
    src[1, 6:] = 0
    tgt = torch.randint(4, 50, (3, 7))
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt), dim=-1)  # [b, i, V]
        state = model.start_decoding(src)
        steps = []
        for t in range(tgt.shape[1]):
            log_probs, state = model.decode_step(tgt[:, t:t + 1], state)
            steps.append(log_probs)
    torch.testing.assert_close(torch.stack(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_decoding_equals_full_forward(norm, positions):
    model = tiny(norm, positions)
    _assert_cached_decoding_equals_full_forward(model)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_the_model_refuses_a_sequence_longer_than_max_positions_on_either_side(positions):
    """Sinusoidal positions exist for any position, so only the model's own check stops a sequence longer than
    model.max_positions (translate and training refuse them before); the decoding step counts the cached tokens."""
    stack = StackConfig(layers=1, ffn_dim=16, attention={"heads": 2})
    model = build_seq2seq(Seq2SeqConfig(dim=8, positions=positions, max_positions=6, encoder=stack, decoder=stack),
                          vocab_size=20, pad_id=0).eval()
    fits, too_long = torch.randint(4, 20, (2, 6)), torch.randint(4, 20, (2, 7))
    with torch.no_grad():
        assert model(fits, fits).shape == (2, 6, 20)
        with pytest.raises(ValueError, match=r"source of 7 tokens .*\(model\.max_positions = 6\)"):
            model(too_long, fits)
        with pytest.raises(ValueError, match=r"target of 7 tokens .*\(model\.max_positions = 6\)"):
            model(fits, too_long)
        with pytest.raises(ValueError, match=r"source of 7 tokens .*\(model\.max_positions = 6\)"):
            model.start_decoding(too_long)
        state = model.start_decoding(fits)
        for _ in range(6):  # positions 0..5 fit
            _, state = model.decode_step(torch.tensor([[5], [6]]), state)
        with pytest.raises(ValueError, match=r"target of 7 tokens .*\(model\.max_positions = 6\)"):
            model.decode_step(torch.tensor([[5], [6]]), state)


def test_learned_positions_refuse_a_position_past_the_table():
    """The table's own check (a tagger's table has no model check before it): the last position from the layout
    where known, else read from the tensor."""
    table = LearnedPositions(max_positions=6, dim=8)
    assert table(torch.arange(6), last=5).shape == (6, 8)
    with pytest.raises(ValueError, match="position 6 exceeds the 6 learned positions"):
        table(torch.arange(7), last=6)
    with pytest.raises(ValueError, match="position 9 exceeds"):  # without a layout: read from the tensor
        table(torch.tensor([1, 9, 2]))


def test_cached_decoding_with_parts_in_cross_attention_equals_full_forward():
    """Cross-attention parts that read the query's position (Shaw's cross relative positions, Gaussian
    localness, temperatures) get the decoder's absolute offset at every cached step; parameters are moved
    off their initial values (temperatures 1 would hide a step that skipped them)."""
    parts = [{"type": "rel_pos", "max_distance": 3, "cross": True}, {"type": "local_soft"},
             {"type": "temperature"}]
    stack = StackConfig(layers=2, ffn_dim=48, attention={"heads": 4})
    decoder = StackConfig(layers=2, ffn_dim=48, attention={"heads": 4},
                          cross_attention={"heads": 4, "parts": parts})
    cfg = Seq2SeqConfig(dim=32, dropout=0.0, encoder=stack, decoder=decoder)
    torch.manual_seed(0)
    model = build_seq2seq(cfg, vocab_size=50, pad_id=0).eval()
    cross = model.decoder.layers[0].cross_attention
    assert [type(p).__name__ for p in cross.parts] == ["RelativePositions", "LocalSoft", "LearnableTemperature"]
    perturb(model, 0.2, seed=1)
    _assert_cached_decoding_equals_full_forward(model)


def test_cross_attention_takes_every_key_it_does_not_set_from_the_stacks_attention():
    """``cross_attention: {parts: [...]}`` once silently got AttentionConfig's defaults (8 heads, dropout 0)."""
    parts = [{"type": "rel_pos", "cross": True}]
    decoder = StackConfig(layers=1, attention={"heads": 4, "dropout": 0.1, "bias": False, "plan": "sdpa"},
                          cross_attention={"parts": parts})
    cross = decoder.cross_attention
    assert (cross.heads, cross.dropout, cross.bias, [p.type for p in cross.parts]) == (4, 0.1, False, ["rel_pos"])
    assert cross.plan == "auto"  # sdpa cannot run a part that reads the scores: a plan is not inherited
    with pytest.raises(ValueError, match="attention.heads") as err:
        StackConfig(attention={"heads": 0}, cross_attention={"parts": parts})
    assert "cross_attention" not in str(err.value)  # reported once, where the user wrote it
    assert StackConfig(attention={"heads": 4}, cross_attention={"heads": 2}).cross_attention.heads == 2
    assert StackConfig(attention={"heads": 4, "parts": parts}).cross_attention is None  # built as attention, no parts
    assert StackConfig.model_validate(decoder.model_dump()) == decoder  # a resolved config.yaml reloads the same


def test_learned_positions_have_one_table_per_side_and_sinusoidal_none():
    learned = tiny("pre", "learned")
    assert learned.src_positions is not learned.tgt_positions
    names = [n for n, _ in learned.named_parameters() if "positions" in n]
    assert names == ["src_positions.table.weight", "tgt_positions.table.weight"]
    sinusoidal = tiny("pre", "sinusoidal")
    assert not [n for n, _ in sinusoidal.named_parameters() if "positions" in n]
    assert not [k for k in sinusoidal.state_dict() if "positions" in k]  # old checkpoints still load


def test_weights_saved_with_one_learned_position_table_load_into_both():
    model = tiny("pre", "learned")
    state = {k: v for k, v in model.state_dict().items() if "positions" not in k}
    state["positions.table.weight"] = torch.randn_like(model.src_positions.table.weight)
    model.load_state_dict(state)  # strict: the old key is consumed, both new ones are filled
    for table in (model.src_positions, model.tgt_positions):
        torch.testing.assert_close(table.table.weight, state["positions.table.weight"])


def test_padding_invariance():
    model = tiny()
    src = torch.randint(4, 50, (1, 6))
    tgt = torch.randint(4, 50, (1, 5))
    with torch.no_grad():
        alone = model(src, tgt)
        padded_src = torch.cat([src, torch.zeros(1, 5, dtype=torch.long)], dim=1)
        padded_tgt = torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], dim=1)
        other = torch.randint(4, 50, (1, 11)), torch.randint(4, 50, (1, 8))
        batch = model(torch.cat([padded_src, other[0]]), torch.cat([padded_tgt, other[1]]))
    torch.testing.assert_close(batch[0, :5], alone[0], atol=1e-5, rtol=1e-5)


def test_shared_and_tied_embeddings_count_once():
    shared, separate = tiny(share=True), tiny(share=False)
    assert count_parameters(separate) - count_parameters(shared) == 50 * 32
    assert shared.generator.weight is shared.tgt_embed.weight


def test_untied_output_projection_is_initialised_as_fairseqs():
    stack = StackConfig(layers=1, ffn_dim=48, attention={"heads": 4})
    cfg = Seq2SeqConfig(dim=256, tie_output=False, encoder=stack, decoder=stack)
    torch.manual_seed(0)
    weight = build_seq2seq(cfg, vocab_size=4000, pad_id=0).generator.weight  # N(0, d^-1/2), not U(+-d^-1/2)
    assert abs(weight.std().item() - 256 ** -0.5) < 0.002 and weight.abs().max() > 256 ** -0.5


def test_decoding_from_an_offset_needs_the_cache():
    model = tiny()
    memory, valid = model.encode(torch.randint(4, 50, (1, 6)))
    with pytest.raises(ValueError, match="offset 2 needs use_cache"):
        model.decode(torch.randint(4, 50, (1, 1)), memory=memory, memory_valid=valid, offset=2)


def _preset_params(tmp_path, preset, vocab):
    path = tmp_path / "c.yaml"
    path.write_text(f"base: preset:{preset}\ntask: translation\n"
                    "data: {train: {src: a, tgt: b}, valid: {src: a, tgt: b}}\n")
    cfg = load_config(path)
    with torch.device("meta"):  # counting only: no memory, no initialisation of 210M parameters
        return count_parameters(build_seq2seq(cfg.model, vocab_size=vocab, pad_id=0))


def test_presets_match_vaswani(tmp_path):
    # Vaswani et al. Table 3 reports 65M (base) and 213M (big) with a shared ~37k vocabulary.
    # Per layer: encoder 4d^2+4d (attn) + 2*d*f+f+d (FFN) + 4d (2 LN); decoder adds a second attention + LN.
    d, f, v = 512, 2048, 37000
    enc = 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d
    dec = 2 * (4 * d * d + 4 * d) + 2 * d * f + f + d + 6 * d
    expected = v * d + 6 * enc + 6 * dec
    assert _preset_params(tmp_path, "transformer_base", v) == expected
    assert round(expected / 1e6) == 63  # 65M in the paper counts its own vocabulary size
    big = _preset_params(tmp_path, "transformer_big", v)
    assert 200e6 < big < 215e6


def test_the_default_cross_attention_chooses_its_own_plan():
    """A decoder whose self-attention is pinned to the banded plan (its window parts) gets a part-less
    cross-attention on plan auto, as an explicit cross_attention does: banded would send it to the dense plan
    instead of the fused kernel."""
    parts = [{"type": "window", "size": 3}]
    decoder = StackConfig(layers=1, ffn_dim=48, attention={"heads": 4, "plan": "banded", "parts": parts})
    cfg = Seq2SeqConfig(dim=32, dropout=0.0, encoder=StackConfig(layers=1, ffn_dim=48, attention={"heads": 4}),
                        decoder=decoder)
    layer = build_seq2seq(cfg, vocab_size=50, pad_id=0).decoder.layers[0]
    assert layer.self_mixer.plan == "banded" and layer.cross_attention.plan == "auto"
    assert list(layer.cross_attention.parts) == []
