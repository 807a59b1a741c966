"""A translation cell's evaluation key keeps ``decode.batch_sentences``: which sentences share a batch can change
what a model outputs, so a cell decoded with another batch size is scored again rather than trusted."""

from pathlib import Path

import torch

from sanlab.config import Seq2SeqConfig, StackConfig, load_config
from sanlab.models.builders import build_seq2seq
from sanlab.tasks.base import task_for

ROOT = Path(__file__).resolve().parents[2]


def test_a_block_auto_encoder_outputs_depend_on_the_other_sentences_of_its_batch():
    """Block attention with ``block_len: auto`` (the multi30k grid's Block cell) takes its block length from the
    batch's longest sentence (docs/variants.md): a 6-token sentence encodes otherwise beside a 40-token one."""
    recipe = load_config(ROOT / "configs" / "multi30k-en-de-block.yaml")
    mixer = recipe.model.encoder.mixer
    assert (mixer.type, mixer.block_len) == ("block", "auto")
    torch.manual_seed(0)
    small = Seq2SeqConfig(dim=16, dropout=0.0, max_positions=64,
                          encoder=StackConfig(layers=2, ffn_dim=32, mixer=mixer.model_dump()),
                          decoder=StackConfig(layers=1, ffn_dim=32))
    model = build_seq2seq(small, vocab_size=30, pad_id=0).eval()
    g = torch.Generator().manual_seed(1)
    batch = torch.zeros(2, 40, dtype=torch.long)
    batch[0, :6], batch[1] = torch.randint(4, 30, (6,), generator=g), torch.randint(4, 30, (40,), generator=g)
    with torch.no_grad():
        alone, beside = model.encode(batch[:1, :6])[0][0], model.encode(batch)[0][0, :6]
    assert (alone - beside).abs().max() > 1e-3  # not rounding: another block length


def test_batch_sentences_is_part_of_a_translation_cells_evaluation_key():
    config = load_config(ROOT / "configs" / "multi30k-en-de-block.yaml")
    task = task_for(config)
    other = config.model_copy(update={"decode": config.decode.updated(batch_sentences=1)})
    assert task.eval_key(config)["decode"]["batch_sentences"] == config.decode.batch_sentences
    assert task.eval_key(other) != task.eval_key(config)
