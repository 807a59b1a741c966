"""The paper recipes (configs/paper/) hold the settings their papers state, or say where they differ: each value
pinned here is quoted from the paper or the released recipe it names. Loading only, no model is built."""

import re
from pathlib import Path

import pytest

from sanlab.config import Seq2SeqConfig, load_config
from sanlab.config_yaml import PRESETS, load_raw
from sanlab.tasks.base import task_for

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper"


def _attention_dropouts(model) -> set[float]:
    return {model.encoder.attention.dropout, model.decoder.attention.dropout}


def test_iwslt_transformer_is_trained_with_muse_de_en_settings():
    """MUSE 3.2: "For the DE-EN dataset, we train the model for 20K steps with a batch size of 4K. The parameters
    are updated every 4 steps. The dropout rate is set to 0.4." The recipe took the steps and the batch from that
    sentence but Wu et al.'s dropout 0.3 and attention dropout 0.1; MUSE's fairseq recipe has no attention dropout."""
    config = load_config(PAPER / "iwslt14-de-en-transformer.yaml")
    assert config.model.dropout == 0.4 and _attention_dropouts(config.model) == {0.0}
    t = config.train
    assert (t.lr, t.warmup_steps, t.max_steps, t.max_tokens, t.accum_steps) == (1e-3, 4000, 20000, 4000, 4)
    assert (config.decode.beam, config.decode.length_penalty) == (5, 1.0)


def test_iwslt_recipes_average_the_last_ten_epoch_checkpoints():
    """MUSE: "stop training 10 epochs after the epoch with the lowest valid loss and then average the last 10
    checkpoints"; both released IWSLT recipes (MUSE's and Wu et al.'s) average the last 10 epoch checkpoints. A
    checkpoint every 1,000 updates averaged half of MUSE's 20,000 updates (an epoch is about 290 of them)."""
    for name in ("transformer", "muse", "dynamicconv", "lightconv"):
        train = load_config(PAPER / f"iwslt14-de-en-{name}.yaml").train
        assert (train.valid_every, train.keep_last) == (0, 10), name


def test_iwslt_dynamicconv_is_wu_et_al_recipe_and_preset():
    """fairseq's pay_less_attention_paper README (IWSLT14 De-En, no GLU): --dropout 0.3 --attention-dropout 0.1
    --weight-dropout 0.1 --lr 0.0005 --max-tokens 4000 --max-update 50000 --clip-norm 0, beam 4, lenpen 1;
    its model is the preset dynamic_conv_iwslt, whose 38,685,184 parameters with fairseq's dictionaries are
    MUSE's "39M" (tests/layers/test_muse.py)."""
    config = load_config(PAPER / "iwslt14-de-en-dynamicconv.yaml")
    preset = Seq2SeqConfig.model_validate(load_raw(PRESETS / "dynamic_conv_iwslt.yaml")["model"])
    assert config.model == preset
    assert config.model.dropout == 0.3 and _attention_dropouts(config.model) == {0.1}
    t = config.train
    assert (t.lr, t.max_tokens, t.accum_steps, t.max_steps, t.clip_norm) == (5e-4, 4000, 1, 50000, 0.0)
    assert (config.decode.beam, config.decode.length_penalty) == (4, 1.0)
    light = load_config(PAPER / "iwslt14-de-en-lightconv.yaml").model
    assert light.dropout == 0.3 and _attention_dropouts(light) == {0.1}
    assert light.encoder.mixer.type == light.decoder.mixer.type == "light_conv"


def test_iwslt_muse_keeps_muse_own_dropouts():
    model = load_config(PAPER / "iwslt14-de-en-muse.yaml").model
    assert model.dropout == 0.4 and _attention_dropouts(model) == {0.0}
    assert model.encoder.mixer.input_dropout == 0.0 and model.encoder.mixer.weight_dropout == 0.1


@pytest.mark.parametrize("grid", ["muse-iwslt14", "capsule-wmt17", "csan-table1-wmt14"])
def test_a_grid_row_that_names_a_paper_recipe_trains_that_recipe(tmp_path, grid):
    """A comparison grid row noted as configs/paper/X.yaml trains X's model, training and decoding settings: the
    grids repeat the recipes' keys as overrides of one base, and a row could keep the base's dropout (the
    DynamicConv and LightConv rows also decoded with beam 5, not Wu et al.'s 4)."""
    from sanlab.experiments.grid import load_grid

    loaded = load_grid(PAPER.parent / "compare" / f"{grid}.yaml", runs_dir=tmp_path)
    notes = {v.name: re.match(r"configs/paper/([\w.-]+\.yaml)", v.note or "") for v in loaded.spec.variants}
    assert any(notes.values())
    for cell in loaded.cells:
        if notes[cell.variant]:
            recipe = load_config(PAPER / notes[cell.variant][1])
            for section in ("model", "train", "decode"):
                assert getattr(cell.config, section) == getattr(recipe, section), (cell.variant, section)


IWSLT = ("transformer", "muse", "dynamicconv", "lightconv")
WMT14 = ("base", "base-csan", "big", "big-csan")


def _output_lengths(config, source_lengths: list[int]) -> list[int]:
    """Tokens (EOS included) the recipe's search allows a source of each length (EOS included)."""
    import torch

    from sanlab.tasks.translation import max_output_lengths

    return max_output_lengths(torch.tensor(source_lengths), config.decode, config.model.max_positions).tolist()


def test_iwslt_recipes_decode_up_to_fairseq_generate_default_length():
    """MUSE's and Wu et al.'s `fairseq-generate` commands set neither --max-len-a nor --max-len-b, so fairseq's
    defaults hold (0 and 200 in fairseq's options.py, MUSE's fork's too: at most 200 tokens, then EOS, whatever the
    source length); sanlab's default
    (1.2 x source + 10) would cut a 10-token source's output at 22 tokens. 201 tokens fit model.max_positions."""
    for name in IWSLT:
        config = load_config(PAPER / f"iwslt14-de-en-{name}.yaml")
        assert (config.decode.max_len_a, config.decode.max_len_b) == (0.0, 200), name
        assert _output_lengths(config, [2, 11, 176]) == [201, 201, 201], name


def test_iwslt_recipes_pick_best_by_the_dev_loss_as_fairseq():
    """fairseq validates by loss alone and keeps checkpoint_best by it (--best-checkpoint-metric loss, its default;
    no --eval-bleu in MUSE's or Wu et al.'s command): `best` by the loss of the whole dev set. Greedy BLEU, logged
    beside it and picking nothing, stays bounded to the first 500 of its 7,283 sentences instead of decoding all of
    them every epoch (~70). No patience: the released commands train a fixed number of updates; MUSE's text's "10
    epochs after the lowest valid loss" is --set train.patience=10, which counts these per-epoch loss validations
    (docs/data.md)."""
    for name in IWSLT:
        config = load_config(PAPER / f"iwslt14-de-en-{name}.yaml")
        train = config.train
        assert (train.valid_every, train.valid_max_sentences, train.patience) == (0, 500, 0), name
        assert task_for(config).best_metric(config) == ("loss", False), name


def test_wmt14_recipes_decode_and_validate_as_thumt():
    """CSAN trained and decoded with THUMT: its translator's and trainer's defaults are beam_size 4,
    decode_alpha 0.6 in GNMT's form ((5 + L) / 6) ** alpha, decode_length 50 (steps over the source length:
    Vaswani et al.'s "input length + 50"), and an evaluation every eval_steps 2,000 that decodes the whole
    validation set for BLEU and keeps the best checkpoint by it (here greedily: sanlab's validation)."""
    for name in WMT14:
        config = load_config(PAPER / f"wmt14-en-de-{name}.yaml")
        d = config.decode
        assert (d.beam, d.length_penalty, d.length_penalty_style, d.max_len_a, d.max_len_b) == (
            4, 0.6, "gnmt", 1.0, 50), name
        assert _output_lengths(config, [1, 30, 251]) == [52, 81, 302], name
        assert (config.train.valid_every, config.train.valid_max_sentences) == (2000, None), name
        assert task_for(config).best_metric(config) == ("bleu", True), name  # (unset: translation's own)


def test_wmt17_capsule_recipes_decode_as_vaswani_and_pick_best_by_the_dev_loss():
    """The capsule paper (OpenNMT-py) states no decoding settings and follows Vaswani et al.'s setup: beam 4,
    alpha 0.6 in GNMT's form (OpenNMT-py's -length_penalty wu -alpha 0.6), input length + 50. OpenNMT-py validates
    by loss (as perplexity) and accuracy only: `best` by the dev loss, and greedy validation BLEU, which picks
    nothing, stays bounded to 500 sentences."""
    for name in ("base", "base-capsule"):
        config = load_config(PAPER / f"wmt17-zh-en-{name}.yaml")
        d = config.decode
        assert (d.beam, d.length_penalty, d.length_penalty_style, d.max_len_a, d.max_len_b) == (
            4, 0.6, "gnmt", 1.0, 50), name
        assert (config.train.valid_every, config.train.valid_max_sentences) == (2000, 500), name
        assert task_for(config).best_metric(config) == ("loss", False), name
