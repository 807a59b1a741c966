"""POS-tagging metrics: accuracy over all tokens and over word groups defined by the training data,
and a per-tag report.

Inputs are plain strings, one list per sentence (or chunk), **without padding**: strip PAD
positions before calling, since only real tokens count.

The groups (since 2026-11-25; docs/training.md, "Tagging accuracy"). Word types are compared
exactly (case-sensitive), as the vocabulary lookup of spec C.10 is:

* **All** — every token.
* **OOV** — tokens whose word does not occur in the *training* sentences, whatever the model's
  vocabulary holds.
* **Ambiguous** — tokens whose word occurs in training with more than one distinct tag.
* **Unambiguous** — tokens whose word occurs in training with exactly one tag.
* **OOV in vocabulary** — the OOV tokens whose word nevertheless has its own row in the model's
  word vocabulary: possible only when the vocabulary is counted on dev/test too
  (``data.vocab_from_all_splits``), and then a row whose embedding no training step updated.

OOV, Ambiguous and Unambiguous partition All, so All accuracy is their token-weighted mean; OOV in
vocabulary is a subset of OOV. Spec C.11 (the reference code) instead counts as OOV the tokens that
map to the vocabulary's OOV index (a training word cut by frequency is OOV there, a test-only word
the all-splits vocabulary kept is not) and leaves those out of Ambiguous; that makes the columns mean
different things in the two profiles, so we follow the paper's text and common tagging practice.

Accuracies are percentages. A group with no token (e.g. a corpus without OOV words) has accuracy
``None`` rather than NaN or 0, so a table cannot print a made-up number for it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

Sentences = Sequence[Sequence[str]]
# The word groups of a token, in the order of the evaluation record (``TaggingScores.record``).
GROUPS = ("oov", "oov_in_vocab", "ambiguous", "unambiguous")


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

    Not a substitute for ``word_tags`` in ``tagging_accuracy``: OOV needs every training word.
    """
    return {word: ts for word, ts in word_tags(train_sentences).items() if len(ts) > 1}


def _membership(in_vocab: Callable[[str], bool] | set[str] | frozenset[str]) -> Callable[[str], bool]:
    if isinstance(in_vocab, (set, frozenset)):
        return in_vocab.__contains__
    return in_vocab


def token_groups(
    words: Sentences,
    *,
    train_word_tags: Mapping[str, Iterable[str]],
    in_vocab: Callable[[str], bool] | set[str] | frozenset[str],
) -> dict[str, list[list[bool]]]:
    """Per-token flags of each group of ``GROUPS`` (e.g. to bootstrap a group's accuracy).

    ``train_word_tags`` must hold every training word (``word_tags``); ``in_vocab`` is the model's
    vocabulary (a set, or a predicate such as ``TaggingVocab.in_vocab``).
    """
    known = _membership(in_vocab)
    flags: dict[str, list[list[bool]]] = {g: [] for g in GROUPS}
    for sentence in words:
        n_tags = [len(set(train_word_tags.get(w, ()))) for w in sentence]
        flags["oov"].append([n == 0 for n in n_tags])
        flags["oov_in_vocab"].append([n == 0 and bool(known(w)) for w, n in zip(sentence, n_tags)])
        flags["ambiguous"].append([n > 1 for n in n_tags])
        flags["unambiguous"].append([n == 1 for n in n_tags])
    return flags


def correctness(*, gold: Sentences, pred: Sentences) -> list[list[bool]]:
    """Per-token ``pred == gold`` flags, the input of the sentence-level bootstrap."""
    _check_aligned("gold", gold, "pred", pred)
    return [[g == p for g, p in zip(gs, ps)] for gs, ps in zip(gold, pred)]


@dataclass(frozen=True)
class TaggingScores:
    """Accuracy in % over all tokens and each group (None for an empty group), and the group sizes."""

    all: float | None
    oov: float | None
    oov_in_vocab: float | None
    ambiguous: float | None
    unambiguous: float | None
    n_all: int
    n_oov: int
    n_oov_in_vocab: int
    n_ambiguous: int
    n_unambiguous: int

    def record(self) -> dict:
        """The scores as ``sanlab evaluate`` and ``compare-eval.json`` store them."""
        names = ("all", *GROUPS)
        return {**{g: getattr(self, g) for g in names}, **{f"n_{g}": getattr(self, f"n_{g}") for g in names}}


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
    """Token accuracy over all tokens and over each word group (module docstring)."""
    _check_aligned("gold", gold, "pred", pred)
    _check_aligned("gold", gold, "words", words)
    flags = correctness(gold=gold, pred=pred)
    groups = token_groups(words, train_word_tags=train_word_tags, in_vocab=in_vocab)
    total: Counter[str] = Counter()
    right: Counter[str] = Counter()
    for name, sentences in (("all", [[True] * len(s) for s in flags]), *groups.items()):
        for ok_s, in_s in zip(flags, sentences):
            total[name] += sum(in_s)
            right[name] += sum(ok and inside for ok, inside in zip(ok_s, in_s))
    names = ("all", *GROUPS)
    return TaggingScores(**{g: _accuracy(right[g], total[g]) for g in names}, **{f"n_{g}": total[g] for g in names})


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
