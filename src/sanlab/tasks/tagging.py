"""POS tagging (Dufter et al. 2020, spec C.10-C.11): vocabularies, chunked batches, loss, accuracy."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from sanlab.config import TaggingConfig
from sanlab.data.batching import LazyBatches, padded_width
from sanlab.data.conllu_io import TaggedSentence, chunk_sentences, read_conllu
from sanlab.errors import ConfigError, DataError
from sanlab.files import read_json, write_json
from sanlab.evaluation.tagging import TaggingScores, tagging_accuracy, word_tags
from sanlab.models.builders import build_tagger
from sanlab.models.tagger import CharWords, Tagger
from sanlab.tasks.base import task_for
from sanlab.training.device import Precision, evaluation_mode, model_device, to_device
from sanlab.training.checkpoint import CheckpointManager
from sanlab.training.layout import RunLayout
from sanlab.training.logging import RunLogger

PAD, UNK = 0, 1          # word and character ids
UNKNOWN_TAG = "<unk-tag>"  # a dev/test tag never seen in training (always an error)
VOCAB_FILE = RunLayout.tagger_vocab.name  # the name of a run's vocabulary (training/layout.py)


@dataclass
class TaggingVocab:
    """Index 0 = PAD and 1 = OOV for words and characters; tags from the training data."""

    words: list[str]
    chars: list[str]
    tags: list[str]

    def __post_init__(self):
        # data words only: a text holding the word "<pad>" must not read as padding (id 0, masked out)
        self.word_id = {w: i for i, w in enumerate(self.words) if i > UNK}
        self.char_id = {c: i for i, c in enumerate(self.chars)}
        self.tag_id = {t: i for i, t in enumerate(self.tags)}

    def in_vocab(self, word: str) -> bool:
        return word in self.word_id

    @staticmethod
    def build(train: list[TaggedSentence], counted: list[TaggedSentence], *, fraction: float,
              max_size: int | None) -> "TaggingVocab":
        """Words: the most frequent share (or ``max_size``) of the types in ``counted``; chars and tags: train."""
        counts = Counter(w for s in counted for w in s.words)
        size = max_size if max_size is not None else int(len(counts) * fraction)
        words = ["<pad>", "<oov>"] + [w for w, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))[:size]]
        chars = ["<pad>", "<unk>"] + sorted({c for s in train for w in s.words for c in w})
        tags = sorted({t for s in train for t in s.tags}) + [UNKNOWN_TAG]
        return TaggingVocab(words, chars, tags)

    def save(self, path: Path) -> None:
        write_json(path, {"words": self.words, "chars": self.chars, "tags": self.tags}, indent=None)

    def digest(self) -> str:
        """What a tagger trained with this vocabulary is tied to (its embedding rows and tag ids)."""
        text = json.dumps([self.words, self.chars, self.tags], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @staticmethod
    def load(path: Path) -> "TaggingVocab":
        data = read_json(path, remedy="restore it, or delete it and rerun the run's `sanlab train` command, which "
                                      "builds it again from the training data")
        if data is None or not {"words", "chars", "tags"} <= data.keys():
            raise ConfigError(f"{path}: " + ("missing" if data is None else "not a tagging vocabulary (words, chars, "
                                             "tags)") + "; a run directory keeps it beside config.yaml")
        # (a damaged list would otherwise fail deep in building the model, or a number would never match a word)
        for key, least in (("words", 2), ("chars", 2), ("tags", 1)):  # words and chars start with <pad>, <oov>/<unk>
            items = data[key]
            if not isinstance(items, list) or len(items) < least or not all(isinstance(i, str) for i in items):
                raise ConfigError(f"{path}: not a tagging vocabulary: {key} must be a list of at least {least} "
                                  f"strings, found {json.dumps(items, ensure_ascii=False)[:60]}; restore it, or delete "
                                  "it and rerun the run's `sanlab train` command, which builds it again")
        return TaggingVocab(data["words"], data["chars"], data["tags"])


@dataclass(frozen=True)
class TagBatch:
    words: Tensor   # [b, t] word ids, 0 = pad
    chars: Tensor   # [b, t, c] char ids
    tags: Tensor    # [b, t] tag ids, -100 at padding
    tokens: int
    char_words: CharWords | None = None  # the distinct words of ``chars``, found on the host (models.tagger)

    def describe(self) -> str:
        return f"{self.words.shape[0]} sentences padded to {self.words.shape[1]} words, {self.tokens:,} tokens"


@dataclass(frozen=True)
class PendingTagBatch:
    """A training batch not encoded yet: its chunks and its words (counted from the chunks), so that an update is
    normalised by every process's tokens while each process encodes only the batches it trains on."""
    indices: tuple[int, ...]
    tokens: int

    def describe(self) -> str:
        return f"{len(self.indices)} chunks, {self.tokens:,} tokens"


PAD_WORD = "<PAD>"  # how the reference spells a padding word to its character CNN (spec C.10)


def encode_batch(vocab: TaggingVocab, sents: list[TaggedSentence], *, max_chars: int,
                 pad_to: int | None = None, multiple: int = 1, max_len: int | None = None) -> TagBatch:
    """Word, character and tag ids of chunks, padded to the longest chunk (rounded up to ``multiple``, but never
    past ``max_len``, the positions the model has: chunks are at most that long), or to ``pad_to``
    (``Tagger.pad_to``: the reference's fixed length t, whose padding words are spelled "<PAD>" to the character
    CNN)."""
    longest = max(len(s.words) for s in sents)
    if pad_to is not None and longest > pad_to:
        raise ValueError(f"a chunk of {longest} words is longer than the {pad_to} it must be padded to")
    t = pad_to or padded_width(longest, multiple, max_len)  # rounding up never pads past the model's positions
    words = torch.zeros(len(sents), t, dtype=torch.long)
    chars = torch.zeros(len(sents), t, max_chars, dtype=torch.long)
    if pad_to is not None:
        chars[:, :, :len(PAD_WORD[:max_chars])] = torch.tensor(char_ids(vocab, PAD_WORD[:max_chars]))
    tags = torch.full((len(sents), t), -100, dtype=torch.long)
    unknown = vocab.tag_id[UNKNOWN_TAG]
    for b, s in enumerate(sents):
        for i, (w, tag) in enumerate(zip(s.words, s.tags)):
            words[b, i] = vocab.word_id.get(w, UNK)
            chars[b, i] = 0
            chars[b, i, :len(w[:max_chars])] = torch.tensor(char_ids(vocab, w[:max_chars]))
            tags[b, i] = vocab.tag_id.get(tag, unknown)
    return TagBatch(words, chars, tags, tokens=int(sum(len(s.words) for s in sents)), char_words=CharWords.of(chars))


def char_ids(vocab: TaggingVocab, word: str) -> list[int]:
    return [vocab.char_id.get(c, UNK) for c in word]


class TaggingTask:
    """Implements ``training.loop.TrainTask`` for the tagger; early stopping on dev accuracy (or, by
    ``train.best_metric``, dev loss)."""

    def __init__(self, config: TaggingConfig, run_dir: Path, log: RunLogger, *, main: bool = True):
        """``main=False``: a distributed run's other processes, which read the vocabulary the main process wrote
        into ``run_dir`` and write none (``shared_vocab``)."""
        self.config, self.log = config, log
        self.metric, self.higher_is_better = task_for(config).best_metric(config)
        d, t = config.data, config.model.max_len
        train = read_conllu(d.train, column=d.column)
        dev = read_conllu(d.dev, column=d.column)
        test = read_conllu(d.test, column=d.column) if d.test else []
        layout = RunLayout(run_dir)
        vocab_path = layout.tagger_vocab
        # a resume keeps the vocabulary its checkpoints were trained with; a run with none yet (killed before its
        # first) starts again from step 0, so it builds it again from the data as it is now (it may have changed)
        if not main:
            self.vocab = shared_vocab(run_dir)
        elif vocab_path.exists() and CheckpointManager.has_checkpoints(run_dir):
            self.vocab = TaggingVocab.load(vocab_path)
        else:
            self.vocab = build_vocab(config, train=train, dev=dev, test=test)
            self.vocab.save(vocab_path)
        self.vocabulary = self.vocab.digest()  # in every checkpoint's meta.json (checkpoint.check_vocabulary)
        self.train_word_tags = word_tags([list(zip(s.words, s.tags)) for s in train])
        self.train, self.dev = chunk_sentences(train, t), chunk_sentences(dev, t)
        log.info(f"tagging: {len(train)} train sentences ({len(self.train)} chunks of <= {t}), "
                 f"{len(self.vocab.words)} words, {len(self.vocab.chars)} chars, {len(self.vocab.tags)} tags")
        torch.manual_seed(config.train.seed)
        self.model = build_tagger(config.model, vocab_size=len(self.vocab.words), num_chars=len(self.vocab.chars),
                                  num_tags=len(self.vocab.tags))

    def epoch_batches(self, epoch: int) -> LazyBatches:
        order = list(range(len(self.train)))
        random.Random(self.config.train.seed * 1_000_003 + epoch).shuffle(order)
        size = self.config.train.batch_size
        return LazyBatches([order[k:k + size] for k in range(0, len(order), size)],
                           lambda idx: PendingTagBatch(tuple(idx), sum(len(self.train[i].words) for i in idx)))

    def read(self, batch: PendingTagBatch) -> TagBatch:
        """The batch's chunks, encoded."""
        return encode_batch(self.vocab, [self.train[i] for i in batch.indices],
                            max_chars=self.config.model.max_word_chars, pad_to=self.model.pad_to,
                            multiple=self.config.train.length_multiple, max_len=self.config.model.max_len)

    def batch_tokens(self, batch: TagBatch | PendingTagBatch) -> int:
        return batch.tokens

    def loss(self, batch: TagBatch | PendingTagBatch, *, model: torch.nn.Module | None = None,
             label_smoothing: float | None = None) -> Tensor:
        if isinstance(batch, PendingTagBatch):
            batch = self.read(batch)
        model = self.model if model is None else model
        batch = to_device(batch, model_device(model))  # validation's batches are built on the CPU
        logits = model(batch.words, batch.chars, char_words=batch.char_words)  # [b, t, tags]
        ls = self.config.train.label_smoothing if label_smoothing is None else label_smoothing
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.tags.flatten(), ignore_index=-100,
                               label_smoothing=ls, reduction="sum")

    def validate(self) -> dict[str, float]:
        scores = evaluate_tagger(self.model, self.vocab, self.dev, self.train_word_tags,
                                 max_chars=self.config.model.max_word_chars)
        subsets = {"oov": scores.oov, "ambiguous": scores.ambiguous}  # None when the dev set has no such word
        return {"loss": self.dev_loss(), "accuracy": scores.all,
                **{name: value for name, value in subsets.items() if value is not None}}

    @torch.no_grad()
    def dev_loss(self, batch_size: int = 64) -> float:
        """Negative log-likelihood per dev word (no label smoothing, like translation's validation loss)."""
        self.model.eval()
        # summed on the device in float64 (the same sum as Python floats) and read once, not once per batch
        total, tokens = torch.zeros((), dtype=torch.float64, device=model_device(self.model)), 0
        for k in range(0, len(self.dev), batch_size):
            batch = encode_batch(self.vocab, self.dev[k:k + batch_size], max_chars=self.config.model.max_word_chars,
                                 pad_to=self.model.pad_to)
            total += self.loss(batch, label_smoothing=0.0).double()
            tokens += batch.tokens
        return float(total) / max(tokens, 1)


def predict_tags(model: Tagger, vocab: TaggingVocab, sents: list[TaggedSentence], *, max_chars: int,
                 batch_size: int = 64, precision: Precision | None = None) -> list[list[str]]:
    """The most likely tag of each word, never <unk-tag> (not a tag: a training target only for a training file
    that changed under a resumed run; written into CoNLL-U it would not be UD); the forward under
    ``precision``'s autocast (default fp32). Where padding is masked, sentences of similar length share a batch
    (sorted by length, as ``translate`` does: less padding to compute); without the mask every batch is padded to
    the model's length anyway, and the given order is kept. The model tags in eval mode and is left in the mode
    it was in."""
    with evaluation_mode(model), torch.no_grad():
        return _predict(model, vocab, sents, max_chars=max_chars, batch_size=batch_size, precision=precision)


def _predict(model: Tagger, vocab: TaggingVocab, sents: list[TaggedSentence], *, max_chars: int, batch_size: int,
             precision: Precision | None) -> list[list[str]]:
    known = len(vocab.tags) - 1 if vocab.tags[-1] == UNKNOWN_TAG else len(vocab.tags)
    precision = precision or Precision("fp32", model_device(model))
    order = sorted(range(len(sents)), key=lambda k: len(sents[k].words)) if model.pad_to is None else range(len(sents))
    out: list[list[str]] = [[] for _ in sents]
    for k in range(0, len(sents), batch_size):
        indices = order[k:k + batch_size]
        group = [sents[i] for i in indices]
        batch = to_device(encode_batch(vocab, group, max_chars=max_chars, pad_to=model.pad_to), model_device(model))
        with precision.autocast():
            logits = model(batch.words, batch.chars, char_words=batch.char_words)  # [b, t, tags]
        pred = logits[..., :known].float().argmax(-1).tolist()  # [b, t], one copy to the host
        for i, row, s in zip(indices, pred, group):
            out[i] = [vocab.tags[p] for p in row[:len(s.words)]]
    return out


def tag_sentences(model: Tagger, vocab: TaggingVocab, sents: list[TaggedSentence], *, max_len: int,
                  max_chars: int, precision: Precision | None = None) -> list[list[str]]:
    """Predicted tags per whole sentence: sentences longer than t are tagged chunk by chunk and joined."""
    chunks = [chunk_sentences([s], max_len) for s in sents]
    flat = predict_tags(model, vocab, [c for cs in chunks for c in cs], max_chars=max_chars, precision=precision)
    pred, k = [], 0
    for cs in chunks:
        pred.append([t for chunk in flat[k:k + len(cs)] for t in chunk])
        k += len(cs)
    return pred


def tag_words(model: Tagger, vocab: TaggingVocab, sentences: Sequence[Sequence[str]], *, max_len: int,
              max_chars: int, precision: Precision | None = None) -> list[list[str]]:
    """The predicted tag of every word of tokenised sentences (each a list of words; ``conllu_io.plain_words``
    splits a line as ``sanlab tag`` does), in input order: ``translate``'s counterpart for a tagger, from a
    notebook or a script. An empty sentence gets no tags; long ones are tagged in chunks (``tag_sentences``).
    ``max_len`` and ``max_chars``: the run's ``model.max_len`` and ``model.max_word_chars``."""
    sentences = [sentences] if isinstance(sentences, str) else list(sentences)  # (a generator is read once)
    if any(isinstance(words, str) for words in sentences):
        raise TypeError("tag_words() takes a list of sentences, each a list of words, and got a str (it would "
                        "be tagged character by character): split it into words first, e.g. line.split()")
    filled = [TaggedSentence(tuple(words), ("_",) * len(words)) for words in sentences if len(words)]
    tags = iter(tag_sentences(model, vocab, filled, max_len=max_len, max_chars=max_chars, precision=precision))
    return [next(tags) if len(words) else [] for words in sentences]


def build_vocab(config: TaggingConfig, *, train: list[TaggedSentence], dev: list[TaggedSentence],
                test: list[TaggedSentence]) -> TaggingVocab:
    """The vocabulary a run of ``config`` builds from these splits (deterministic: spec C.10)."""
    d = config.data
    counted = train + dev + test if d.vocab_from_all_splits else train
    return TaggingVocab.build(train, counted, fraction=d.vocab_fraction, max_size=d.vocab_max)


def shared_vocab(run_dir: Path) -> TaggingVocab:
    """The vocabulary the main process of a distributed run wrote into ``run_dir`` (built, or kept on a resume),
    read by the other processes, which build and write none: a clear error naming the file where it is not there.
    That it is the main process's file, not a stale one, is checked before (``training.shared_files``)."""
    path = RunLayout(run_dir).tagger_vocab
    if not path.is_file():
        raise DataError("no tagging vocabulary here, where the main process (rank 0) writes it when training starts "
                        "and the other processes read it: every process must see the same run directory (on several "
                        "nodes, a shared filesystem at the same path)", path=str(path))
    return TaggingVocab.load(path)


def run_vocab(config: TaggingConfig, run_dir: Path) -> TaggingVocab:
    """The run's vocabulary: its ``tagger-vocab.json``, or, where the run directory does not keep it
    (committed grid cells), built again from the config's data files as training built it."""
    path = RunLayout(run_dir).tagger_vocab
    if path.exists():
        return TaggingVocab.load(path)
    d = config.data
    return build_vocab(config, train=read_conllu(d.train, column=d.column), dev=read_conllu(d.dev, column=d.column),
                       test=read_conllu(d.test, column=d.column) if d.test else [])


def training_word_tags(config: TaggingConfig) -> dict:
    """word -> tags seen in the training data (what makes a word OOV or ambiguous, ``evaluation.tagging``)."""
    train = read_conllu(config.data.train, column=config.data.column)
    return word_tags([list(zip(s.words, s.tags)) for s in train])


def evaluate_tagger(model: Tagger, vocab: TaggingVocab, sents: list[TaggedSentence], train_word_tags, *,
                    max_chars: int) -> TaggingScores:
    pred = predict_tags(model, vocab, sents, max_chars=max_chars)
    return tagging_accuracy(gold=[list(s.tags) for s in sents], pred=pred, words=[list(s.words) for s in sents],
                            in_vocab=vocab.in_vocab, train_word_tags=train_word_tags)


def load_tagging_model(config: TaggingConfig, run_dir: Path) -> tuple[Tagger, TaggingVocab]:
    """The run's tagger (untrained weights) and vocabulary, without reading any corpus."""
    vocab = TaggingVocab.load(RunLayout(run_dir).tagger_vocab)
    model = build_tagger(config.model, vocab_size=len(vocab.words), num_chars=len(vocab.chars),
                         num_tags=len(vocab.tags))
    return model, vocab


def evaluate_tagging_splits(model: Tagger, vocab: TaggingVocab, config: TaggingConfig, *,
                            splits: list[str] | None, precision: Precision | None = None) -> dict:
    """Accuracy over all tokens and each word group (``evaluation.tagging``) and a per-tag report on dev and test."""
    from sanlab.evaluation.tagging import format_report, per_tag_report

    d = config.data
    train_word_tags = training_word_tags(config)
    files = {"dev": d.dev, **({"test": d.test} if d.test else {})}
    results = {}
    for name in splits or list(files):
        if name not in files:
            raise ConfigError(f"unknown split {name!r}; this run has: {', '.join(files)}")
        sents = read_conllu(files[name], column=d.column)
        pred = tag_sentences(model, vocab, sents, max_len=config.model.max_len, max_chars=config.model.max_word_chars,
                             precision=precision)
        gold = [list(s.tags) for s in sents]
        s = tagging_accuracy(gold=gold, pred=pred, words=[list(x.words) for x in sents], in_vocab=vocab.in_vocab,
                             train_word_tags=train_word_tags)
        results[name] = {**s.record(), "report": format_report(per_tag_report(gold, pred))}
    return results
