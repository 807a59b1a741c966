"""Corpus BLEU and chrF through sacreBLEU, plus the breakdowns our analyses plot.

BLEU is never re-implemented here: every number comes from sacreBLEU's ``BLEU`` / ``CHRF``
metrics, so a score printed by sanlab equals the one ``sacrebleu`` prints for the same files,
and the signature says exactly how it was computed.

References may be given as one list of strings (a single reference per hypothesis) or, for
several references, in sacreBLEU's own layout: a list of reference *streams*, each stream a
list with one string per hypothesis (``refs[k][i]`` is the k-th reference of hypothesis i).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, BLEUScore

References = Sequence[str] | Sequence[Sequence[str]]


def reference_streams(references: References, *, n_hypotheses: int) -> list[list[str]]:
    """sacreBLEU's layout (list of streams), checked against the number of hypotheses.

    Why: sacreBLEU silently zips hypotheses with references, so a file that lost a line would
    be scored against shifted references; we refuse instead.
    """
    if n_hypotheses == 0:
        raise ValueError("cannot score an empty corpus: got 0 hypotheses")
    if isinstance(references, str):  # it would be read as one reference per character
        raise TypeError("references must be a list of reference strings (or of streams), not one string")
    if len(references) == 0:
        raise ValueError(f"got {n_hypotheses} hypotheses but no references")
    if isinstance(references[0], str):
        streams = [list(references)]  # one reference per hypothesis
    else:
        streams = [list(stream) for stream in references]
    for k, stream in enumerate(streams):
        if len(stream) != n_hypotheses:
            raise ValueError(
                f"hypothesis and reference counts differ: {n_hypotheses} hypotheses, "
                f"{len(stream)} references in reference stream {k} (several references go as "
                "streams: references[k][i] is reference k of hypothesis i)"
            )
    return streams


def _check_hypotheses(hypotheses: Sequence[str]) -> None:
    """A TypeError for one string given as the hypotheses: sacreBLEU would score each of its characters as a
    sentence, against as many references as it has characters, without a word."""
    if isinstance(hypotheses, str):
        raise TypeError("hypotheses must be a list of strings, not one string: pass [hypothesis]")


@dataclass(frozen=True)
class TranslationScores:
    """Corpus BLEU and chrF with sacreBLEU's signatures and BLEU's sufficient statistics.

    ``precisions`` are sacreBLEU's (in %, with its smoothing for an order without matches);
    ``counts``/``totals`` are the matched and hypothesis n-gram counts per order.
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    precisions: tuple[float, ...]
    counts: tuple[int, ...]
    totals: tuple[int, ...]
    bp: float
    sys_len: int
    ref_len: int
    chrf_name: str = "chrF2"

    @property
    def ratio(self) -> float:
        """Hypothesis / reference length, as sacreBLEU reports it (0 for an empty reference)."""
        return self.sys_len / self.ref_len if self.ref_len else 0.0

    def format(self, *, width: int = 2) -> str:
        """The two one-liners ``sacrebleu -f text -m bleu chrf -w 2`` prints, signatures included (``width``:
        the score's decimals, sacreBLEU's ``-w``, whose default is 1)."""
        prec = "/".join(f"{p:.1f}" for p in self.precisions)
        bleu_line = (
            f"BLEU|{self.bleu_signature} = {self.bleu:.{width}f} {prec} "
            f"(BP = {self.bp:.3f} ratio = {self.ratio:.3f} "
            f"hyp_len = {self.sys_len:d} ref_len = {self.ref_len:d})"
        )
        chrf_line = f"{self.chrf_name}|{self.chrf_signature} = {self.chrf:.{width}f}"
        return f"{bleu_line}\n{chrf_line}"


def _bleu(
    hypotheses: Sequence[str], streams: list[list[str]], *, tokenize: str, lowercase: bool
) -> tuple[BLEUScore, str]:
    """sacreBLEU corpus BLEU and its signature (the signature needs the scored metric)."""
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    score = metric.corpus_score(list(hypotheses), streams)
    return score, str(metric.get_signature())


def corpus_scores(
    hypotheses: Sequence[str],
    references: References,
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> TranslationScores:
    """Corpus BLEU and chrF of detokenized hypotheses, exactly as the sacreBLEU CLI computes them."""
    _check_hypotheses(hypotheses)
    streams = reference_streams(references, n_hypotheses=len(hypotheses))
    bleu, bleu_sig = _bleu(hypotheses, streams, tokenize=tokenize, lowercase=lowercase)
    chrf_metric = CHRF(lowercase=lowercase)
    chrf = chrf_metric.corpus_score(list(hypotheses), streams)
    return TranslationScores(
        bleu=float(bleu.score),
        chrf=float(chrf.score),
        bleu_signature=bleu_sig,
        chrf_signature=str(chrf_metric.get_signature()),
        precisions=tuple(float(p) for p in bleu.precisions),
        counts=tuple(int(c) for c in bleu.counts),
        totals=tuple(int(t) for t in bleu.totals),
        bp=float(bleu.bp),
        sys_len=int(bleu.sys_len),
        ref_len=int(bleu.ref_len),
        chrf_name=chrf.name,
    )


@dataclass(frozen=True)
class NgramPrecision:
    """Clipped matches over hypothesis n-grams for one order; precision in % (NaN if no n-gram)."""

    order: int
    matches: int
    total: int
    precision: float


def ngram_precisions(
    hypotheses: Sequence[str],
    references: References,
    *,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> list[NgramPrecision]:
    """Per-order n-gram precisions from sacreBLEU's corpus statistics (CSAN Fig. 3).

    Why raw counts: sacreBLEU's ``precisions`` smooth an order with no match (exp smoothing),
    which would invent a precision for the gap plot; here precision is matches / total, unsmoothed.
    """
    _check_hypotheses(hypotheses)
    streams = reference_streams(references, n_hypotheses=len(hypotheses))
    bleu, _ = _bleu(hypotheses, streams, tokenize=tokenize, lowercase=lowercase)
    rows = []
    for n, (matches, total) in enumerate(zip(bleu.counts, bleu.totals), start=1):
        precision = 100.0 * matches / total if total else math.nan
        rows.append(NgramPrecision(order=n, matches=int(matches), total=int(total), precision=precision))
    return rows


@dataclass(frozen=True)
class LengthBucket:
    """Sentences with ``low < source length <= high`` (``high`` None: no upper bound)."""

    low: int
    high: int | None
    count: int
    bleu: float  # NaN when the bucket is empty

    @property
    def label(self) -> str:
        if self.high is None:
            return f">{self.low}"
        return f"{self.low + 1}-{self.high}"


def bucket_bounds(buckets: Sequence[int]) -> list[tuple[int, int | None]]:
    """(low, high] pairs from ascending upper edges, plus an open bucket above the last edge."""
    edges = list(buckets)
    if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 1:
        # an edge of 0 would make an empty first bucket "1-0" that also claims the length-0 sentences
        raise ValueError(f"buckets must be non-empty upper edges >= 1, strictly increasing, got {edges}")
    lows = [0, *edges]
    highs: list[int | None] = [*edges, None]
    return list(zip(lows, highs))


def length_bucket_members(
    src_lengths: Sequence[int], buckets: Sequence[int]
) -> list[tuple[int, int | None, list[int]]]:
    """(low, high, indices of the sentences with low < length <= high) per bucket, as ``bleu_by_length``
    groups them (a length of 0 falls in the first bucket)."""
    return [
        (low, high, [i for i, n in enumerate(src_lengths)
                     if (n > low or low == 0) and (high is None or n <= high)])
        for low, high in bucket_bounds(buckets)
    ]


def bleu_by_length(
    hypotheses: Sequence[str],
    references: References,
    src_lengths: Sequence[int],
    *,
    buckets: Sequence[int],
    tokenize: str = "13a",
    lowercase: bool = False,
) -> list[LengthBucket]:
    """Corpus BLEU of the sentences in each source-length bucket (MUSE Fig. 3).

    ``buckets`` are ascending upper edges: ``(10, 20, 30)`` gives 1-10, 11-20, 21-30 and >30
    (a length of 0 falls in the first bucket). Each bucket is scored as its own corpus, so
    the brevity penalty is the bucket's (our reading: the paper gives BLEU per length group
    without saying how it was computed).
    """
    _check_hypotheses(hypotheses)
    streams = reference_streams(references, n_hypotheses=len(hypotheses))
    if len(src_lengths) != len(hypotheses):
        raise ValueError(
            f"got {len(src_lengths)} source lengths for {len(hypotheses)} hypotheses"
        )
    rows = []
    for low, high, idx in length_bucket_members(src_lengths, buckets):
        if not idx:
            rows.append(LengthBucket(low=low, high=high, count=0, bleu=math.nan))
            continue
        sub_streams = [[stream[i] for i in idx] for stream in streams]
        score, _ = _bleu([hypotheses[i] for i in idx], sub_streams, tokenize=tokenize, lowercase=lowercase)
        rows.append(LengthBucket(low=low, high=high, count=len(idx), bleu=float(score.score)))
    return rows
