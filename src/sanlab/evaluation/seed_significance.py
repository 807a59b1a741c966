"""Significance between two *rows* trained with several seeds each: a two-level (hierarchical) paired
bootstrap that resamples training seeds as well as sentences, so a difference must hold up against
seed-to-seed variation too, which a test of one seed's outputs (``significance``) cannot see. With one seed
per side it is exactly ``significance``'s paired bootstrap: the same resamples, p-value and tie rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import estimate_ci

from sanlab.evaluation.bleu import References, reference_streams
from sanlab.evaluation.significance import (SignificanceResult, SystemEstimate, check_bootstrap_args,
                                            sentence_counts, shifted_p_value, tie_corrected)


def seed_bootstrap(
    baseline_runs: Sequence[np.ndarray],
    system_runs: Sequence[np.ndarray],
    score: Callable[[np.ndarray], np.ndarray],
    *,
    metric: str,
    n_samples: int = 1000,
    seed: int = 12345,
) -> SignificanceResult:
    """Two-level paired bootstrap of the mean score over training seeds, system vs baseline.

    Each run (one training seed) is an ``(N, K)`` array of per-sentence sufficient statistics on
    the same N test sentences; ``score`` maps summed statistics ``(..., K)`` to scores ``(...)``.
    A row's score is the mean of its runs' corpus scores (the table's mean over seeds), so the
    observed ``delta`` is the table's Δ. Every resample draws

    1. sentence indices, ``rng.choice(N, size=(B, N))`` as sacreBLEU, shared by all runs (paired);
    2. for each system, as many runs as it has, with replacement, ``rng.integers(k, size=(B, k))``;
    3. where a side's runs vary beyond their own noise, one ``chi2_nu`` variate, ``rng.chisquare(nu, size=B)``.

    The resampled mean over ``k`` drawn runs understates the seed variance by ``(k - 1) / k``
    (plug-in variance), which matters with the usual 3 seeds; so its deviation from the mean of
    all ``k`` runs on that resample is scaled by ``sqrt(k / (k - 1))``, giving the unbiased
    ``s^2 / k``. But ``s^2``, the spread of the runs' corpus scores, also holds each run's own sentence
    noise, which the sentence resampling already carries in the mean of all runs: counted twice, it made the
    test miss differences the pooled runs show (p = 0.04 where their paired bootstrap gives 0.004). So the
    deviation is scaled on to the seed variance beyond that noise, ``tau^2 = max(0, s^2 - noise)`` (method of
    moments; ``noise`` is ``k / (k - 1)`` times the mean over runs of the resamples' variance of a run's
    deviation from the mean of all runs). ``tau^2`` is itself estimated from a few runs: read against the
    normal-like spread of the resamples it made the test lenient (in a seed-dominated null with 3 seeds a side,
    19% of p below 0.05 and 8.5% below 0.01, for a two-sided 10% and 2%). So, as Welch's t-test does, each
    resampled Δ's distance from the resamples' centre is scaled by ``sqrt(nu / chi2_nu)``, ``nu`` being the
    Welch-Satterthwaite degrees of freedom of the variance of Δ (the sentence part, whose degrees of freedom
    are many, plus ``tau_base^2 / k_base + tau_sys^2 / k_sys``, with ``k - 1`` each): where the seeds dominate,
    Δ has a t's tails, and where the sentences add nothing its p is Welch's one-sided p; where the sentences
    dominate, ``nu`` is large and the scaling fades. The p-value is then how often the scaled distance passes
    |Δ| in Δ's direction (``_p_value``); without seed variance beyond the sentences', the paired bootstrap's
    (shifted |Δ|, sacreBLEU's formula). The per-side means and CIs are those of the resamples before the t scaling.
    One run per side draws nothing extra to matter: the result equals the paired bootstrap's.
    """
    check_bootstrap_args(n_samples=n_samples, seed=seed)
    n = _sentences_of_runs(baseline_runs, system_runs)
    rng = np.random.default_rng(seed)
    idxs = rng.choice(n, size=(n_samples, n), replace=True)  # (B, N), as sacreBLEU
    # how often each sentence is drawn, so a resample's sums are one matrix product per run
    counts = np.bincount((np.arange(n_samples)[:, None] * n + idxs).ravel(),
                         minlength=n_samples * n).reshape(n_samples, n)
    base = _resampled_mean(baseline_runs, counts, score, rng)
    system = _resampled_mean(system_runs, counts, score, rng)
    base_score, sys_score = base.observed, system.observed
    base_samples, sys_samples = base.samples(), system.samples()
    delta = sys_score - base_score
    p_value = _p_value(base, system, delta, rng)
    base_mean, base_ci = estimate_ci(base_samples)
    sys_mean, sys_ci = estimate_ci(sys_samples)
    return SignificanceResult(
        metric=metric,
        baseline=SystemEstimate(score=base_score, mean=float(base_mean), ci=float(base_ci)),
        system=SystemEstimate(score=sys_score, mean=float(sys_mean), ci=float(sys_ci)),
        delta=delta,
        p_value=tie_corrected(p_value, delta=delta, n_samples=n_samples),
        n_samples=n_samples,
        seed=seed,
    )


def _sentences_of_runs(baseline_runs: Sequence[np.ndarray], system_runs: Sequence[np.ndarray]) -> int:
    """N, the test sentences every run scored; an error unless both sides have runs of one (N, K) shape."""
    runs = [np.asarray(r, dtype=np.int64) for r in (*baseline_runs, *system_runs)]
    if not baseline_runs or not system_runs:
        raise ValueError(f"need runs on both sides, got {len(baseline_runs)} baseline and {len(system_runs)} system")
    shapes = {r.shape for r in runs}
    if len(shapes) != 1 or runs[0].ndim != 2:
        raise ValueError(f"every run needs per-sentence statistics of one shape (N, K), got {sorted(shapes)}")
    return runs[0].shape[0]


@dataclass(frozen=True)
class _Side:
    """One row's runs under the resamples (``_resampled_mean``)."""

    observed: float          # mean of the runs' corpus scores: the table's mean
    k: int                   # runs
    variance: float          # tau^2 / k, the seed variance of the mean beyond the runs' own noise (0 with one run)
    everyone: np.ndarray     # (B,) mean of all runs on each sentence resample
    deviation: np.ndarray    # (B,) drawn runs' mean minus ``everyone``, scaled to variance tau^2 / k

    def samples(self) -> np.ndarray:
        return self.everyone + self.deviation


def _resampled_mean(side: Sequence[np.ndarray], counts: np.ndarray, score: Callable[[np.ndarray], np.ndarray],
                    rng: np.random.Generator) -> _Side:
    """The side's observed mean score over its runs and its resampled means (``seed_bootstrap``)."""
    n_samples = counts.shape[0]
    per_run = np.stack([score(counts @ np.asarray(r, dtype=np.int64)) for r in side])  # (k, B)
    k = len(side)
    picks = rng.integers(k, size=(n_samples, k))  # (B, k): runs drawn for each resample
    picked = per_run[picks, np.arange(n_samples)[:, None]].mean(axis=1)  # (B,)
    everyone = per_run.mean(axis=0)
    scores = np.array([float(score(np.asarray(r, dtype=np.int64).sum(axis=0))) for r in side])
    if k == 1:
        return _Side(observed=float(scores.mean()), k=k, variance=0.0, everyone=everyone, deviation=picked - everyone)
    # the runs' spread s^2 holds each run's own sentence noise, which ``everyone`` already carries (its mean
    # over k runs): only the seed variance beyond it, tau^2 = s^2 - noise, is added (method of moments, >= 0)
    spread = float(scores.var(ddof=1))
    noise = k / (k - 1) * float(np.mean((per_run - everyone).var(axis=1)))
    seed_variance = max(0.0, spread - noise)
    # the drawn runs' deviation spreads as the runs do on each resample, s^2 + noise on average (not s^2): scaled
    # by that, its variance is tau^2 / k, as ``variance`` tells the degrees of freedom
    per_resample = float(per_run.var(axis=0, ddof=1).mean())
    shrink = np.sqrt(seed_variance / per_resample) if per_resample > 0 else 0.0
    return _Side(observed=float(scores.mean()), k=k, variance=seed_variance / k, everyone=everyone,
                 deviation=shrink * np.sqrt(k / (k - 1)) * (picked - everyone))


def _p_value(base: _Side, system: _Side, delta: float, rng: np.random.Generator) -> float:
    """The seeds test's p. No seed variance beyond the sentences' on either side (one run a side among them):
    the paired bootstrap's p of the resampled Δ (sacreBLEU's formula, no draw). Otherwise each resampled Δ's
    distance from the resamples' centre is scaled by ``sqrt(nu / chi2_nu)``, ``nu`` the Welch-Satterthwaite
    degrees of freedom of the variance of Δ: the sentence part (its resamples' variance, as many degrees of
    freedom as one likes) plus each side's ``tau^2 / k`` (``k - 1``); p is how often that distance passes |Δ| in
    Δ's direction. It is measured from the known centre, not, as sacreBLEU's formula does, from the mean of the
    scaled |Δ|: with two runs a side ``nu`` is near 1, where a t has no finite mean, and that mean made p small
    and dependent on the number of resamples (0.04-0.09 where Welch's t gives 0.19)."""
    sentences = system.everyone - base.everyone
    differences = system.samples() - base.samples()
    terms = [(s.variance, s.k - 1) for s in (base, system) if s.k > 1 and s.variance > 0]
    if not terms:
        return shifted_p_value(np.abs(differences), abs(delta))
    total = float(sentences.var()) + sum(v for v, _ in terms)
    nu = total ** 2 / sum(v * v / df for v, df in terms)
    distance = np.sqrt(nu / rng.chisquare(nu, size=len(differences))) * (differences - float(sentences.mean()))
    beyond = int(np.sum((distance if delta >= 0 else -distance) > abs(delta)))
    return (beyond + 1) / (len(differences) + 1)


def seed_bootstrap_accuracy(
    baseline_runs: Sequence[Sequence[Sequence[bool]]],
    system_runs: Sequence[Sequence[Sequence[bool]]],
    *,
    n_samples: int = 1000,
    seed: int = 12345,
) -> SignificanceResult:
    """``seed_bootstrap`` of token accuracy: each run is per-token correctness, one list per sentence
    (as ``paired_bootstrap_accuracy`` takes), all runs on the same tokens."""
    def stats(run: Sequence[Sequence[bool]]) -> np.ndarray:
        hits, totals = sentence_counts(run)
        return np.stack([hits, totals], axis=1)

    runs = [stats(r) for r in (*baseline_runs, *system_runs)]
    totals = runs[0][:, 1] if runs else None
    for i, r in enumerate(runs):
        if r.shape != runs[0].shape or not np.array_equal(r[:, 1], totals):
            raise ValueError(f"run {i} is not on the same sentences and tokens as run 0")
    if totals is not None and totals.sum() == 0:
        raise ValueError(f"no tokens to score: {len(totals)} sentences with 0 tokens in total")

    def accuracy(summed: np.ndarray) -> np.ndarray:
        return 100.0 * summed[..., 0] / np.maximum(summed[..., 1], 1)

    k = len(baseline_runs)
    return seed_bootstrap(runs[:k], runs[k:], accuracy, metric="accuracy", n_samples=n_samples, seed=seed)


def seed_bootstrap_bleu(
    baseline_runs: Sequence[Sequence[str]],
    system_runs: Sequence[Sequence[str]],
    references: References,
    *,
    n_samples: int = 1000,
    seed: int = 12345,
    tokenize: str = "13a",
    lowercase: bool = False,
) -> SignificanceResult:
    """``seed_bootstrap`` of corpus BLEU: each run is one seed's hypotheses of the same sentences.

    Sentence statistics and scores come from sacreBLEU's BLEU, through the same two methods its
    own paired bootstrap uses (``_extract_corpus_statistics``, ``_compute_score_from_stats``).
    """
    lengths = {len(r) for r in (*baseline_runs, *system_runs)}
    if len(lengths) > 1:
        raise ValueError(f"runs have different numbers of hypotheses: {sorted(lengths)}")
    n_hyps = lengths.pop() if lengths else 0
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
    streams = reference_streams(references, n_hypotheses=n_hyps)
    runs = [np.asarray(bleu._extract_corpus_statistics(list(r), streams), dtype=np.int64)
            for r in (*baseline_runs, *system_runs)]

    def corpus_bleu(summed: np.ndarray) -> np.ndarray:
        flat = summed.reshape(-1, summed.shape[-1])
        scores = [bleu._compute_score_from_stats(list(s)).score for s in flat]
        return np.asarray(scores, dtype=np.float64).reshape(summed.shape[:-1])

    k = len(baseline_runs)
    return seed_bootstrap(runs[:k], runs[k:], corpus_bleu, metric="BLEU", n_samples=n_samples, seed=seed)
