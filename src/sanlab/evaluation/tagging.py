"""POS-tagging metrics: All / OOV / Ambiguous accuracy (spec C.11) and a per-tag report.

Inputs are plain strings, one list per sentence (or chunk), **without padding**: strip PAD
positions before calling, since spec C.11 counts non-PAD tokens only.

The three accuracies of C.11:

* **All** — every token.
* **OOV** — tokens whose word is *outside the model's vocabulary* (maps to the OOV index).
  This is not "unseen in training": the vocabulary is cut by frequency (and, in the reproduce
  profile, counted on all splits), so pass the vocabulary itself (a set, or a predicate such as
  ``lambda w: vocab.index(w) != OOV``), never the training words.
* **Ambiguous** — in-vocabulary tokens whose word type occurs with more than one distinct tag
  in the *training* data. OOV tokens are excluded, and an in-vocabulary word never seen in
  training has no training tags, so it is not ambiguous. Word types are compared exactly
  (case-sensitive), as the vocabulary lookup of C.10 is.

Accuracies are percentages. A subset with no token (e.g. a corpus without OOV words) has
accuracy ``None`` rather than NaN or 0, so a table cannot print a made-up number for it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

Sentences = Sequence[Sequence[str]]


def _check_aligned(name_a: str, a: Sentences, name_b: str, b: Sentences) -> None:
    """Same number of sentences and the same length per sentence; errors name the sentence."""
    if len(a) != len(b):
        raise ValueError(f"{name_a} has {len(a)} sentences but {name_b} has {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if len(x) != len(y):
            raise ValueError(f"sentence {i}: {name_a} has {len(x)} tokens but {name_b} has {len(y)}")


def word_tags(train_sentences: Iterable[Sequence[tuple[str, str]]]) -> dict[str, frozenset[str]]:
    """Word type -> the distinct tags it carries in the training data ((word, tag) pairs)."""
    tags: defaultdict[str, set[str]] = defaultdict(set)
    for sentence in train_sentences:
        for word, tag in sentence:
            tags[word].add(tag)
    return {word: frozenset(ts) for word, ts in tags.items()}


def ambiguous_words(train_sentences: Iterable[Sequence[tuple[str, str]]]) -> dict[str, frozenset[str]]:
    """Only the word types seen with more than one tag in training, with their tags.

    Either this or ``word_tags`` can be passed as ``train_word_tags``: both give the same
    Ambiguous set; this one is smaller to keep around.
    """
    return {word: ts for word, ts in word_tags(train_sentences).items() if len(ts) > 1}


def _membership(in_vocab: Callable[[str], bool] | set[str] | frozenset[str]) -> Callable[[str], bool]:
    if isinstance(in_vocab, (set, frozenset)):
        return in_vocab.__contains__
    return in_vocab


def token_subsets(
    words: Sentences,
    *,
    in_vocab: Callable[[str], bool] | set[str] | frozenset[str],
    train_word_tags: Mapping[str, Iterable[str]],
) -> tuple[list[list[bool]], list[list[bool]]]:
    """Per-token OOV and Ambiguous flags (C.11), e.g. to bootstrap a subset's accuracy."""
    known = _membership(in_vocab)
    oov: list[list[bool]] = []
    ambiguous: list[list[bool]] = []
    for sentence in words:
        is_known = [bool(known(w)) for w in sentence]
        oov.append([not k for k in is_known])
        ambiguous.append([k and len(set(train_word_tags.get(w, ()))) > 1 for w, k in zip(sentence, is_known)])
    return oov, ambiguous


def correctness(*, gold: Sentences, pred: Sentences) -> list[list[bool]]:
    """Per-token ``pred == gold`` flags, the input of the sentence-level bootstrap."""
    _check_aligned("gold", gold, "pred", pred)
    return [[g == p for g, p in zip(gs, ps)] for gs, ps in zip(gold, pred)]


@dataclass(frozen=True)
class TaggingScores:
    """All / OOV / Ambiguous accuracy in % (None for an empty subset) and subset sizes."""

    all: float | None
    oov: float | None
    ambiguous: float | None
    n_all: int
    n_oov: int
    n_ambiguous: int


def _accuracy(correct: int, total: int) -> float | None:
    return 100.0 * correct / total if total else None


def tagging_accuracy(
    *,
    gold: Sentences,
    pred: Sentences,
    words: Sentences,
    in_vocab: Callable[[str], bool] | set[str] | frozenset[str],
    train_word_tags: Mapping[str, Iterable[str]],
) -> TaggingScores:
    """Token accuracy over all tokens, OOV tokens and ambiguous tokens (spec C.11)."""
    _check_aligned("gold", gold, "pred", pred)
    _check_aligned("gold", gold, "words", words)
    flags = correctness(gold=gold, pred=pred)
    oov, ambiguous = token_subsets(words, in_vocab=in_vocab, train_word_tags=train_word_tags)
    tally: Counter[str] = Counter()
    for ok_s, oov_s, amb_s in zip(flags, oov, ambiguous):
        for ok, is_oov, is_amb in zip(ok_s, oov_s, amb_s):
            tally["n_all"] += 1
            tally["c_all"] += ok
            tally["n_oov"] += is_oov
            tally["c_oov"] += ok and is_oov
            tally["n_amb"] += is_amb
            tally["c_amb"] += ok and is_amb
    return TaggingScores(
        all=_accuracy(tally["c_all"], tally["n_all"]),
        oov=_accuracy(tally["c_oov"], tally["n_oov"]),
        ambiguous=_accuracy(tally["c_amb"], tally["n_amb"]),
        n_all=tally["n_all"],
        n_oov=tally["n_oov"],
        n_ambiguous=tally["n_amb"],
    )


@dataclass(frozen=True)
class TagRow:
    """One tag's support (gold count) and precision / recall / F1 in %.

    An undefined ratio (tag never predicted, or absent from gold) is 0.0, as in scikit-learn's
    ``zero_division=0``, so a tag the model never outputs shows up as a 0 rather than vanishing.
    """

    tag: str
    support: int
    precision: float
    recall: float
    f1: float


def per_tag_report(gold: Sentences, pred: Sentences) -> list[TagRow]:
    """Per-tag precision / recall / F1 over all tokens, one row per tag seen in gold or pred."""
    _check_aligned("gold", gold, "pred", pred)
    n_gold: Counter[str] = Counter()
    n_pred: Counter[str] = Counter()
    n_hit: Counter[str] = Counter()
    for gs, ps in zip(gold, pred):
        for g, p in zip(gs, ps):
            n_gold[g] += 1
            n_pred[p] += 1
            n_hit[g] += g == p
    rows = []
    for tag in sorted(n_gold.keys() | n_pred.keys()):
        precision = 100.0 * n_hit[tag] / n_pred[tag] if n_pred[tag] else 0.0
        recall = 100.0 * n_hit[tag] / n_gold[tag] if n_gold[tag] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append(TagRow(tag=tag, support=n_gold[tag], precision=precision, recall=recall, f1=f1))
    return rows


def format_report(rows: Sequence[TagRow], *, digits: int = 2) -> str:
    """Fixed-width text table of ``per_tag_report`` rows, with token accuracy and macro F1 last."""
    width = max([len("tag"), len("macro F1"), *(len(r.tag) for r in rows)])
    num = 7 + digits  # room for "100." plus the decimals
    header = f"{'tag':<{width}}  {'support':>8}  {'prec':>{num}}  {'recall':>{num}}  {'f1':>{num}}"
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.tag:<{width}}  {r.support:>8d}  {r.precision:>{num}.{digits}f}  "
            f"{r.recall:>{num}.{digits}f}  {r.f1:>{num}.{digits}f}"
        )
    total = sum(r.support for r in rows)
    # Each gold token is a hit for exactly its own tag, so recall * support sums the hits.
    hits = sum(r.recall * r.support / 100.0 for r in rows)
    accuracy = 100.0 * hits / total if total else 0.0
    macro_f1 = sum(r.f1 for r in rows) / len(rows) if rows else 0.0
    lines.append("-" * len(header))
    lines.append(f"{'accuracy':<{width}}  {total:>8d}  {'':>{num}}  {'':>{num}}  {accuracy:>{num}.{digits}f}")
    lines.append(f"{'macro F1':<{width}}  {total:>8d}  {'':>{num}}  {'':>{num}}  {macro_f1:>{num}.{digits}f}")
    return "\n".join(lines)
