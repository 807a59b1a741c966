import random

import pytest

from sanlab.config import validate

WORDS = "a b c d e f g h i j k l m n o p".split()


def write_reverse_corpus(root, n=200, seed=0):
    """A toy task: the target is the reversed source. Plain files, as a user would have them."""
    rng = random.Random(seed)
    for split, size in (("train", n), ("valid", 20)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))) for _ in range(size)]
        (root / f"{split}.src").write_text("".join(s + "\n" for s in src))
        (root / f"{split}.tgt").write_text("".join(" ".join(reversed(s.split())) + "\n" for s in src))


@pytest.fixture
def tiny_translation(tmp_path):
    """A resolved config for a tiny Transformer on the reverse corpus (dropout on: RNG matters)."""
    write_reverse_corpus(tmp_path)

    def make(**train):
        raw = {
            "task": "translation",
            "data": {"train": {"src": str(tmp_path / "train.src"), "tgt": str(tmp_path / "train.tgt")},
                     "valid": {"src": str(tmp_path / "valid.src"), "tgt": str(tmp_path / "valid.tgt")},
                     "subword": {"vocab_size": 40}},
            "model": {"dim": 16, "dropout": 0.2, "encoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}},
                      "decoder": {"layers": 1, "ffn_dim": 32, "attention": {"heads": 2}}},
            "train": {"seed": 3, "max_tokens": 200, "warmup_steps": 4, "valid_every": 3, "progress": False,
                      "keep_last": 10, "keep_best": 10, **train},
            "decode": {"beam": 2, "max_len_b": 3},
        }
        return validate(raw, source="test")

    return make
