"""Training through the prepared (binarized) data equals the in-memory path it replaced: same subword
model, same batches in the same order, bit-identical parameters after some updates."""

import copy

import pytest
import torch
from sentencepiece import sentencepiece_model_pb2

from sanlab.config import validate
from sanlab.data.batching import TokenBatchSampler
from sanlab.data.parallel import length_filter, read_parallel
from sanlab.data.subword import SubwordPair, train_joint
from sanlab.data.synthetic import generate_translation
from sanlab.tasks.translation import TranslationTask, collate, encode_pairs
from sanlab.training.logging import SilentLogger


def _config(root, train_src, train_tgt, valid_src, valid_tgt, **data):
    return validate({
        "task": "translation",
        "data": {"train": {"src": str(train_src), "tgt": str(train_tgt)},
                 "valid": {"src": str(valid_src), "tgt": str(valid_tgt)}, **data},
        "model": {"dim": 16, "dropout": 0.1, "encoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}},
                  "decoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}},
        "train": {"seed": 5, "max_tokens": 300, "progress": False},
    }, source="test")


def _in_memory(config, run_dir):
    """What TranslationTask did before the cache: lists of ids, the subword model trained on all pairs."""
    d = config.data
    raw = read_parallel(d.train.src, d.train.tgt, skip_empty=d.skip_empty)
    sw = d.subword
    spm = train_joint((s for s, _ in raw), (t for _, t in raw), model_path=run_dir / "reference",
                      vocab_size=sw.vocab_size, model_type=sw.model_type, character_coverage=sw.character_coverage)
    encoded = encode_pairs(SubwordPair(spm), raw)
    train = [encoded[i] for i in length_filter(encoded, min_len=1, max_len=d.max_len, max_ratio=d.max_ratio)]
    sampler = TokenBatchSampler([(len(s) + 1, len(t) + 1) for s, t in train], max_tokens=config.train.max_tokens,
                                shuffle=True, seed=config.train.seed)
    return spm, train, sampler


def _model(path):
    """A sentencepiece model without the one field that names where it was trained (the temporary prefix,
    with a process id in it: it differed between any two runs before the cache, too)."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    proto.trainer_spec.model_prefix = ""
    return proto


def _check_same(config, run_dir, *, epochs=2, updates=4):
    task = TranslationTask(config, run_dir, SilentLogger(run_dir))
    spm, train, sampler = _in_memory(config, run_dir)
    assert _model(run_dir / "subword.model") == _model(run_dir / "reference.model")
    for epoch in range(epochs):
        pending, reference = task.epoch_batches(epoch), sampler.epoch_batches(epoch)
        assert [b.indices.tolist() for b in pending] == reference
    batches = task.epoch_batches(0)
    models = [copy.deepcopy(task.model) for _ in range(2)]
    for model, read in zip(models, (True, False)):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for k in range(updates):
            ref = collate(task.spm, [train[i] for i in sampler.epoch_batches(0)[k]])
            batch = task.read(batches[k]) if read else ref
            assert batch.tokens == batches[k].tokens == ref.tokens
            assert all(torch.equal(getattr(batch, f), getattr(ref, f)) for f in ("src", "tgt_in", "tgt_out"))
            optimizer.zero_grad()
            torch.manual_seed(k)
            task.loss(batches[k] if read else ref, model=model).backward()
            optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, b) for a, b in zip(models[0].parameters(), task.model.parameters()))


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def test_synthetic_corpus_same_as_in_memory_path(tmp_path):
    pairs = generate_translation(600, seed=1)
    pairs[17] = (pairs[17][0], " ")  # dropped by skip_empty on both paths
    for split, chunk in (("train", pairs), ("valid", pairs[:20])):
        _write(tmp_path / f"{split}.src", [s for s, _ in chunk])
        _write(tmp_path / f"{split}.tgt", [t for _, t in chunk])
    config = _config(tmp_path, *(tmp_path / f"{s}.{x}" for s in ("train", "valid") for x in ("src", "tgt")),
                     subword={"vocab_size": 120}, skip_empty=True, max_len=14, max_ratio=1.6)
    _check_same(config, tmp_path / "run")


@pytest.mark.slow
def test_multi30k_same_as_in_memory_path(tmp_path, shared_file):
    files = [shared_file(f"multi30k/{n}") for n in ("train.en.gz", "train.de.gz", "val.en.gz", "val.de.gz")]
    config = _config(tmp_path, *files, subword={"vocab_size": 8000}, max_len=100)  # the recipe's data settings
    _check_same(config, tmp_path / "run", epochs=1, updates=2)
