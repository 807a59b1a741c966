"""Paired bootstrap: BLEU through sacreBLEU, accuracy checked against sacreBLEU's own test."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest, Result, _paired_bs_test

from sanlab.evaluation.significance import (
    paired_bootstrap_accuracy,
    paired_bootstrap_bleu,
    paired_bootstrap_counts,
    significance_mark,
    smallest_p_warning,
)

N = 200  # resamples: the smallest p is 1/201 < 0.01, and the file runs in well under a second


def _corpus(n_sent: int = 40, seed: int = 0) -> tuple[list[str], list[str], list[str]]:
    """References, a perfect system, and a baseline with most words replaced."""
    rnd = random.Random(seed)
    vocab = [f"w{i}" for i in range(50)]
    refs = [" ".join(rnd.choices(vocab, k=rnd.randint(6, 12))) for _ in range(n_sent)]
    bad = [" ".join(w if rnd.random() < 0.4 else "zz" for w in r.split()) for r in refs]
    return refs, list(refs), bad


@pytest.mark.parametrize(
    ("p", "delta", "mark"),
    [
        (0.005, 1.0, "⇑"), (0.03, 0.5, "↑"), (0.005, -1.0, "⇓"), (0.03, -0.5, "↓"),
        (0.2, 2.0, ""), (0.001, 0.0, ""),  # not significant; no change
    ],
)
def test_significance_mark(p, delta, mark):
    assert significance_mark(p, delta) == mark


def test_identical_systems_bleu_no_difference():
    refs, good, bad = _corpus()
    res = paired_bootstrap_bleu(bad, list(bad), refs, n_samples=N)
    assert res.delta == 0.0 and res.p_value == 1.0 and res.mark == ""
    assert res.system == res.baseline


def test_sacrebleu_reports_min_p_for_identical_systems():
    # Why paired_bootstrap_* report p = 1 for a tie on every resample: sacreBLEU's own test
    # counts `stats > diff` with stats and diff all 0, so it returns 1 / (B + 1).
    refs, _, bad = _corpus()
    _, scores = PairedTest([("a", bad), ("b", list(bad))], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=N)()
    assert scores["BLEU"][1].p_value == pytest.approx(1 / (N + 1))


def test_clearly_better_system_bleu():
    refs, good, bad = _corpus()
    res = paired_bootstrap_bleu(bad, good, refs, n_samples=N)
    assert res.delta > 30 and res.p_value < 0.01 and res.mark == "⇑"
    assert res.system.score == pytest.approx(100.0)
    assert "bs:200|seed:12345" in res.signature
    worse = paired_bootstrap_bleu(good, bad, refs, n_samples=N)
    assert worse.mark == "⇓" and worse.delta == pytest.approx(-res.delta)


def test_bleu_seed_is_passed_to_sacrebleu_and_environment_restored(monkeypatch):
    refs, good, bad = _corpus()
    noisy = [h if i % 3 else bad[i] for i, h in enumerate(good)]  # a real but moderate difference
    monkeypatch.setenv("SACREBLEU_SEED", "7")
    sig, scores = PairedTest([("a", bad), ("b", noisy)], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=N)()
    monkeypatch.setenv("SACREBLEU_SEED", "999")
    ours = paired_bootstrap_bleu(bad, noisy, refs, n_samples=N, seed=7)
    assert os.environ["SACREBLEU_SEED"] == "999"
    base, sys_ = scores["BLEU"]
    assert ours.p_value == sys_.p_value
    assert (ours.system.mean, ours.system.ci) == (sys_.mean, sys_.ci)
    assert (ours.baseline.mean, ours.baseline.ci) == (base.mean, base.ci)
    assert ours.signature == str(sig["BLEU"])


def test_bleu_is_deterministic_given_a_seed():
    refs, good, bad = _corpus()
    noisy = [h if i % 2 else bad[i] for i, h in enumerate(good)]
    a = paired_bootstrap_bleu(bad, noisy, refs, n_samples=N, seed=3)
    assert a == paired_bootstrap_bleu(bad, noisy, refs, n_samples=N, seed=3)
    assert a.system.mean != paired_bootstrap_bleu(bad, noisy, refs, n_samples=N, seed=4).system.mean


def _flags(n_sent: int, p_correct: float, seed: int) -> list[list[bool]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 15, size=n_sent)
    return [list(rng.random(n) < p_correct) for n in lengths]


def test_identical_systems_accuracy_no_difference():
    flags = _flags(50, 0.8, seed=0)
    res = paired_bootstrap_accuracy(flags, [list(s) for s in flags], n_samples=N)
    assert res.delta == 0.0 and res.p_value == 1.0 and res.mark == ""


def test_clearly_better_system_accuracy_and_determinism():
    base = _flags(60, 0.5, seed=0)
    system = [[True] * len(s) for s in base]
    res = paired_bootstrap_accuracy(base, system, n_samples=N, seed=11)
    assert res.system.score == 100.0 and res.delta > 40
    assert res.p_value < 0.01 and res.mark == "⇑"
    assert res == paired_bootstrap_accuracy(base, system, n_samples=N, seed=11)


class _AccuracyMetric:
    """Just enough of a sacreBLEU Metric for `_paired_bs_test`: a 'hypothesis' is a sentence id,
    its statistics are (hits, tokens), and the score is pooled accuracy in %."""

    class _Score:
        def __init__(self, score: float):
            self.score = score

    def __init__(self, hits: np.ndarray, totals: np.ndarray):
        self.stats = np.stack([hits, totals], axis=1)

    def _extract_corpus_statistics(self, hypotheses, references):
        return self.stats[[int(h) for h in hypotheses]].tolist()

    def _compute_score_from_stats(self, s):
        return self._Score(100.0 * float(s[0]) / float(s[1]))

    def _aggregate_and_compute(self, stats):
        return self._compute_score_from_stats(np.asarray(stats, dtype=np.float64).sum(0))


def test_accuracy_bootstrap_equals_sacrebleu_paired_bs_on_an_accuracy_metric():
    base = _flags(80, 0.70, seed=1)
    system = [[f or (j % 9 == 0) for j, f in enumerate(s)] for s in base]  # a small gain
    totals = np.array([len(s) for s in base])
    base_hits = np.array([sum(s) for s in base])
    sys_hits = np.array([sum(s) for s in system])
    ids = [str(i) for i in range(len(base))]

    bl_metric, sys_metric = _AccuracyMetric(base_hits, totals), _AccuracyMetric(sys_hits, totals)
    bl_stats = bl_metric._extract_corpus_statistics(ids, None)
    bl_info = {"acc": (bl_stats, Result(bl_metric._aggregate_and_compute(bl_stats).score))}
    _, theirs = _paired_bs_test(bl_info, "sys", ids, None, {"acc": sys_metric}, n_samples=N, seed=5)

    ours = paired_bootstrap_accuracy(base, system, n_samples=N, seed=5)
    assert 0 < ours.delta < 10
    assert ours.p_value == theirs["acc"].p_value
    assert ours.system.mean == pytest.approx(theirs["acc"].mean)
    assert ours.system.ci == pytest.approx(theirs["acc"].ci)


def test_accuracy_input_errors_name_the_values():
    with pytest.raises(ValueError, match="sentence 1: baseline has 2 tokens but system has 1"):
        paired_bootstrap_accuracy([[True], [True, False]], [[True], [True]], n_samples=N)
    with pytest.raises(ValueError, match="baseline has 1 sentences but system has 2"):
        paired_bootstrap_accuracy([[True]], [[True], [True]], n_samples=N)
    with pytest.raises(ValueError, match="seed must be a positive integer.*got 0"):
        paired_bootstrap_counts(baseline_hits=[1], system_hits=[1], totals=[2], seed=0)
    with pytest.raises(ValueError, match="3 hypotheses but system has 2"):
        paired_bootstrap_bleu(["a", "b", "c"], ["a", "b"], ["a", "b", "c"], n_samples=N)


def test_smallest_p_warning_says_which_marks_too_few_resamples_rule_out():
    assert smallest_p_warning(100) == "" and smallest_p_warning(1000) == ""
    assert smallest_p_warning(50) == "; with 50 resamples the smallest p is 0.0196, so no ⇑/⇓ can appear"
    assert smallest_p_warning(10) == "; with 10 resamples the smallest p is 0.0909, so no mark can appear"
