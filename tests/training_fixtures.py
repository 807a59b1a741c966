"""A tiny translation config on a generated reverse-the-words corpus, and a tiny tagger on a synthetic treebank
(shared by several tests)."""

import random

from safetensors.torch import load_file

from sanlab.config import validate

WORDS = "a b c d e f g h i j k l m n o p".split()


def write_reverse_corpus(root, n=200, seed=0):
    """The target is the reversed source. Plain files, as a user would have them."""
    rng = random.Random(seed)
    for split, size in (("train", n), ("valid", 20)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(size)]
        (root / f"{split}.src").write_text("".join(s + "\n" for s in src))
        (root / f"{split}.tgt").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in src))


def make_reverse_config(root, **train):
    """A resolved config for a tiny Transformer on the reverse corpus (dropout on: RNG matters)."""
    if not (root / "train.src").exists():
        write_reverse_corpus(root)
    raw = {
        "task": "translation",
        "data": {"train": {"src": str(root / "train.src"), "tgt": str(root / "train.tgt")},
                 "valid": {"src": str(root / "valid.src"), "tgt": str(root / "valid.tgt")},
                 "subword": {"vocab_size": 40}},
        "model": {"dim": 16, "dropout": 0.2, "encoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}},
                  "decoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}},
        "train": {"seed": 3, "max_tokens": 200, "warmup_steps": 4, "valid_every": 3, "progress": False,
                  "keep_last": 10, "keep_best": 10, **train},
        "decode": {"beam": 2, "max_len_b": 3},
    }
    return validate(raw, source="test")


def make_tagging_config(root, **train):
    """A resolved config for a tiny tagger on a synthetic treebank (60 training sentences) written under root."""
    from sanlab.data.synthetic import write_tagging_corpus

    data = root / "tagging-data"
    if not (data / "train.conllu").exists():
        write_tagging_corpus(data, seed=2, sizes={"train": 60, "dev": 20, "test": 20})
    return validate({"task": "tagging", "data": {"train": str(data / "train.conllu"), "dev": str(data / "dev.conllu")},
                     "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1,
                               "encoder": {"layers": 1}},
                     "train": {"progress": False, "batch_size": 8, **train}}, source="test")


def final_weights(run):
    """The weights of the newest checkpoint of a run directory."""
    latest = sorted((run / "checkpoints").glob("step-*"))[-1]
    return load_file(str(latest / "model.safetensors"))


def killed_at_its_first_update(config, run, monkeypatch):
    """Start ``config``'s run in ``run`` and kill it at its first update: its vocabularies are written, no
    checkpoint is (a rerun starts again from step 0)."""
    import pytest

    from sanlab.runs import train_run
    from sanlab.training import loop

    def killed(self, group):
        raise KeyboardInterrupt("killed")

    with monkeypatch.context() as m:
        m.setattr(loop.Trainer, "update", killed)
        with pytest.raises(KeyboardInterrupt):
            train_run(config, run, quiet=True)
    assert not any((run / "checkpoints").glob("step-*"))


def train_processes(tmp_path, make, run, *, nproc, **train):
    """``sanlab train --nproc N`` on ``make(**train)``'s config into ``tmp_path / run``; its final weights."""
    from sanlab.cli import main
    from sanlab.config import dump_config

    config = tmp_path / f"{run}.yaml"
    config.write_text(dump_config(make(**train)))
    assert main(["train", str(config), "--run", str(tmp_path / run), "--nproc", str(nproc), "--quiet"]) == 0
    return final_weights(tmp_path / run)


def no_model_dropout(make):
    """``make`` with the model's dropout off (the processes of a distributed run draw different masks by design)."""
    def made(**train):
        config = make(**train)
        return config.model_copy(update={"model": config.model.model_copy(update={"dropout": 0.0})})
    return made
