"""Paired bootstrap significance for BLEU (sacreBLEU's own test) and for tagging accuracy.

Both tests use one convention, sacreBLEU's ``_paired_bs_test`` (sacrebleu 2.x, after Koehn 2004
and multeval), so an arrow means the same thing in a BLEU table and in an accuracy table:

1. ``rng = numpy.random.default_rng(seed)``; draw ``B = n_samples`` resamples of sentence
   indices with replacement, ``rng.choice(N, size=(B, N))``. Both systems use the same indices.
2. Observed difference ``d = |score_sys - score_base|``; resampled ``d*_b = |sys_b - base_b|``.
3. Shift the resampled differences to the null: ``s_b = d*_b - mean(d*)``.
4. ``p = (#{b : s_b > d} + 1) / (B + 1)``  (sacreBLEU ``_compute_p_value``:
   ``c = np.sum(stats > real_difference).item(); p = (c + 1) / (len(stats) + 1)``).

Although it looks at |d|, the test is in effect **one-sided in the direction of the observed delta**:
unless the effect is tiny, mean(d*) is close to d, so ``s_b > d`` asks how often the resampled
difference exceeds its own mean by d, i.e. p is close to P(the difference would flip sign) - Koehn's
(2004) "A beats B in 95% of resamples". A mark at p < 0.05 is therefore a directional 5% test, a two-sided
10% one, and p < 0.01 a two-sided 2% one. Checked in null simulations (2026-12-02): two synthetic systems alike
on every sentence, 2,000 experiments: 11% of p below 0.05, 2.1% below 0.01; real outputs of two seeds swapped
sentence by sentence at random (so neither is better), EWT tags 2,000: 11.6% and 2.9% (a z-test with the
exact variance: 11.0% and 2.8%), Multi30k BLEU 200: 9.5% and 2.0%. The papers' marks
follow the same convention; ``significance_mark`` turns the sign of the delta into the arrow. Mean and 95% CI (half-width, "mu ± ci") of each system
come from the same resamples, via sacreBLEU's ``estimate_ci``.

One deliberate deviation: when the two systems tie on every resample (e.g. identical output),
sacreBLEU's ``s_b > d`` is never true and it returns its smallest p, ``1 / (B + 1)``; we report
``p = 1.0`` there, since there is no difference at all. Every other p-value is sacreBLEU's.

Rows trained with several seeds are compared in ``seed_significance`` (a two-level bootstrap over seeds
and sentences, built on the helpers here: ``check_bootstrap_args``, ``shifted_p_value``, ``tie_corrected``,
``sentence_counts``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest, estimate_ci

from sanlab.evaluation.bleu import References, reference_streams


@dataclass(frozen=True)
class SystemEstimate:
    """A system's corpus score and its bootstrap mean and 95% CI half-width (score ± ci)."""

    score: float
    mean: float
    ci: float

    @property
    def interval(self) -> tuple[float, float]:
        return (self.mean - self.ci, self.mean + self.ci)


@dataclass(frozen=True)
class SignificanceResult:
    """Outcome of a paired bootstrap of ``system`` against ``baseline`` on one test set."""

    metric: str
    baseline: SystemEstimate
    system: SystemEstimate
    delta: float  # system.score - baseline.score
    p_value: float
    n_samples: int
    seed: int
    signature: str = ""  # sacreBLEU's signature for BLEU (with bs and seed); empty otherwise

    @property
    def mark(self) -> str:
        return significance_mark(self.p_value, self.delta)


def significance_mark(p_value: float, delta: float) -> str:
    """The papers' arrows: ⇑/⇓ for p < 0.01, ↑/↓ for p < 0.05, pointing the way the score moved."""
    if delta == 0 or p_value >= 0.05:
        return ""
    if p_value < 0.01:
        return "⇑" if delta > 0 else "⇓"
    return "↑" if delta > 0 else "↓"


def p_text(p_value: float) -> str:
    """A p-value with 3 decimals, or as many more as it takes not to round it onto a threshold of the marks
    (10/1001 = 0.00999 is below 0.01: "0.010" would say it is not) or down to zero."""
    for digits in range(3, 12):
        text = f"{p_value:.{digits}f}"
        if float(text) > 0 and not any(p_value < threshold <= float(text) for threshold in (0.01, 0.05)):
            return text
    return f"{p_value:.3g}"


def smallest_p_warning(n_samples: int) -> str:
    """A warning when too few resamples make a mark impossible: the smallest p is 1 / (n_samples + 1)."""
    if n_samples >= 100:
        return ""
    cannot = "no mark" if n_samples < 20 else "no ⇑/⇓"
    return f"; with {n_samples} resamples the smallest p is {1 / (n_samples + 1):.3g}, so {cannot} can appear"


def check_bootstrap_args(*, n_samples: int, seed: int) -> None:
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    # sacreBLEU's PairedTest turns seed 0 into "no seed" (`self._seed if self._seed else None`),
    # which would make the test irreproducible; negative seeds are rejected by numpy.
    if seed < 1:
        raise ValueError(f"seed must be a positive integer (sacreBLEU treats 0 as unseeded), got {seed}")


def tie_corrected(p_value: float, *, delta: float, n_samples: int) -> float:
    """p = 1 when every resample ties (see module docstring); sacreBLEU's p otherwise."""
    no_exceedance = round(p_value * (n_samples + 1)) == 1  # c == 0 in sacreBLEU's formula
    return 1.0 if delta == 0 and no_exceedance else p_value


@contextmanager
def _sacrebleu_seeded_and_quiet(seed: int) -> Iterator[None]:
    """sacreBLEU reads its bootstrap seed from SACREBLEU_SEED and logs progress at INFO.

    Why: PairedTest has no seed argument, and the CLI may configure INFO logging globally.
    Both are restored on exit (not thread-safe; the test is CPU-bound and run serially).
    """
    logger = logging.getLogger("sacrebleu")
    old_level, old_seed = logger.level, os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(old_level)
        if old_seed is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old_seed


def paired_bootstrap_bleu(
    baseline_hyps: Sequence[str],
    system_hyps: Sequence[str],
    references: References,
    *,
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> SignificanceResult:
    """sacreBLEU's paired bootstrap (``--paired-bs``) of corpus BLEU, system vs baseline."""
    check_bootstrap_args(n_samples=n_samples, seed=seed)
    if len(system_hyps) != len(baseline_hyps):
        raise ValueError(
            f"baseline has {len(baseline_hyps)} hypotheses but system has {len(system_hyps)}"
        )
    streams = reference_streams(references, n_hypotheses=len(baseline_hyps))
    metric = BLEU(tokenize=tokenize, lowercase=lowercase)
    with _sacrebleu_seeded_and_quiet(seed):
        test = PairedTest(
            [("baseline", list(baseline_hyps)), ("system", list(system_hyps))],
            {"BLEU": metric},
            streams,
            test_type="bs",
            n_samples=n_samples,
            n_jobs=1,
        )
        signatures, results = test()
    base, sys_ = results["BLEU"]
    delta = float(sys_.score - base.score)
    return SignificanceResult(
        metric="BLEU",
        baseline=SystemEstimate(score=float(base.score), mean=float(base.mean), ci=float(base.ci)),
        system=SystemEstimate(score=float(sys_.score), mean=float(sys_.mean), ci=float(sys_.ci)),
        delta=delta,
        p_value=tie_corrected(float(sys_.p_value), delta=delta, n_samples=n_samples),
        n_samples=n_samples,
        seed=seed,
        signature=str(signatures["BLEU"]),
    )


def sentence_counts(flags: Sequence[Sequence[bool]]) -> tuple[np.ndarray, np.ndarray]:
    correct = np.array([sum(bool(f) for f in s) for s in flags], dtype=np.int64)
    totals = np.array([len(s) for s in flags], dtype=np.int64)
    return correct, totals


def paired_bootstrap_accuracy(
    baseline_correct: Sequence[Sequence[bool]],
    system_correct: Sequence[Sequence[bool]],
    *,
    n_samples: int = 1000,
    seed: int = 12345,
) -> SignificanceResult:
    """Paired bootstrap over sentences of token accuracy, with sacreBLEU's p-value convention.

    Each argument holds per-token correctness flags, one list per sentence, for the same tokens
    (``tagging.correctness`` builds them; filter with ``tagging.token_groups`` for OOV or
    Ambiguous accuracy). Sentences, not tokens, are resampled, because tokens of a sentence
    are not independent.
    """
    if len(baseline_correct) != len(system_correct):
        raise ValueError(
            f"baseline has {len(baseline_correct)} sentences but system has {len(system_correct)}"
        )
    for i, (b, s) in enumerate(zip(baseline_correct, system_correct)):
        if len(b) != len(s):
            raise ValueError(f"sentence {i}: baseline has {len(b)} tokens but system has {len(s)}")
    base_hits, totals = sentence_counts(baseline_correct)
    sys_hits, _ = sentence_counts(system_correct)
    return paired_bootstrap_counts(
        baseline_hits=base_hits, system_hits=sys_hits, totals=totals, n_samples=n_samples, seed=seed
    )


def paired_bootstrap_counts(
    *,
    baseline_hits: Sequence[int] | np.ndarray,
    system_hits: Sequence[int] | np.ndarray,
    totals: Sequence[int] | np.ndarray,
    n_samples: int = 1000,
    seed: int = 12345,
) -> SignificanceResult:
    """``paired_bootstrap_accuracy`` from per-sentence (correct, total) counts.

    Accuracy of a resample is its pooled hits over its pooled tokens (micro average, like the
    corpus score); a resample that happens to hold no token scores 0 for both systems.
    """
    check_bootstrap_args(n_samples=n_samples, seed=seed)
    base = np.asarray(baseline_hits, dtype=np.int64)
    sys_ = np.asarray(system_hits, dtype=np.int64)
    tot = np.asarray(totals, dtype=np.int64)
    if not (base.shape == sys_.shape == tot.shape) or base.ndim != 1:
        raise ValueError(
            f"need three 1-D count arrays of one length, got shapes {base.shape}, {sys_.shape}, {tot.shape}"
        )
    if tot.sum() == 0:
        raise ValueError(f"no tokens to score: {len(tot)} sentences with 0 tokens in total")
    if np.any(base > tot) or np.any(sys_ > tot):
        raise ValueError("a sentence has more correct tokens than tokens")

    rng = np.random.default_rng(seed)
    idxs = rng.choice(len(tot), size=(n_samples, len(tot)), replace=True)  # (B, N), as sacreBLEU
    sample_tot = tot[idxs].sum(axis=1)  # (B,)
    safe_tot = np.maximum(sample_tot, 1)
    base_samples = 100.0 * base[idxs].sum(axis=1) / safe_tot  # (B,)
    sys_samples = 100.0 * sys_[idxs].sum(axis=1) / safe_tot  # (B,)

    base_score = 100.0 * base.sum() / tot.sum()
    sys_score = 100.0 * sys_.sum() / tot.sum()
    delta = float(sys_score - base_score)
    p_value = shifted_p_value(np.abs(sys_samples - base_samples), abs(delta))
    base_mean, base_ci = estimate_ci(base_samples)
    sys_mean, sys_ci = estimate_ci(sys_samples)
    return SignificanceResult(
        metric="accuracy",
        baseline=SystemEstimate(score=float(base_score), mean=float(base_mean), ci=float(base_ci)),
        system=SystemEstimate(score=float(sys_score), mean=float(sys_mean), ci=float(sys_ci)),
        delta=delta,
        p_value=tie_corrected(p_value, delta=delta, n_samples=n_samples),
        n_samples=n_samples,
        seed=seed,
    )


def shifted_p_value(sample_diffs: np.ndarray, observed_diff: float) -> float:
    """sacreBLEU's p: resampled |delta| shifted to mean 0, compared with the observed |delta|."""
    stats = sample_diffs - sample_diffs.mean()
    c = int(np.sum(stats > observed_diff))
    return (c + 1) / (len(stats) + 1)


def __getattr__(name: str):
    """``seed_bootstrap*`` lived here until 2026-11-25 (now ``seed_significance``, which imports this module):
    plug-in tasks that import them from here keep working."""
    if name in ("seed_bootstrap", "seed_bootstrap_accuracy", "seed_bootstrap_bleu"):
        from sanlab.evaluation import seed_significance

        return getattr(seed_significance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
