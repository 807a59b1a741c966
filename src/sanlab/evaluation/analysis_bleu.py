"""The analyses that score hypotheses against references: the n-gram precision gap of each system to a
baseline (CSAN Fig. 3), corpus BLEU per source-length bucket with an optional paired bootstrap against a
baseline (MUSE Fig. 3), and every system against every baseline run (one paired bootstrap each).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sanlab.evaluation.analysis_table import Table
from sanlab.evaluation.bleu import (References, bleu_by_length, length_bucket_members, ngram_precisions,
                                    reference_streams)
from sanlab.evaluation.significance import p_text, paired_bootstrap_bleu


# ----------------------------------------------------------------------------- n-gram gap (CSAN Fig. 3)
@dataclass(frozen=True)
class NgramGap:
    """Order-n precision of one system (clipped matches / hypothesis n-grams, in %) and its gap
    to the baseline's precision of the same order (system - baseline, in points)."""

    system: str
    order: int
    matches: int
    total: int
    precision: float
    gap: float


def ngram_gaps(systems: Mapping[str, Sequence[str]], references: References, *, baseline: str,
               tokenize: str = "13a", lowercase: bool = False) -> list[NgramGap]:
    """Per-order precision of every system (the baseline included, gap 0) against one reference set."""
    if baseline not in systems:
        raise ValueError(f"baseline {baseline!r} is not one of the systems {list(systems)}")
    precisions = {name: ngram_precisions(hyps, references, tokenize=tokenize, lowercase=lowercase)
                  for name, hyps in systems.items()}
    base = {p.order: p.precision for p in precisions[baseline]}
    return [NgramGap(system=name, order=p.order, matches=p.matches, total=p.total, precision=p.precision,
                     gap=p.precision - base[p.order])
            for name, rows in precisions.items() for p in rows]


def ngram_gap_table(gaps: Sequence[NgramGap]) -> Table:
    return Table(("system", "order", "matches", "total", "precision", "gap"),
                 tuple((g.system, g.order, g.matches, g.total, g.precision, g.gap) for g in gaps))


# ----------------------------------------------------------------------------- length buckets (MUSE Fig. 3)
@dataclass(frozen=True)
class BucketScore:
    system: str
    bucket: str      # "1-10", ..., ">40" (a length of 0 counts in the first bucket)
    count: int
    bleu: float      # NaN for an empty bucket
    # against a baseline only (None for the baseline itself, an empty bucket, or no baseline):
    delta: float | None = None    # bleu - the baseline's bleu on the same sentences
    p_value: float | None = None  # sacreBLEU's paired bootstrap within the bucket
    mark: str = ""                # ⇑ ↑ ↓ ⇓ as in the comparison tables


def length_buckets(systems: Mapping[str, Sequence[str]], references: References, lengths: Sequence[int], *,
                   edges: Sequence[int] = (10, 20, 30, 40), tokenize: str = "13a", baseline: str | None = None,
                   n_samples: int = 1000, seed: int = 12345) -> list[BucketScore]:
    """Corpus BLEU per source-length bucket for each system; ``edges`` are ascending upper bounds.

    With ``baseline`` (a key of ``systems``), every other system's bucket is also tested against the
    baseline's on the same sentences (paired bootstrap): a bucket holds a few hundred sentences at most, so a
    gap of one or two BLEU in one bucket is often noise, and the table should say so."""
    if baseline is not None and baseline not in systems:
        raise KeyError(f"baseline {baseline!r} is not one of the systems ({', '.join(systems)})")
    members = length_bucket_members(lengths, edges)
    streams = reference_streams(references, n_hypotheses=len(lengths))
    scores = []
    for name, hyps in systems.items():
        rows = bleu_by_length(hyps, references, lengths, buckets=edges, tokenize=tokenize)
        for row, (_, _, idx) in zip(rows, members):
            test = None
            if baseline is not None and name != baseline and idx:
                test = paired_bootstrap_bleu([systems[baseline][i] for i in idx], [hyps[i] for i in idx],
                                             [[stream[i] for i in idx] for stream in streams],
                                             n_samples=n_samples, seed=seed, tokenize=tokenize)
            scores.append(BucketScore(system=name, bucket=row.label, count=row.count, bleu=row.bleu,
                                      delta=test.delta if test else None, p_value=test.p_value if test else None,
                                      mark=test.mark if test else ""))
    return scores


def length_bucket_table(scores: Sequence[BucketScore], *, tested: bool = False) -> Table:
    """``tested``: the scores were computed against a baseline (columns delta, p and sig)."""
    if not tested:
        return Table(("system", "bucket", "sentences", "bleu"),
                     tuple((s.system, s.bucket, s.count, s.bleu) for s in scores))
    return Table(("system", "bucket", "sentences", "bleu", "delta", "p", "sig"),
                 tuple((s.system, s.bucket, s.count, s.bleu, s.delta, s.p_value, s.mark) for s in scores),
                 p_columns=("p",))


# ----------------------------------------------------------------------------- every run against every baseline run
@dataclass(frozen=True)
class PairedResult:
    """One system tested against one baseline run on the same sentences (sacreBLEU's paired bootstrap)."""

    system: str
    baseline: str
    bleu: float           # the system's corpus BLEU
    baseline_bleu: float
    delta: float          # bleu - baseline_bleu
    p_value: float
    mark: str             # ⇑ ↑ ↓ ⇓ as in the comparison tables
    signature: str = ""   # sacreBLEU's signature of the test (BLEU's, with bs and seed)


def pairwise_tests(systems: Mapping[str, Sequence[str]], references: References, *, baselines: Sequence[str],
                   tokenize: str = "13a", n_samples: int = 1000, seed: int = 12345) -> list[PairedResult]:
    """Every system against every baseline (never against itself), system-major.

    Why: with one training run a side, a variant's mark can depend on which seed of the baseline it meets;
    testing it against each baseline seed shows whether it does."""
    missing = [b for b in baselines if b not in systems]
    if missing:
        raise KeyError(f"baseline {missing[0]!r} is not one of the systems ({', '.join(systems)})")
    results = []
    for name, hyps in systems.items():
        for base in baselines:
            if base == name:
                continue
            test = paired_bootstrap_bleu(systems[base], hyps, references, n_samples=n_samples, seed=seed,
                                         tokenize=tokenize)
            results.append(PairedResult(system=name, baseline=base, bleu=test.system.score,
                                        baseline_bleu=test.baseline.score, delta=test.delta, p_value=test.p_value,
                                        mark=test.mark, signature=test.signature))
    return results


def pairwise_tables(results: Sequence[PairedResult], scores: Mapping[str, float], *,
                    baselines: Sequence[str]) -> tuple[Table, Table]:
    """(wide table for reading, long table for the CSV). ``scores``: every system's corpus BLEU, in row order.

    The wide table has one row per system and one column per baseline ("+1.05 ↑ (p = 0.014)"; blank: a run
    against itself); with more than one baseline, a last column gives the difference to the baselines' mean
    BLEU (untested: a mean of runs is no system to resample; a baseline's own row includes itself in it)."""
    by = {(r.system, r.baseline): r for r in results}
    mean = sum(scores[b] for b in baselines) / len(baselines)
    with_mean = len(baselines) > 1

    def cell(system: str, base: str) -> str:
        r = by.get((system, base))
        return "" if r is None else f"{r.delta:+.2f}{' ' + r.mark if r.mark else ''} (p = {p_text(r.p_value)})"

    mean_column = ("vs mean of baselines",) if with_mean else ()
    wide_rows = tuple((s, bleu, *(cell(s, b) for b in baselines), *((f"{bleu - mean:+.2f}",) if with_mean else ()))
                      for s, bleu in scores.items())
    wide = Table(("system", "bleu", *(f"vs {b}" for b in baselines), *mean_column), wide_rows)
    long_rows = [(r.system, r.baseline, r.bleu, r.baseline_bleu, r.delta, r.p_value, r.mark) for r in results]
    if with_mean:
        long_rows += [(s, "mean of baselines", bleu, mean, bleu - mean, None, "") for s, bleu in scores.items()]
    return wide, Table(("system", "baseline", "bleu", "baseline_bleu", "delta", "p", "sig"), tuple(long_rows),
                       p_columns=("p",))
