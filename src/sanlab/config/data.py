"""The ``data:`` section: a translation run's corpora and subword model (``TranslationDataConfig``), a tagging
run's treebank files and vocabulary (``TaggingDataConfig``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sanlab.config.fields import Positive, Strict


class SubwordConfig(Strict):
    vocab_size: int = Field(8000, ge=8)
    model_type: Literal["unigram", "bpe"] = "unigram"
    joint: bool = True
    character_coverage: float = Field(1.0, gt=0, le=1)
    # Training sentences (source + target for a joint model) above which sentencepiece trains on this many,
    # sampled, with every core; at or below it on all of them in one thread (bit-identical across runs)
    sample_sentences: int = Field(1_000_000, ge=1)


class ParallelFiles(Strict):
    src: str
    tgt: str


class WeightedFiles(ParallelFiles):
    weight: float = Field(1.0, gt=0)  # share of the sampled training pairs: weight / sum of the weights


class TranslationDataConfig(Strict):
    # one corpus, or several sampled by weight (OpenNMT-py's and Marian's `data` weights): every epoch draws as
    # many pairs as all corpora hold, each from corpus c with probability weight_c / sum of the weights
    train: ParallelFiles | Annotated[list[WeightedFiles], Field(min_length=1)]
    valid: ParallelFiles
    test: dict[str, ParallelFiles] = {}
    subword: SubwordConfig = SubwordConfig()
    max_len: Positive = 200     # subword tokens per side, longer training pairs are dropped
    max_ratio: Annotated[float, Field(ge=1)] | None = None  # longer side / shorter side
    skip_empty: bool = False     # drop train/valid pairs with an empty side instead of failing (test sets: every line)
    filter_valid: bool = False   # max_len and max_ratio drop validation pairs too (the capsule paper's WMT17 setup)

    @property
    def train_corpora(self) -> list[ParallelFiles]:
        """The training corpora, one or several (``train`` in either form)."""
        return list(self.train) if isinstance(self.train, list) else [self.train]


class TaggingDataConfig(Strict):
    train: str
    dev: str
    test: str | None = None
    column: Literal["upos", "xpos"] = "upos"
    vocab_fraction: float = Field(0.5, gt=0, le=1)  # most frequent share of word types (UD: half)
    vocab_max: Positive | None = None               # or a fixed size (PTB: 20,000)
    vocab_from_all_splits: bool = False             # the reference counts train+dev+test
