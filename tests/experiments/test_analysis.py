"""``sanlab analyze``: the pure computations on hand-made inputs, and each analysis end to end on
tiny untrained runs saved with the real ``sanlab.runs`` / checkpoint functions."""

import argparse
import sys
import csv
import json
import re
import math

import numpy as np
import pytest
import torch

from sanlab.attention import Attention
from sanlab.config import validate
from sanlab.data.subword import train_joint
from sanlab.data.synthetic import generate_translation
from sanlab.evaluation import analysis as A
from sanlab.experiments import analyze, analyze_bleu, analyze_cli
from sanlab.runs import evaluate_run, load_run_config, prepare_run_dir
from sanlab.training.checkpoint import CheckpointManager

# ----------------------------------------------------------------------------- hand-made corpora
REF = "the cat sat on the mat"
BASE_HYP = "the cat on mat"      # 1-grams 4/4, 2-grams 1/3 (the cat), 3-grams 0/2, 4-grams 0/1
SYS_HYP = "the cat sat on mat"   # 1-grams 5/5, 2-grams 3/4, 3-grams 2/3, 4-grams 1/2


def test_run_labels_are_short_but_keep_a_cells_variant():
    from sanlab.experiments.analyze import run_labels

    assert run_labels(["runs/csan2d", "runs/base"]) == ["csan2d", "base"]
    assert run_labels(["g/conv2d/seed-0"]) == ["conv2d/seed-0"]
    assert run_labels(["a/x/seed-0", "b/x/seed-0"]) == ["a/x/seed-0", "b/x/seed-0"]


def test_ngram_gaps_by_hand():
    gaps = A.ngram_gaps({"base": [BASE_HYP], "sys": [SYS_HYP]}, [REF], baseline="base")
    sys = {g.order: g for g in gaps if g.system == "sys"}
    assert [(sys[n].matches, sys[n].total) for n in (1, 2, 3, 4)] == [(5, 5), (3, 4), (2, 3), (1, 2)]
    expected_gap = [100 - 100, 75 - 100 / 3, 200 / 3 - 0, 50 - 0]
    assert [sys[n].gap for n in (1, 2, 3, 4)] == pytest.approx(expected_gap)
    assert all(g.gap == 0 for g in gaps if g.system == "base")


def test_ngram_precision_is_clipped_and_unknown_baseline_named():
    clipped = A.ngram_gaps({"b": ["the the the"]}, [REF], baseline="b")
    assert (clipped[0].matches, clipped[0].total) == (2, 3)  # "the" occurs twice in the reference
    with pytest.raises(ValueError, match="'x' is not one of the systems"):
        A.ngram_gaps({"b": [REF]}, [REF], baseline="x")


def test_length_bucket_assignment_and_scores():
    sources = ["a", "a b", "a b c", "a b c d e", "a b c d e f"]  # 1, 2, 3, 5, 6 words
    refs = ["w x y z v"] * 5
    hyps = [refs[0], refs[0], "p q r s t", refs[0], refs[0]]  # wrong only in the 3-4 bucket
    lengths = analyze_bleu.source_lengths(sources)
    assert lengths == [1, 2, 3, 5, 6]
    rows = A.length_buckets({"s": hyps}, refs, lengths, edges=(2, 4))
    assert [(r.bucket, r.count) for r in rows] == [("1-2", 2), ("3-4", 1), (">4", 2)]
    assert [r.bleu for r in rows] == pytest.approx([100.0, 0.0, 100.0])
    empty = A.length_buckets({"s": hyps}, refs, lengths, edges=(2, 3, 4))  # 4-4 holds no sentence
    assert empty[2].count == 0 and math.isnan(empty[2].bleu)


def test_a_source_word_is_what_sanlab_tag_reads_as_one_a_no_break_space_does_not_split_it():
    """str.split() also split at U+00A0 (and U+2009, U+3000, ...): "10\u00a0000 Menschen" counted 3 words, where
    `sanlab tag` and compare-mt's buckets (ASCII spaces) see 2; tabs and runs of spaces still separate."""
    from sanlab.data.conllu_io import plain_words

    sources = ["10\u00a0000 Menschen", "ein\u2009Hund  läuft", "a\tb c", "", "  "]
    assert analyze_bleu.source_lengths(sources) == [len(plain_words(s)) for s in sources] == [2, 2, 3, 0, 0]


def test_length_buckets_against_a_baseline_test_each_bucket_on_its_own_sentences():
    from sanlab.evaluation.significance import paired_bootstrap_bleu

    refs = [f"w{i} x y z v" for i in range(30)]
    lengths = [1] * 20 + [5] * 10                   # buckets 1-2 (20 sentences), 3-4 (empty), >4 (10)
    base = ["p q r s t"] * 20 + refs[20:]          # the baseline is all wrong in 1-2, right in >4
    sys_ = refs[:20] + refs[20:25] + ["p q r s t"] * 5  # the system: right in 1-2, half wrong in >4
    rows = A.length_buckets({"base": base, "sys": sys_}, refs, lengths, edges=(2, 4), baseline="base",
                            n_samples=200, seed=7)
    by = {(r.system, r.bucket): r for r in rows}
    assert all(by[("base", b)].p_value is None and by[("base", b)].delta is None for b in ("1-2", "3-4", ">4"))
    assert by[("sys", "3-4")].count == 0 and by[("sys", "3-4")].p_value is None  # nothing to test
    for bucket, idx in (("1-2", range(20)), (">4", range(20, 30))):  # the reference: sentences picked by hand
        expected = paired_bootstrap_bleu([base[i] for i in idx], [sys_[i] for i in idx], [refs[i] for i in idx],
                                         n_samples=200, seed=7)
        row = by[("sys", bucket)]
        assert row.delta == pytest.approx(row.bleu - by[("base", bucket)].bleu) == pytest.approx(expected.delta)
        assert (row.p_value, row.mark) == (expected.p_value, expected.mark)
    assert by[("sys", "1-2")].mark == "⇑" and by[("sys", ">4")].delta < 0
    table = A.length_bucket_table(rows, tested=True)
    assert table.columns == ("system", "bucket", "sentences", "bleu", "delta", "p", "sig")
    assert f"| {by[('sys', '1-2')].p_value:.3f} | ⇑ |" in table.markdown()  # p-values keep 3 digits
    assert A.length_bucket_table(A.length_buckets({"s": base}, refs, lengths, edges=(2,))).columns[-1] == "bleu"
    with pytest.raises(KeyError, match="baseline 'x' is not one of the systems \\(base, sys\\)"):
        A.length_buckets({"base": base, "sys": sys_}, refs, lengths, baseline="x")


def test_pairwise_tests_every_system_against_every_other_baseline():
    from sanlab.evaluation.significance import paired_bootstrap_bleu

    refs = [f"w{i} x y z v" for i in range(30)]
    systems = {"b1": refs[:25] + ["p q r s t"] * 5, "b2": refs[:15] + ["p q r s t"] * 15,
               "sys": refs[:29] + ["p q r s t"]}
    results = A.pairwise_tests(systems, refs, baselines=["b1", "b2"], n_samples=200, seed=7)
    assert [(r.system, r.baseline) for r in results] == [("b1", "b2"), ("b2", "b1"), ("sys", "b1"), ("sys", "b2")]
    for r in results:  # each cell is exactly the one-pair test
        expected = paired_bootstrap_bleu(systems[r.baseline], systems[r.system], refs, n_samples=200, seed=7)
        assert (r.delta, r.p_value, r.mark) == (expected.delta, expected.p_value, expected.mark)
        assert (r.bleu, r.baseline_bleu) == (expected.system.score, expected.baseline.score)
    by = {(r.system, r.baseline): r for r in results}
    assert by[("b2", "b1")].delta == pytest.approx(-by[("b1", "b2")].delta) and by[("b1", "b2")].mark == "⇑"
    scores = {name: by[(name, "b1" if name != "b1" else "b2")].bleu for name in systems}
    wide, long = A.pairwise_tables(results, scores, baselines=["b1", "b2"])
    assert wide.columns == ("system", "bleu", "vs b1", "vs b2", "vs mean of baselines")
    row = dict(zip(wide.columns, wide.rows[2]))
    mean = (scores["b1"] + scores["b2"]) / 2
    r = by[("sys", "b2")]
    assert row["vs b2"] == f"{r.delta:+.2f} {r.mark} (p = {A.p_text(r.p_value)})" and row["vs b1"].startswith("+")
    assert row["vs mean of baselines"] == f"{scores['sys'] - mean:+.2f}" and wide.rows[0][2] == ""  # not vs itself
    assert long.columns == ("system", "baseline", "bleu", "baseline_bleu", "delta", "p", "sig")
    assert len(long.rows) == 4 + 3 and long.rows[-1][1:6] == ("mean of baselines", scores["sys"], mean,
                                                              scores["sys"] - mean, None)
    one, _ = A.pairwise_tables([x for x in results if x.baseline == "b1"], scores, baselines=["b1"])
    assert one.columns == ("system", "bleu", "vs b1")  # one baseline: its column is the difference
    with pytest.raises(KeyError, match="baseline 'x' is not one of the systems \\(b1, b2, sys\\)"):
        A.pairwise_tests(systems, refs, baselines=["x"])


def test_p_text_never_rounds_onto_a_threshold_or_to_zero():
    values = (0.0123, 10 / 1001, 0.04996, 0.0499999, 0.0099999, 200 / 20001, 0.01, 0.05, 1.0, 1 / 100001, 0.001)
    assert [A.p_text(p) for p in values] == ["0.012", "0.00999", "0.04996", "0.0499999", "0.0099999", "0.0099995",
                                             "0.010", "0.050", "1.000", "0.00001", "0.001"]
    table = A.length_bucket_table([A.BucketScore("s", "1-8", 3, 40.0, 1.0, 10 / 1001, "⇑")], tested=True)
    assert "| 0.00999 | ⇑ |" in table.markdown() and "0.00999000999" in table.csv()  # CSV: full precision


def test_dotted_value_walks_mappings_and_lists_and_names_misses():
    tree = {"model": {"encoder": {"attention": {"parts": [{"type": "window", "size": 7}]}}}}
    assert A.dotted_value(tree, "model.encoder.attention.parts.0.size") == 7
    with pytest.raises(KeyError, match="list of 1 items; '3'"):
        A.dotted_value(tree, "model.encoder.attention.parts.3.size")
    with pytest.raises(KeyError, match="model.encoder has no key 'atention' \\(keys: attention\\)"):
        A.dotted_value(tree, "model.encoder.atention.heads")


RECORDS = [
    {"split": "train", "step": 1, "loss": 9.0},
    {"split": "valid", "step": 2, "bleu": 10.0, "loss": 5.0},
    {"split": "speed", "step": 2, "steps_per_s": 3.0},
    {"split": "valid", "step": 4, "bleu": 30.0, "loss": 4.0},
    {"split": "valid", "step": 4, "bleu": 25.0, "loss": 4.5},   # resumed: step 4 validated again
    {"split": "valid", "step": 6, "bleu": 20.0, "loss": 3.0},
]


def test_learning_curve_and_best_validation():
    assert A.learning_curve(RECORDS, metric="bleu") == [(2, 10.0), (4, 25.0), (6, 20.0)]
    assert A.learning_curve(RECORDS, metric="loss", split="train") == [(1, 9.0)]
    assert A.best_validation(RECORDS, metric="bleu") == (4, 25.0)
    assert A.best_validation(RECORDS, metric="loss") == (6, 3.0)  # loss: lower is better
    with pytest.raises(KeyError, match="metrics: bleu, loss") as err:
        A.learning_curve(RECORDS, metric="chrf")
    assert "did you mean" not in str(err.value)
    # a name right but for case is still refused (the stored name is the exact one), the exact one suggested
    with pytest.raises(KeyError, match=r"metric 'BLEU' \(metrics: bleu, loss\); did you mean 'bleu'\? \(metric "
                                       r"names are case-sensitive\)"):
        A.learning_curve(RECORDS, metric="BLEU")
    table = A.curves_table({"a": [(2, 1.0), (4, 2.0)], "b": [(4, 3.0)]})
    assert table.rows == ((2, 1.0, None), (4, 2.0, 3.0))


def test_best_validation_of_tied_records_is_the_newest_as_the_best_checkpoint():
    """Early validations often tie (BLEU 0, or one value for several steps); the run's ``best`` checkpoint is then
    the newest of them (``CheckpointManager.best``), so the sweep's "step N" must name that step, not the first."""
    tied = [{"split": "valid", "step": s, "bleu": b, "loss": l}
            for s, b, l in ((4, 0.3, 5.0), (8, 0.3, 4.0), (12, 0.3, 4.0), (16, 0.1, 6.0))]
    assert A.best_validation(tied, metric="bleu") == (12, 0.3)
    assert A.best_validation(tied, metric="loss") == (12, 4.0)  # lower is better: the newest of the tied minima


def test_mean_curves_average_only_the_steps_every_seed_logged():
    curves = {"v/seed-0": [(2, 1.0), (4, 2.0), (6, 5.0)], "v/seed-1": [(2, 3.0), (4, 4.0)], "w/seed-0": [(2, 7.0)]}
    group_of = {"v/seed-0": "v", "v/seed-1": "v", "w/seed-0": "w"}
    assert A.mean_curves(curves, group_of) == {"v (mean of 2)": [(2, 2.0), (4, 3.0)], "w (mean of 1)": [(2, 7.0)]}
    with pytest.raises(ValueError, match="'v' have no validation step in common"):
        A.mean_curves({"v/seed-0": [(2, 1.0)], "v/seed-1": [(4, 1.0)]}, {"v/seed-0": "v", "v/seed-1": "v"})
    # the same points with the seeds' sample sd (n - 1), None for a single seed; the table adds a column of it
    spread = A.seed_curves(curves, group_of)
    assert spread == {"v (mean of 2)": [(2, 2.0, pytest.approx(2 ** 0.5)), (4, 3.0, pytest.approx(2 ** 0.5))],
                      "w (mean of 1)": [(2, 7.0, None)]}
    table = A.curves_table(A.mean_curves(curves, group_of), spreads=spread)
    assert table.columns == ("step", "v (mean of 2)", "w (mean of 1)", "v (mean of 2) sd")


def test_gate_rows_and_table():
    gates = {"decoder.layers.0.self_mixer.mixer": [0.4, 0.6], "encoder.layers.1.mixer.mixer": [0.3, 0.7],
             "encoder.layers.0.mixer.mixer": [0.8, 0.2]}
    rows = A.gate_rows(gates, {name: [3, 15] for name in gates})
    assert [(r.stack, r.layer) for r in rows] == [("encoder", 0), ("encoder", 1), ("decoder", 0)]
    table = A.gate_table(rows)
    assert table.columns == ("stack", "layer", "k=3", "k=15", "small/large")
    assert table.column("k=3") == [0.8, 0.3, 0.4]
    assert table.column("small/large") == pytest.approx([4.0, 0.3 / 0.7, 0.4 / 0.6])
    assert "| encoder | 0 | 0.800 | 0.200 | 4.000 |" in table.markdown()
    single = A.gate_rows({"encoder.layers.0.mixer.mixer": [1.0]}, {"encoder.layers.0.mixer.mixer": [7]})
    assert A.gate_table(single).column("small/large") == [None]


def test_attention_matrix_blocks_and_decoder_split():
    w = torch.arange(2 * 3 * 6, dtype=torch.float).view(1, 2, 3, 6)  # [b, h, i, n*j] with j = 2, n = 3
    trace = {"scores": -w, "weights": w, "weights_final": w + 1}
    assert np.array_equal(A.attention_matrix(trace, head=1), (w + 1)[0, 1].numpy())  # final = weights_final
    assert np.array_equal(A.attention_matrix(trace, head=None, stage="weights"), w[0].mean(0).numpy())
    blocks = A.key_blocks(A.attention_matrix(trace, head=0, stage="weights"), keys=2)
    assert [d for d, _ in blocks] == [-1, 0, 1]
    assert np.array_equal(blocks[2][1], w[0, 0, :, 4:6].numpy())
    with pytest.raises(IndexError, match="head 2 does not exist; this layer has 2 heads"):
        A.attention_matrix(trace, head=2)
    with pytest.raises(KeyError, match="recorded no token-to-token weights"):
        A.attention_matrix({}, head=0)
    s0, c0, s1, m1 = ({"weights": k} for k in "abcd")
    m1["cross_weights"] = "e"  # a MUSE block with a parallel cross branch: no separate cross trace
    assert A.split_decoder_traces([s0, c0, m1], has_cross=[True, False]) == [(s0, c0), (m1, {"weights": "e"})]


def test_table_markdown_and_csv():
    table = A.Table(("a", "b"), (("x|y", 1.23456), ("z", float("nan"))))
    assert table.markdown().splitlines()[2] == "| x\\|y | 1.23 |"
    assert list(csv.reader(table.csv().splitlines())) == [["a", "b"], ["x|y", "1.23456"], ["z", ""]]


# ----------------------------------------------------------------------------- tiny runs
SMALL = {"dim": 16, "dropout": 0.0, "encoder": {"layers": 2, "ffn_dim": 32, "attention": {"heads": 4}},
         "decoder": {"layers": 2, "ffn_dim": 32, "attention": {"heads": 4}}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Synthetic data files, a hand-made 3-sentence test set and one sentencepiece model."""
    root = tmp_path_factory.mktemp("corpus")
    pairs = generate_translation(60, seed=3)
    (root / "train.src").write_text("".join(s + "\n" for s, _ in pairs))
    (root / "train.tgt").write_text("".join(t + "\n" for _, t in pairs))
    (root / "test.src").write_text("the dog sleeps .\nthe big cat sees a small bird in the garden .\na man runs .\n")
    (root / "test.tgt").write_text(f"{REF}\n{REF}\n{REF}\n")
    train_joint([s for s, _ in pairs], [t for _, t in pairs], model_path=root / "subword", vocab_size=80)
    return root


def make_translation_run(corpus, run, model=None, *, setup=None):
    """A run directory with an untrained (or ``setup``-modified) model saved as its best checkpoint."""
    from sanlab.tasks.translation import load_translation_model

    files = {"src": str(corpus / "train.src"), "tgt": str(corpus / "train.tgt")}
    raw = {"task": "translation", "model": {**SMALL, **(model or {})}, "decode": {"beam": 1, "max_len_b": 4},
           "data": {"train": files, "valid": files, "subword": {"vocab_size": 80},
                    "test": {"test": {"src": str(corpus / "test.src"), "tgt": str(corpus / "test.tgt")}}}}
    config = validate(raw, source="test")
    prepare_run_dir(run, config, overwrite=True)
    (run / "subword.model").write_bytes((corpus / "subword.model").read_bytes())
    torch.manual_seed(0)
    net, _ = load_translation_model(config, run)
    if setup:
        setup(net)
    CheckpointManager(run, keep_best=1, keep_last=1, higher_is_better=True).save(
        model=net, state={}, meta={"step": 1, "score": 0.0})
    return run


def _hand_written(run, text, split="test"):
    """Hypotheses written by hand over an evaluated split's file: its record's digest of the file is updated
    (without it, the analyses refuse a file that is not the one its record scored)."""
    from sanlab.tasks.translation import hypotheses_digest, read_hypotheses

    path = run / f"hyp-best-{split}.txt"
    path.write_text(text)
    record = json.loads((run / "eval-best.json").read_text())
    record[split]["hypotheses_sha256"] = hypotheses_digest(read_hypotheses(path))
    (run / "eval-best.json").write_text(json.dumps(record))


def _csv(path):
    return list(csv.reader(path.read_text().splitlines()))


def _check_outputs(paths):
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["md"].read_text().startswith("# ")
    return _csv(paths["csv"])


def test_ngram_gap_and_length_buckets_from_runs(corpus, tmp_path):
    base, csan = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "csan")
    evaluate_run(csan, checkpoint="best")  # writes hyp-best-test.txt the real way
    (base / "hyp-best-test.txt").write_text(f"{BASE_HYP}\n{SYS_HYP}\n{REF}\n")
    paths = analyze.ngram_gap([csan], baseline=base, out=tmp_path / "out" / "gap")
    rows = _check_outputs(paths)
    assert rows[0] == ["system", "order", "matches", "total", "precision", "gap"]
    assert [(r[0], r[1]) for r in rows[1:]] == [(s, str(n)) for s in ("base", "csan") for n in (1, 2, 3, 4)]
    # base: 4/4 + 5/5 + 6/6 unigrams; bigrams 1/3 + 3/4 + 5/5
    assert [float(r[4]) for r in rows[1:3]] == pytest.approx([100.0, 100 * 9 / 12])

    _hand_written(csan, f"{REF}\nwrong words only here\n{REF}\n")
    paths = analyze.length_buckets([base, csan], out=tmp_path / "len", edges=(4, 8))
    rows = _check_outputs(paths)
    assert [(r[0], r[1], r[2]) for r in rows[1:]] == [(s, b, n) for s in ("base", "csan")
                                                      for b, n in (("1-4", "2"), ("5-8", "0"), (">8", "1"))]
    assert float(rows[6][3]) == 0.0 and rows[5][3] == ""  # csan: sentence 2 (11 words) wrong; empty bucket

    # against a baseline: named once even if also listed, and first; csan's buckets get delta, p and sig
    paths = analyze.length_buckets([csan, base], baseline=base, out=tmp_path / "len-base", edges=(4, 8),
                                   bootstrap_samples=50)
    rows = _check_outputs(paths)
    assert rows[0] == ["system", "bucket", "sentences", "bleu", "delta", "p", "sig"]
    assert [r[0] for r in rows[1:]] == ["base"] * 3 + ["csan"] * 3 and rows[1][4:] == ["", "", ""]
    assert float(rows[6][4]) == pytest.approx(float(rows[6][3]) - float(rows[3][3]))  # >8: csan - base
    assert [bool(r[5]) for r in rows[4:]] == [True, False, True]  # a p for each non-empty bucket of csan
    assert "paired bootstrap within the bucket (50 resamples, seed 12345)" in paths["md"].read_text()
    alone = _check_outputs(analyze.length_buckets([base], baseline=base, out=tmp_path / "alone", edges=(4, 8)))
    assert alone[0][4:] == ["delta", "p", "sig"]  # asked for, so the columns are there (and blank)
    for kwargs, message in (({"bootstrap_samples": 0}, "must be >= 1, got 0 and 12345"),
                            ({"bootstrap_seed": 0}, "must be >= 1, got 1000 and 0")):
        with pytest.raises(analyze.ConfigError, match=f"--bootstrap-samples and --bootstrap-seed {message}"):
            analyze.length_buckets([csan], baseline=base, out=tmp_path / "x", **kwargs)
    with pytest.raises(analyze.ConfigError, match="set the test against --baseline: give a baseline or drop them"):
        analyze.length_buckets([csan], out=tmp_path / "x", bootstrap_samples=10)


def analyze_plots():
    from sanlab.evaluation import plots

    return plots


def test_pairwise_from_runs(corpus, tmp_path, monkeypatch):
    runs = {name: make_translation_run(corpus, tmp_path / "grid" / name / "seed-1") for name in ("base", "csan")}
    runs["base2"] = make_translation_run(corpus, tmp_path / "grid" / "base" / "seed-2")
    for run, hyps in ((runs["base"], [REF, REF, BASE_HYP]), (runs["base2"], [BASE_HYP, REF, REF]),
                      (runs["csan"], [SYS_HYP, REF, REF])):
        (run / "hyp-best-test.txt").write_text("".join(h + "\n" for h in hyps))
    drawn = {}
    real_grid = analyze_plots().delta_grid

    def spy(path, **kwargs):  # the plotted matrix, to check its rows and columns
        drawn.update(kwargs)
        return real_grid(path, **kwargs)

    monkeypatch.setattr(analyze_plots(), "delta_grid", spy)
    paths = analyze.pairwise([runs["csan"], runs["base"]], against=[runs["base"], runs["base2"]],
                             out=tmp_path / "pw", bootstrap_samples=50)
    rows = _check_outputs(paths)
    assert rows[0] == ["system", "baseline", "bleu", "baseline_bleu", "delta", "p", "sig"]
    pairs = [(r[0], r[1]) for r in rows[1:]]  # baselines first, each run once, never against itself
    assert pairs[:4] == [("base/seed-1", "base/seed-2"), ("base/seed-2", "base/seed-1"),
                         ("csan/seed-1", "base/seed-1"), ("csan/seed-1", "base/seed-2")]
    assert [p for p in pairs[4:]] == [(s, "mean of baselines") for s in ("base/seed-1", "base/seed-2", "csan/seed-1")]
    for r in rows[1:5]:
        assert float(r[4]) == pytest.approx(float(r[2]) - float(r[3])) and 0 < float(r[5]) <= 1
    assert all(r[5] == "" and r[6] == "" for r in rows[5:])  # against the mean: untested
    mean = (float(rows[1][2]) + float(rows[2][2])) / 2
    assert [float(r[3]) for r in rows[5:]] == pytest.approx([mean] * 3)
    md = paths["md"].read_text()
    assert "| system | bleu | vs base/seed-1 | vs base/seed-2 | vs mean of baselines |" in md
    assert "paired bootstrap (50 resamples, seed 12345; with 50 resamples the smallest p is 0.0196, so no ⇑/⇓" in md
    assert re.search(r"sacreBLEU signature: `BLEU\|nrefs:1\|bs:50\|seed:12345\|case:mixed\|eff:no\|tok:13a\|"
                     r"smooth:exp\|version:[\d.]+`", md)
    wide = {line.split(" | ")[0].lstrip("| "): line.strip("|").split(" | ") for line in md.splitlines()
            if line.startswith("| ") and "/seed-" in line}
    assert wide["base/seed-1"][2].strip() == ""  # not against itself
    delta, p_value, mark = float(rows[4][4]), float(rows[4][5]), rows[4][6]  # csan against base/seed-2
    assert wide["csan/seed-1"][3].strip() == f"{delta:+.2f}{' ' + mark if mark else ''} (p = {A.p_text(p_value)})"
    assert drawn["row_labels"] == ["base/seed-1", "base/seed-2", "csan/seed-1"]
    assert drawn["column_labels"] == ["base/seed-1", "base/seed-2"]
    expected = np.array([[np.nan, float(rows[1][4])], [float(rows[2][4]), np.nan],
                         [float(rows[3][4]), float(rows[4][4])]])
    np.testing.assert_allclose(drawn["deltas"], expected)  # rows: runs; columns: baselines (NaN: itself)
    assert drawn["marks"][2] == [rows[3][6], rows[4][6]]
    with pytest.raises(analyze.ConfigError, match="--against needs at least one baseline run"):
        analyze.pairwise([runs["csan"]], against=[], out=tmp_path / "x")
    with pytest.raises(analyze.ConfigError, match="must be >= 1, got 1000 and 0"):
        analyze.pairwise([runs["csan"]], against=[runs["base"]], out=tmp_path / "x", bootstrap_seed=0)


def test_eval_records_name_their_checkpoint_keep_other_splits_and_go_stale(corpus, tmp_path):
    run = make_translation_run(corpus, tmp_path / "r")
    evaluate_run(run, checkpoint="best", splits=["test"])
    evaluate_run(run, checkpoint="best", splits=["valid"])  # a second split joins the first
    record = json.loads((run / "eval-best.json").read_text())
    assert sorted(record) == ["test", "valid"]
    assert (record["test"]["checkpoint"], record["test"]["step"]) == ("checkpoints/step-00000001", 1)
    assert analyze.run_score(run, metric="bleu", score_from="eval", split="test", checkpoint="best")[0] == \
        record["test"]["bleu"]
    # the run trains on and finds a better checkpoint: the old record no longer says what "best" is
    from sanlab.tasks.translation import load_translation_model

    net, _ = load_translation_model(load_run_config(run), run)
    CheckpointManager(run, keep_best=1, keep_last=1, higher_is_better=True).save(
        model=net, state={}, meta={"step": 2, "score": 1.0})
    with pytest.raises(analyze.ConfigError, match=r"scored checkpoints/step-00000001 \(step 1\), but the run's "
                                                  r"'best' checkpoint is now checkpoints/step-00000002 \(step 2\)"):
        analyze.run_score(run, metric="bleu", score_from="eval", split="test", checkpoint="best")
    for stale_hypotheses in (lambda: analyze.length_buckets([run], out=tmp_path / "len", edges=(4, 8)),
                             lambda: analyze.ngram_gap([run], baseline=run, out=tmp_path / "gap")):
        with pytest.raises(analyze.ConfigError, match=r"scored checkpoints/step-00000001 \(step 1\), but"):
            stale_hypotheses()
    evaluate_run(run, checkpoint="best", splits=["test"])  # records of the old checkpoint are dropped
    assert sorted(json.loads((run / "eval-best.json").read_text())) == ["test"]
    assert not (run / "hyp-best-valid.txt").exists()  # with their hypotheses


def test_a_comparison_cells_score_is_read_from_its_compare_eval_record(tmp_path):
    """Committed cells keep compare-eval.json, not checkpoints: --from eval reads it for its grid's checkpoint."""
    import shutil

    from pathlib import Path

    cell = Path(__file__).resolve().parents[2] / "results/compare/csan-window-sweep-ud/m-3/seed-0"
    run = tmp_path / "m-3"
    shutil.copytree(cell, run)
    scores = json.loads((run / "compare-eval.json").read_text())["scores"]
    assert analyze.run_score(run, metric=None, score_from="eval", split=None, checkpoint="best") == \
        (scores["all"], "compare-eval.json test all")
    with pytest.raises(analyze.ConfigError, match=r"compare-eval.json scored checkpoint 'best', not 'last', and there "
                                                  r"is no eval-last.json beside it: pass --checkpoint best"):
        analyze.run_score(run, metric=None, score_from="eval", split=None, checkpoint="last")


def test_an_eval_record_names_the_checkpoint_it_loaded_when_best_moves_meanwhile(corpus, tmp_path, monkeypatch):
    """A training process may save a new best while `evaluate` decodes: the record names the weights scored."""
    import sanlab.runs.trained as trained
    from sanlab.tasks.translation import load_translation_model

    run = make_translation_run(corpus, tmp_path / "r")
    net, _ = load_translation_model(load_run_config(run), run)
    load_weights = trained.load_weights

    def load_then_train_on(model, path):
        load_weights(model, path)
        CheckpointManager(run, keep_best=2, keep_last=2, higher_is_better=True).save(
            model=net, state={}, meta={"step": 2, "score": 1.0})

    monkeypatch.setattr(trained, "load_weights", load_then_train_on)
    evaluate_run(run, checkpoint="best", splits=["test"])
    record = json.loads((run / "eval-best.json").read_text())["test"]
    assert (record["checkpoint"], record["step"]) == ("checkpoints/step-00000001", 1)
    assert trained.scored_checkpoint(run, "best", load_run_config(run))["step"] == 2  # "best" did move


def test_an_eval_record_keeps_the_step_of_a_checkpoint_pruned_after_loading(corpus, tmp_path, monkeypatch):
    """A run keeping one best checkpoint prunes the loaded one when it saves a new best: the record still says
    which update was scored (read as it was loaded), so the same weights' earlier records are not dropped."""
    import sanlab.runs.trained as trained
    from sanlab.tasks.translation import load_translation_model

    run = make_translation_run(corpus, tmp_path / "r")
    evaluate_run(run, checkpoint="best", splits=["valid"])
    net, _ = load_translation_model(load_run_config(run), run)
    refuse = trained.refuse_changed_scored_files

    def train_on_then_check(run_dir, config):
        CheckpointManager(run, keep_best=1, keep_last=1, higher_is_better=True).save(
            model=net, state={}, meta={"step": 2, "score": 1.0})
        refuse(run_dir, config)

    monkeypatch.setattr(trained, "refuse_changed_scored_files", train_on_then_check)
    evaluate_run(run, checkpoint="best", splits=["test"])
    assert not (run / "checkpoints" / "step-00000001").exists()  # pruned while it was being scored
    records = json.loads((run / "eval-best.json").read_text())
    assert {name: (r["checkpoint"], r["step"]) for name, r in records.items()} == {
        "valid": ("checkpoints/step-00000001", 1), "test": ("checkpoints/step-00000001", 1)}
    assert (run / "hyp-best-valid.txt").exists()


def test_eval_records_from_before_checkpoints_were_named_are_kept_with_their_files(corpus, tmp_path):
    run = make_translation_run(corpus, tmp_path / "r")
    evaluate_run(run, checkpoint="best", splits=["test"])
    legacy = json.loads((run / "eval-best.json").read_text())
    for key in ("checkpoint", "step"):
        del legacy["test"][key]
    (run / "eval-best.json").write_text(json.dumps(legacy))
    hypotheses = (run / "hyp-best-test.txt").read_bytes()  # e.g. the evidence a comparison grid scored
    evaluate_run(run, checkpoint="best", splits=["valid"])
    assert sorted(json.loads((run / "eval-best.json").read_text())) == ["test", "valid"]
    assert (run / "hyp-best-test.txt").read_bytes() == hypotheses
    # but an analysis does not take the kept record for current: it cannot say which weights it scored
    with pytest.raises(analyze.ConfigError, match="'test' record is from before records named their checkpoint"):
        analyze.run_score(run, metric="bleu", score_from="eval", split="test", checkpoint="best")
    assert analyze.run_score(run, metric="bleu", score_from="eval", split="valid", checkpoint="best")


def test_missing_hypotheses_say_how_to_make_them(corpus, tmp_path):
    run = make_translation_run(corpus, tmp_path / "r")
    with pytest.raises(analyze.ConfigError, match="sanlab evaluate --run .* --checkpoint best --split test"):
        analyze.length_buckets([run], out=tmp_path / "x")


def _sweep_run(corpus, run, *, size, bleus, parts=None):
    files = {"src": str(corpus / "train.src"), "tgt": str(corpus / "train.tgt")}
    parts = parts if parts is not None else [{"type": "window", "size": size}] if size else []
    model = {**SMALL, "encoder": {**SMALL["encoder"], "attention": {"heads": 4, "parts": parts}}}
    prepare_run_dir(run, validate({"task": "translation", "model": model, "data": {"train": files, "valid": files}},
                                  source="test"), overwrite=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"split": "valid", "step": 10 * (k + 1), "bleu": b}) + "\n"
                                               for k, b in enumerate(bleus)))
    return run


def test_sweep_over_window_size(corpus, tmp_path):
    runs = [_sweep_run(corpus, tmp_path / "w5", size=5, bleus=[1.0, 4.0, 2.0]),
            _sweep_run(corpus, tmp_path / "w3", size=3, bleus=[3.0]),
            _sweep_run(corpus, tmp_path / "w5b", size=5, bleus=[6.0])]
    base = _sweep_run(corpus, tmp_path / "base", size=None, bleus=[2.5])
    key = "model.encoder.attention.parts.0.size"
    rows = _check_outputs(analyze.sweep(runs, key=key, out=tmp_path / "sweep", baseline=base))
    assert rows[0] == ["run", key, "score", "from"]
    assert [r[:3] for r in rows[1:]] == [["w3", "3", "3.0"], ["w5", "5", "4.0"], ["w5b", "5", "6.0"],
                                         ["baseline base", "", "2.5"]]
    assert rows[2][3] == "valid bleu, step 20"
    assert A.sweep_means([A.SweepPoint("a", 5, 4.0), A.SweepPoint("b", 3, 3.0), A.SweepPoint("c", 5, 6.0)]) == \
        [(3, 3.0, 1), (5, 5.0, 2)]
    with pytest.raises(analyze.ConfigError, match="base/config.yaml: .*list of 0 items"):
        analyze.sweep([base], key=key, out=tmp_path / "bad")
    # M given as half_width (or left at its default) is not in `size`: named, and window_size places every run
    by_half_width = _sweep_run(corpus, tmp_path / "hw", size=None, bleus=[5.0],
                               parts=[{"type": "window", "half_width": 2}])
    with pytest.raises(analyze.ConfigError, match="hw/config.yaml: .*size is not set .*window_size"):
        analyze.sweep([by_half_width], key=key, out=tmp_path / "none")
    rows = _csv(analyze.sweep([runs[1], by_half_width], key="model.encoder.attention.parts.0.window_size",
                              out=tmp_path / "ws")["csv"])
    assert [r[:3] for r in rows[1:]] == [["w3", "3", "3.0"], ["hw", "5", "5.0"]]
    (runs[1] / "eval-best.json").write_text(json.dumps({"test": {"bleu": 12.5, "chrf": 40.0, "formatted": "x"}}))
    assert analyze.run_score(runs[1], metric=None, score_from="eval", split=None, checkpoint="best") == \
        (12.5, "eval-best.json test bleu")
    with pytest.raises(analyze.ConfigError, match="no 'ter' for split 'test' .*metrics: bleu, chrf"):
        analyze.run_score(runs[1], metric="ter", score_from="eval", split=None, checkpoint="best")
    with pytest.raises(analyze.ConfigError, match=r"no 'ChrF' for split 'test' .*metrics: bleu, chrf\); did you mean "
                                                  r"'chrf'\?"):
        analyze.run_score(runs[1], metric="ChrF", score_from="eval", split=None, checkpoint="best")


def test_curves_from_metrics_jsonl(corpus, tmp_path):
    a, b = _sweep_run(corpus, tmp_path / "a", size=3, bleus=[]), _sweep_run(corpus, tmp_path / "b", size=5, bleus=[])
    (a / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    (b / "metrics.jsonl").write_text(json.dumps({"split": "valid", "step": 3, "bleu": 7.0}) + "\n")
    rows = _check_outputs(analyze.curves([a, b], out=tmp_path / "curves"))
    assert rows == [["step", "a", "b"], ["2", "10.0", ""], ["3", "", "7.0"], ["4", "25.0", ""], ["6", "20.0", ""]]


def test_curves_of_a_path_that_is_not_a_run_say_so(tmp_path):
    with pytest.raises(analyze.ConfigError, match=r"nosuchrun: not a run directory \(no config.yaml\)"):
        analyze.curves([tmp_path / "nosuchrun"], out=tmp_path / "curves")


def test_curves_mean_over_the_seeds_of_comparison_cells(corpus, tmp_path):
    runs = [_sweep_run(corpus, tmp_path / "grid" / "csan" / f"seed-{seed}", size=3, bleus=bleus)
            for seed, bleus in ((0, [10.0, 20.0, 40.0]), (1, [14.0, 30.0]))]  # seed 1 stopped early
    rows = _check_outputs(analyze.curves(runs, out=tmp_path / "mean", mean_over_seeds=True))
    assert rows[0] == ["step", "csan (mean of 2)", "csan (mean of 2) sd"]  # the spread added after the means
    assert [float(v) for row in rows[1:] for v in row] == pytest.approx([10, 12.0, 8 ** 0.5, 20, 25.0, 50 ** 0.5])
    md = (tmp_path / "mean.md").read_text()
    assert "| step | csan (mean of 2) | csan (mean of 2) sd |" in md and "| 10 | 12.000 | 2.828 |" in md
    assert "every point of a line averages the n seeds its label names" in md and "±1 sample sd" in md


def test_curves_mean_over_seeds_draw_the_seeds_spread_as_a_band(corpus, tmp_path, monkeypatch):
    """The plot showed the mean alone: a variant whose seeds disagree looked as certain as one whose agree."""
    from sanlab.evaluation import plots

    drawn, lines = {}, plots.lines
    monkeypatch.setattr(plots, "lines", lambda path, **kw: drawn.update(kw) or lines(path, **kw))
    runs = [_sweep_run(corpus, tmp_path / "grid" / v / f"seed-{seed}", size=3, bleus=bleus)
            for v, seed, bleus in (("csan", 0, [10.0, 20.0]), ("csan", 1, [14.0, 30.0]), ("conv", 0, [5.0, 6.0]))]
    _check_outputs(analyze.curves(runs, out=tmp_path / "mean", mean_over_seeds=True))
    sd10, sd20 = 8 ** 0.5, 50 ** 0.5
    assert list(drawn["bands"]) == ["csan (mean of 2)"]  # one seed has no spread to draw
    xs, low, high = drawn["bands"]["csan (mean of 2)"]
    assert list(xs) == [10, 20]
    assert list(low) == pytest.approx([12 - sd10, 25 - sd20]) and list(high) == pytest.approx([12 + sd10, 25 + sd20])


def test_curves_mean_over_seeds_keep_a_run_that_is_no_cell_apart(corpus, tmp_path):
    """``runs/csan`` is no seed of the cells ``grid/csan/seed-N``: its labels (``csan``) equal their variant's name,
    but it must keep its own line, not be averaged into theirs."""
    alone = _sweep_run(corpus, tmp_path / "runs" / "csan", size=3, bleus=[100.0, 100.0])
    cells = [_sweep_run(corpus, tmp_path / "grid" / "csan" / f"seed-{seed}", size=3, bleus=bleus)
             for seed, bleus in ((0, [10.0, 20.0]), (1, [14.0, 30.0]))]
    rows = _check_outputs(analyze.curves([alone, *cells], out=tmp_path / "mean", mean_over_seeds=True))
    assert [row[:3] for row in rows] == [["step", "csan", "csan (mean of 2)"], ["10", "100.0", "12.0"],
                                         ["20", "100.0", "25.0"]]
    assert rows[0][3:] == ["csan (mean of 2) sd"]


def test_curves_of_a_metric_pattern_give_one_line_per_run_and_metric(corpus, tmp_path):
    """``--metric 'PATTERN'`` (the diagnostics records of learnable temperatures): every matching metric of
    every run is a line, seeds of one variant averaged per metric."""
    runs = [_sweep_run(corpus, tmp_path / "grid" / "temp" / f"seed-{seed}", size=3, bleus=[]) for seed in (0, 1)]
    for k, run in enumerate(runs):
        (run / "metrics.jsonl").write_text("".join(json.dumps(
            {"split": "diagnostics", "step": step, "l0/log_gamma_q_mean": k + step, "l0/log_gamma_k_mean": -step,
             "l0/other": 9.0}) + "\n" for step in (1, 2)))
    rows = _check_outputs(analyze.curves(runs, out=tmp_path / "diag", split="diagnostics", metric="*log_gamma_*"))
    assert rows[0] == ["step", "temp/seed-0: l0/log_gamma_k_mean", "temp/seed-0: l0/log_gamma_q_mean",
                       "temp/seed-1: l0/log_gamma_k_mean", "temp/seed-1: l0/log_gamma_q_mean"]
    assert rows[1:] == [["1", "-1.0", "1.0", "-1.0", "2.0"], ["2", "-2.0", "2.0", "-2.0", "3.0"]]
    mean = _check_outputs(analyze.curves(runs, out=tmp_path / "mean", split="diagnostics",
                                         metric="*log_gamma_q*", mean_over_seeds=True))
    assert [row[:2] for row in mean] == [["step", "temp (mean of 2)"], ["1", "1.5"], ["2", "2.5"]]  # named by run alone
    assert mean[0][2:] == ["temp (mean of 2) sd"]
    with pytest.raises(analyze.ConfigError, match="no 'diagnostics' metric matches '\\*nothing\\*'"):
        analyze.curves(runs, out=tmp_path / "none", split="diagnostics", metric="*nothing*")


def test_gates_of_a_muse_run(corpus, tmp_path):
    muse = {"type": "muse", "kernel_sizes": [3, 5]}
    model = {"encoder": {**SMALL["encoder"], "mixer": muse}, "decoder": {**SMALL["decoder"], "mixer": muse}}

    def set_first_gate(net):
        with torch.no_grad():
            net.encoder.layers[0].mixer.mixer.gate.copy_(torch.tensor([1.0, 0.0]))

    run = make_translation_run(corpus, tmp_path / "muse", model=model, setup=set_first_gate)
    rows = _check_outputs(analyze.gates(run, out=tmp_path / "gates"))
    assert rows[0] == ["stack", "layer", "k=3", "k=5", "small/large"]
    assert [r[:2] for r in rows[1:]] == [["encoder", "0"], ["encoder", "1"], ["decoder", "0"], ["decoder", "1"]]
    e = math.e
    assert [float(x) for x in rows[1][2:]] == pytest.approx([e / (e + 1), 1 / (e + 1), e], abs=1e-3)  # softmax([1, 0])
    assert [float(x) for x in rows[2][2:]] == pytest.approx([0.5, 0.5, 1.0])  # alpha = 1/n at initialisation


def _sharpen(net, factor: float = 8.0):
    """Scale the query projections so that an untrained model's attention is far from uniform: a wrong
    layer or head then gives clearly different values."""
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, Attention):
                m.q_proj.weight.mul_(factor)
                m.k_proj.weight.mul_(factor / 2)


def _hand_weights(attn, x, memory=None) -> np.ndarray:
    """softmax(q k^T / sqrt(d_h)) per head, [h, i, j], from the module's projections (one sentence, no mask)."""
    def heads(t):
        return t[0].view(t.shape[1], attn.heads, attn.head_dim).transpose(0, 1)
    q, k = heads(attn.q_proj(x)), heads(attn.k_proj(x if memory is None else memory))
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim), dim=-1).detach().numpy()


def _catch_inputs(module, seen: dict, name: str):
    """Store the first (x, memory) ``module`` is called with under ``seen[name]``; returns the hook handle."""
    def hook(module, args, kwargs, output):  # returns None, so the output is left as it is
        seen.setdefault(name, (args[0], kwargs.get("memory")))
    return module.register_forward_hook(hook, with_kwargs=True)


def _reference_maps(run, src: list[int], tgt: list[int]) -> dict[str, np.ndarray]:
    """The inputs of encoder layer 1's self-attention and decoder layer 0's cross-attention, caught by hooks
    on a plain forward pass, turned into attention weights by hand."""
    from sanlab.runs import load_trained

    _, model, _ = load_trained(run)
    enc_attn = next(m for m in model.encoder.layers[1].modules() if isinstance(m, Attention))
    cross_attn = model.decoder.layers[0].cross_attention
    seen = {}
    hooks = [_catch_inputs(module, seen, name) for name, module in (("encoder", enc_attn), ("cross", cross_attn))]
    with torch.no_grad():
        memory, memory_valid = model.encode(torch.tensor([src]))
        model.decode(torch.tensor([tgt]), memory=memory, memory_valid=memory_valid)
        for h in hooks:
            h.remove()
        return {"encoder": _hand_weights(enc_attn, seen["encoder"][0]),
                "cross": _hand_weights(cross_attn, *seen["cross"])}


def test_attention_map_plain_and_cross(corpus, tmp_path, monkeypatch):
    run = make_translation_run(corpus, tmp_path / "base", setup=_sharpen)
    from sanlab.data.subword import SubwordModel

    spm = SubwordModel.load(run / "subword.model")
    sentence, target = "the dog sleeps .", "der hund schlaeft ."
    pieces = [spm.id_to_piece(t) for t in spm.encode(sentence)] + ["</s>"]
    expected = _reference_maps(run, spm.encode(sentence) + [spm.eos_id], [spm.bos_id] + spm.encode(target))
    rows = _check_outputs(analyze.attention_map(run, out=tmp_path / "enc", sentence=sentence, layer=1, head=2))
    assert rows[0] == ["query", *pieces] and [r[0] for r in rows[1:]] == pieces
    values = np.array([[float(x) for x in r[1:]] for r in rows[1:]])
    assert values == pytest.approx(expected["encoder"][2], abs=6e-4)  # the CSV keeps 3 decimals
    assert np.abs(expected["encoder"][2] - expected["encoder"][0]).max() > 0.05  # so another head would fail
    rows = _check_outputs(analyze.attention_map(run, out=tmp_path / "cross", sentence=sentence, side="cross",
                                                target=target, head=None))
    assert rows[0][1:] == pieces and [r[0] for r in rows[1:]] == ["<s>", *spm.encode_pieces(target)]
    values = np.array([[float(x) for x in r[1:]] for r in rows[1:]])
    assert values == pytest.approx(expected["cross"].mean(axis=0), abs=6e-4)  # head None: the mean over heads
    assert np.abs(expected["cross"].mean(axis=0) - expected["cross"][0]).max() > 0.05  # one head would not match
    with pytest.raises(analyze.ConfigError, match="layer 5 does not exist: the decoder has 2 layers"):
        analyze.attention_map(run, out=tmp_path / "x", sentence=sentence, side="decoder", layer=5, target=target)
    # without a target the model's own subwords are teacher-forced, not its text encoded again: a search that
    # spells a word of the vocabulary letter by letter (which the subword model encodes as one piece) is shown so
    from sanlab.decoding.search import Hypothesis
    from sanlab.tasks import translation

    word = next(p for p in map(spm.id_to_piece, range(spm.vocab_size)) if p.startswith("▁") and len(p) >= 3)
    letters = ["▁", *word[1:]]
    spelled = [spm.piece_to_id(p) for p in letters]
    assert spm.unk_id not in spelled and spm.encode(spm.decode(spelled)) != spelled
    monkeypatch.setattr(translation, "search_translations",
                        lambda *a, **k: [[Hypothesis(spelled, -1.0, -1.0, [-0.2] * (len(spelled) + 1))]])
    rows = _check_outputs(analyze.attention_map(run, out=tmp_path / "own", sentence=sentence, side="decoder"))
    assert [r[0] for r in rows[1:]] == ["<s>", *letters]
    limit = load_run_config(run).model.max_positions
    for side, long_sentence, long_target in (("encoder", "dog " * limit, None), ("cross", sentence, "hund " * limit)):
        with pytest.raises(analyze.ConfigError, match=rf"subword tokens \(with BOS/EOS\), more than the model "
                                                      rf"accepts \(model.max_positions = {limit}\)"):
            analyze.attention_map(run, out=tmp_path / "x", sentence=long_sentence, side=side, target=long_target)


def _tensors(trace: dict) -> list[torch.Tensor]:
    return [t for t in trace.values() if isinstance(t, torch.Tensor)]


def test_attention_traces_put_their_inputs_on_the_models_device(corpus, tmp_path):
    """The device guard of ``analyze attention`` (tests/test_device_guard.py): the model on the CPU, new tensors
    on ``meta`` by default, so an input made without ``device=`` fails; the trace comes back on the CPU (where
    the analysis reads it with numpy) whatever device the model ran on."""
    from sanlab.runs import load_trained
    from sanlab.tasks.base import task_for

    run = make_translation_run(corpus, tmp_path / "base")
    config, model, spm = load_trained(run, device="cpu")
    with torch.device("meta"):
        # a given target: without one the model translates first, whose batches are built on the CPU by design
        # (data/batching.py) and moved once, which this guard cannot tell from a bug
        for side in ("encoder", "decoder", "cross"):
            found = task_for(config).attention_trace(model, spm, config, sentence="the dog sleeps .", side=side,
                                                     layer=1, target="der hund schlaeft .")
            assert _tensors(found.trace) and all(t.device.type == "cpu" for t in _tensors(found.trace))


def test_attention_map_of_2d_csan_shows_head_blocks(corpus, tmp_path):
    parts = [{"type": "csan2d", "size": 3, "heads_area": 3, "layers": [0]}]
    run = make_translation_run(corpus, tmp_path / "csan2d",
                               model={"encoder": {**SMALL["encoder"], "attention": {"heads": 4, "parts": parts}}})
    paths = analyze.attention_map(run, out=tmp_path / "csan2d-map", sentence="the big cat sees a bird .", head=1)
    rows = _check_outputs(paths)
    j = len(rows) - 1  # queries = keys = source pieces + </s>
    assert len(rows[0]) == 1 + 3 * j and [c.split(":")[0] for c in rows[0][1::j]] == ["-1", "+0", "+1"]
    w = np.array([[float(x) for x in r[1:]] for r in rows[1:]]).reshape(j, 3, j)  # [i, n, j]
    assert w.sum(axis=(1, 2)) == pytest.approx(np.ones(j))  # one joint softmax over the N x M area
    far = np.abs(np.arange(j)[:, None] - np.arange(j)[None, :]) > 1  # outside the window M = 3
    assert np.all(w.transpose(1, 0, 2)[:, far] == 0)


def test_attention_map_of_a_tagger(tmp_path, monkeypatch):
    from sanlab.data.conllu_io import TaggedSentence
    from sanlab.tasks.tagging import VOCAB_FILE, TaggingVocab, load_tagging_model

    raw = {"task": "tagging", "data": {"train": "t.conllu", "dev": "d.conllu"},
           "model": {"word_dim": 8, "char_dim": 4, "char_filters": 4, "char_layers": 1, "max_len": 6,
                     "encoder": {"layers": 2, "ffn_dim": 0, "attention": {"heads": 2, "bias": False,
                                                                          "out_proj": False}}}}
    config = validate(raw, source="test")
    run = tmp_path / "tagger"
    prepare_run_dir(run, config, overwrite=True)
    train = [TaggedSentence(("dogs", "bark"), ("NOUN", "VERB"))]
    TaggingVocab.build(train, train, fraction=1.0, max_size=None).save(run / VOCAB_FILE)
    net, _ = load_tagging_model(config, run)
    _sharpen(net, 30.0)  # its word vectors are small
    CheckpointManager(run, keep_best=1, keep_last=1, higher_is_better=True).save(model=net, state={},
                                                                                 meta={"step": 1, "score": 0.0})
    import sanlab.runs

    real_load, inputs = sanlab.runs.load_trained, {}

    def load_and_watch_layer_1(*args, **kwargs):  # the model analyze loads, with a hook on layer 1's attention
        config, model, assets = real_load(*args, **kwargs)
        inputs["attention"] = [m for m in model.modules() if isinstance(m, Attention)][1]
        _catch_inputs(inputs["attention"], inputs, "x")
        return config, model, assets

    monkeypatch.setattr(sanlab.runs, "load_trained", load_and_watch_layer_1)
    rows = _check_outputs(analyze.attention_map(run, out=tmp_path / "tag", sentence="dogs bark loudly", layer=1))
    assert rows[0] == ["query", "dogs", "bark", "loudly"] and len(rows) == 4
    expected, other_head = _hand_weights(inputs["attention"], inputs["x"][0])  # head 0 is the default
    assert np.abs(expected - other_head).max() > 0.05  # sharp enough that the other head would not match
    assert np.array([[float(x) for x in r[1:]] for r in rows[1:]]) == pytest.approx(expected, abs=6e-4)
    with pytest.raises(analyze.ConfigError, match="has 7 words; the tagger takes 1 to 6"):
        analyze.attention_map(run, out=tmp_path / "x", sentence="a b c d e f g")


def test_attention_map_of_a_tagger_takes_the_words_sanlab_tag_takes():
    """A word holding a no-break space ("10\u00a0000", as some treebanks write numbers) is one word to
    `sanlab tag`; the attention map of the same line must show that word, not two."""
    from sanlab.data.conllu_io import TaggedSentence
    from sanlab.models.builders import build_tagger
    from sanlab.tasks.tagging import TaggingVocab
    from sanlab.tasks.traces import tagging_trace

    config = validate({"task": "tagging", "data": {"train": "t.conllu", "dev": "d.conllu"},
                       "model": {"word_dim": 8, "char_dim": 4, "char_filters": 4, "char_layers": 1, "max_len": 6,
                                 "encoder": {"layers": 1, "ffn_dim": 0,
                                             "attention": {"heads": 2, "bias": False, "out_proj": False}}}},
                      source="test")
    train = [TaggedSentence(("10\u00a0000", "dogs"), ("NUM", "NOUN"))]
    vocab = TaggingVocab.build(train, train, fraction=1.0, max_size=None)
    model = build_tagger(config.model, vocab_size=len(vocab.words), num_chars=len(vocab.chars),
                         num_tags=len(vocab.tags))
    trace = tagging_trace(model, vocab, config, sentence="10\u00a0000 dogs\tbark", layer=0)
    assert trace.queries == trace.keys == ["10\u00a0000", "dogs", "bark"]


def test_command_line(tmp_path, capsys, monkeypatch):
    parser = argparse.ArgumentParser(prog="sanlab")
    analyze_cli.register(parser.add_subparsers(dest="command", required=True))
    for name in ("ngram-gap", "length-buckets", "pairwise", "sweep", "gates", "curves", "attention"):
        with pytest.raises(SystemExit):
            parser.parse_args(["analyze", name, "--help"])
        assert f"usage: sanlab analyze {name}" in capsys.readouterr().out
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("task: tagging\n")
    (run / "metrics.jsonl").write_text(json.dumps({"split": "valid", "step": 1, "accuracy": 50.0}) + "\n")
    monkeypatch.delenv("SANLAB_COMMAND", raising=False)
    argv = ["analyze", "curves", str(run), "--out", str(tmp_path / "c")]
    monkeypatch.setattr(sys, "argv", ["sanlab", *argv])
    args = parser.parse_args(argv)
    assert args.fn(args) == 0
    assert "| 1 | 50.000 |" in capsys.readouterr().out
    assert f"Command: `sanlab analyze curves {run} --out {tmp_path / 'c'}` (" in (tmp_path / "c.md").read_text()
    from sanlab.cli import main

    monkeypatch.setattr(sys, "argv", ["host-script.py"])  # through main(), the footer is main's own command
    assert main(["analyze", "curves", str(run), "--out", str(tmp_path / "m")]) == 0
    assert f"Command: `sanlab analyze curves {run} --out {tmp_path / 'm'}` (" in (tmp_path / "m.md").read_text()
    assert args.fn(parser.parse_args(["analyze", "curves", str(run), "--out", str(tmp_path / "new" / "dir" / "c")])) == 0
    assert (tmp_path / "new" / "dir" / "c.png").is_file()  # missing directories are created
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # mkdir could not replace it
    for out, message in ((run / "config.yaml" / "sub" / "c", f"{run / 'config.yaml'} is not a directory, so the"),
                         (tmp_path / "dangling" / "c", f"{tmp_path / 'dangling'} is not a directory, so the"),
                         ("~/figures/c", "'~/figures/c' starts with '~', which the shell did not expand")):
        with pytest.raises(SystemExit):  # checked before any run is read
            parser.parse_args(["analyze", "curves", str(run), "--out", str(out)])
        assert f"argument --out: {message}" in capsys.readouterr().err
    for argv, message in ((["curves", str(run), "--out", f"{tmp_path}/"], "names no file"),
                          (["ngram-gap", str(run), "--baseline", str(run), "--out", "x", "--tokenize", "foo"],
                           "unknown sacreBLEU tokenizer 'foo'; choose one of none, zh, 13a")):
        with pytest.raises(SystemExit):
            parser.parse_args(["analyze", *argv])
        assert message in capsys.readouterr().err
    args = parser.parse_args(["analyze", "length-buckets", str(run), "--out", "x", "--buckets", "10,20"])
    assert args.buckets == (10, 20)
    seen = {}

    def fake_length_buckets(runs, **kwargs):  # the options reach the analysis
        seen.update(kwargs, runs=runs)
        (tmp_path / "lb.md").write_text("# t\n")
        return {"md": tmp_path / "lb.md"}

    monkeypatch.setattr(analyze, "length_buckets", fake_length_buckets)
    args = parser.parse_args(["analyze", "length-buckets", str(run), "--out", "x", "--baseline", "b",
                              "--bootstrap-samples", "10", "--bootstrap-seed", "3"])
    assert args.fn(args) == 0
    assert (seen["runs"], seen["baseline"], seen["bootstrap_samples"], seen["bootstrap_seed"]) == ([str(run)], "b", 10, 3)
    monkeypatch.setattr(analyze, "pairwise", fake_length_buckets)
    seen.clear()
    args = parser.parse_args(["analyze", "pairwise", str(run), "--against", "b1", "b2", "--out", "x",
                              "--bootstrap-samples", "20", "--bootstrap-seed", "4", "--split", "valid",
                              "--checkpoint", "last", "--references", "r.de", "--tokenize", "intl"])
    assert args.fn(args) == 0
    assert seen == {"runs": [str(run)], "against": ["b1", "b2"], "out": "x", "split": "valid", "checkpoint": "last",
                    "references": "r.de", "tokenize": "intl", "bootstrap_samples": 20, "bootstrap_seed": 4}
    # --against given once per baseline run, as --only is in `sanlab compare`: every one counts, not the last
    args = parser.parse_args(["analyze", "pairwise", str(run), "--against", "b1", "--against", "b2", "b3", "--out", "x"])
    assert args.against == ["b1", "b2", "b3"]


def test_runs_scored_against_other_references_are_refused_unless_references_are_given(corpus, tmp_path):
    """Runs whose configs point the split at other references (with as many lines) cannot be compared sentence
    by sentence: refused, naming both files. A copy of the same file elsewhere is the same test set."""
    from sanlab.errors import ConfigError

    base, other = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "other")
    for run in (base, other):
        (run / "hyp-best-test.txt").write_text(f"{BASE_HYP}\n{REF}\n{REF}\n")

    def point_test_at(target):
        config = (other / "config.yaml").read_text()
        (other / "config.yaml").write_text(config.replace(str(corpus / "test.tgt"), str(target)))

    copy = tmp_path / "copy.tgt"
    copy.write_bytes((corpus / "test.tgt").read_bytes())
    point_test_at(copy)
    analyze.ngram_gap([other], baseline=base, out=tmp_path / "same")  # the same bytes: one test set
    elsewhere = tmp_path / "elsewhere.tgt"
    elsewhere.write_text("a b c\nd e f\ng h i\n")  # three lines, like the first run's references
    (other / "config.yaml").write_text((other / "config.yaml").read_text().replace(str(copy), str(elsewhere)))
    with pytest.raises(ConfigError, match=rf"{other}: its 'test' references are {elsewhere}, .*'s are "
                                          rf"{corpus / 'test.tgt'}"):
        analyze.ngram_gap([other], baseline=base, out=tmp_path / "gap")
    refs = tmp_path / "refs.txt"
    refs.write_text(f"{REF}\n{REF}\n{REF}\n")
    analyze.ngram_gap([other], baseline=base, out=tmp_path / "given", references=refs)  # one set for all


def test_ngram_gap_with_its_own_references_needs_no_test_files_of_the_config(corpus, tmp_path):
    base, csan = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "csan")
    for run, first in ((base, BASE_HYP), (csan, REF)):
        (run / "hyp-best-test.txt").write_text(f"{first}\n{REF}\n")
    refs = tmp_path / "other-refs.txt"
    refs.write_text(f"{REF}\n{REF}\n")  # another test set of 2 lines; the config's test files have 3
    rows = _csv(analyze.ngram_gap([csan], baseline=base, out=tmp_path / "gap", references=refs)["csv"])
    assert [r[0] for r in rows[1:]] == ["base"] * 4 + ["csan"] * 4


def test_an_empty_references_file_is_named_by_every_analysis(corpus, tmp_path):
    from sanlab.errors import DataError

    base, csan = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "csan")
    refs = tmp_path / "empty.txt"
    refs.write_text("")
    for analysis in (lambda: analyze.ngram_gap([csan], baseline=base, out=tmp_path / "gap", references=refs),
                     lambda: analyze.pairwise([csan], against=[base], out=tmp_path / "pw", references=refs)):
        with pytest.raises(DataError, match=f"{refs}: no reference sentences"):
            analysis()


def test_hypotheses_sources_and_references_of_other_line_counts_name_both_files(corpus, tmp_path):
    """A --references (or --sources) file with another line count than what it is paired with: the error names
    both files, since either may be the wrong one."""
    from sanlab.errors import DataError

    base = make_translation_run(corpus, tmp_path / "base")
    (base / "hyp-best-test.txt").write_text(f"{BASE_HYP}\n{REF}\n{REF}\n")
    refs, sources = tmp_path / "two.tgt", tmp_path / "one.src"
    refs.write_text(f"{REF}\n{REF}\n")
    sources.write_text("the dog sleeps .\n")
    with pytest.raises(DataError, match=rf"{base / 'hyp-best-test.txt'}: 3 hypotheses for the 2 references of "
                                        rf"{refs} \(is it the same test set\?\)"):
        analyze.ngram_gap([base], baseline=base, out=tmp_path / "gap", references=refs)
    with pytest.raises(DataError, match=rf"{sources}: 1 sources but 2 references in {refs}"):
        analyze.length_buckets([base], out=tmp_path / "lb", sources=sources, references=refs)
    with pytest.raises(DataError, match=rf"{sources}: 1 sources but 3 references in {corpus / 'test.tgt'}"):
        analyze.length_buckets([base], out=tmp_path / "lb", sources=sources)


def test_runs_decoded_with_different_searches_are_refused(corpus, tmp_path):
    """A beam-2 run against a greedy one: part of the difference is the search's, which the tests would credit
    to the model. Each record says how its hypotheses were decoded; runs decoded alike are compared."""
    from sanlab.errors import ConfigError

    base, other = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "other")
    evaluate_run(base, checkpoint="best", splits=["test"])  # the config's beam 1
    evaluate_run(other, checkpoint="best", splits=["test"], decode_overrides={"beam": 2})
    with pytest.raises(ConfigError, match=r"decoded with different search settings \(base: beam 1, length_penalty "
                                          r"1.0, max_len_a 1.2, max_len_b 4; other: beam 2, "):
        analyze.pairwise([other], against=[base], out=tmp_path / "pw", bootstrap_samples=10)
    evaluate_run(other, checkpoint="best", splits=["test"], decode_overrides={"beam": 1})
    analyze.pairwise([other], against=[base], out=tmp_path / "pw", bootstrap_samples=10)


def test_runs_decoded_with_another_length_penalty_form_are_refused(corpus, tmp_path):
    """GNMT's form of the length penalty against fairseq's is another search; a record from before
    decode.length_penalty_style existed was decoded with fairseq's, and compares with the default."""
    from sanlab.errors import ConfigError

    base, other = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "other")
    evaluate_run(base, checkpoint="best", splits=["test"], decode_overrides={"beam": 2})
    evaluate_run(other, checkpoint="best", splits=["test"],
                 decode_overrides={"beam": 2, "length_penalty_style": "gnmt"})
    with pytest.raises(ConfigError, match=r"decoded with different search settings \(base: beam 2, length_penalty "
                                          r"1.0, max_len_a 1.2, max_len_b 4; other: beam 2, length_penalty 1.0, "
                                          r"length_penalty_style gnmt, max_len_a 1.2, max_len_b 4\)"):
        analyze.pairwise([other], against=[base], out=tmp_path / "pw", bootstrap_samples=10)
    evaluate_run(other, checkpoint="best", splits=["test"], decode_overrides={"beam": 2})
    record = json.loads((other / "eval-best.json").read_text(encoding="utf-8"))
    assert record["test"]["decode"].pop("length_penalty_style") == "fairseq"  # as written before the key
    (other / "eval-best.json").write_text(json.dumps(record), encoding="utf-8")
    analyze.pairwise([other], against=[base], out=tmp_path / "pw", bootstrap_samples=10)


# ----------------------------------------------------------------------------- audit fixes (session 57)
def test_sweep_from_eval_takes_one_split_for_every_run(corpus, tmp_path):
    """Without --split, the first run's first split: a run that evaluated another split first (its file's
    first record) is scored on the same split, not on its own first."""
    a, b = (_sweep_run(corpus, tmp_path / name, size=size, bleus=[1.0]) for name, size in (("a", 3), ("b", 5)))
    (a / "eval-best.json").write_text(json.dumps({"valid": {"bleu": 30.0}, "test": {"bleu": 20.0}}))
    (b / "eval-best.json").write_text(json.dumps({"test": {"bleu": 21.0}, "valid": {"bleu": 31.0}}))
    rows = _csv(analyze.sweep([a, b], key="model.encoder.attention.parts.0.size", out=tmp_path / "s",
                              score_from="eval")["csv"])
    assert [r[2:] for r in rows[1:]] == [["30.0", "eval-best.json valid bleu"], ["31.0", "eval-best.json valid bleu"]]


@pytest.mark.parametrize("analysis", ["ngram_gap", "length_buckets", "pairwise"])
def test_an_analysis_of_hypotheses_on_a_tagging_run_names_the_command_as_typed(tmp_path, analysis):
    """Not `sanlab bleu-analysis`, which is the task's name for the ability, not a command anyone can run."""
    run = tmp_path / "tagger"
    prepare_run_dir(run, validate({"task": "tagging", "data": {"train": "a", "dev": "b", "test": "c"}}, source="t"),
                    overwrite=True)
    with pytest.raises(analyze.ConfigError) as err:
        if analysis == "pairwise":
            analyze.pairwise([run], against=[run], out=tmp_path / "x")
        else:
            getattr(analyze, analysis)([run], baseline=run, out=tmp_path / "x")
    assert str(err.value) == (f"{run} is a tagging run; `sanlab analyze ngram-gap / length-buckets / pairwise` "
                              "needs a translation run")


def test_sweep_refuses_runs_scored_on_other_sentences(corpus, tmp_path):
    """A sweep's points share one line and one mean, so every run (and the baseline) must be scored on the same
    split data, as the BLEU analyses require: a run validated, or tested, on another file is named. A copy of the
    same file elsewhere is the same data."""
    key = "model.encoder.attention.parts.0.size"
    other = tmp_path / "other.tgt"
    other.write_text("".join(line[::-1] + "\n" for line in (corpus / "train.tgt").read_text().splitlines()))
    copy = tmp_path / "copy.tgt"
    copy.write_bytes((corpus / "train.tgt").read_bytes())

    def run(name, size, valid_tgt, test_tgt):
        train = {"src": str(corpus / "train.src"), "tgt": str(corpus / "train.tgt")}
        model = {**SMALL, "encoder": {**SMALL["encoder"], "attention": {"heads": 4, "parts": [
            {"type": "window", "size": size}]}}}
        data = {"train": train, "valid": {**train, "tgt": str(valid_tgt)},
                "test": {"test": {"src": str(corpus / "test.src"), "tgt": str(test_tgt)}}}
        prepare_run_dir(tmp_path / name, validate({"task": "translation", "model": model, "data": data},
                                                  source="test"), overwrite=True)
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"split": "valid", "step": 10, "bleu": 1.0}) + "\n")
        (tmp_path / name / "eval-best.json").write_text(json.dumps({"test": {"bleu": 2.0}}))
        return tmp_path / name

    same = corpus / "train.tgt"
    a = run("a", 3, same, corpus / "test.tgt")
    b = run("b", 5, copy, corpus / "test.tgt")      # the same sentences under another name
    c = run("c", 7, other, corpus / "test.tgt")     # validated on other sentences
    d = run("d", 7, same, other)                    # tested on other sentences
    assert load_run_config(c).data.valid.tgt == str(other) and load_run_config(d).data.test["test"].tgt == str(other)
    assert len(_csv(analyze.sweep([a, b], key=key, out=tmp_path / "ok")["csv"])) == 3
    with pytest.raises(analyze.ConfigError,
                       match=r"c: its 'valid' data are not the first run's \(\S*other\.tgt where \S*/a has \S*train\.tgt\)"):
        analyze.sweep([a, b, c], key=key, out=tmp_path / "s1")
    with pytest.raises(analyze.ConfigError, match=r"c: its 'valid' data"):
        analyze.sweep([a, b], key=key, out=tmp_path / "s2", baseline=c)
    assert len(_csv(analyze.sweep([a, d], key=key, out=tmp_path / "s3")["csv"])) == 3  # valid scores: same dev set
    with pytest.raises(analyze.ConfigError, match=r"d: its 'test' data .*other\.tgt"):
        analyze.sweep([a, d], key=key, out=tmp_path / "s4", score_from="eval")
    assert not (tmp_path / "s1.md").exists() and not (tmp_path / "s4.md").exists()


@pytest.mark.parametrize("text, said", [
    ('{"test": {"bleu": 1.0', "eval-best.json: not valid JSON .*sanlab evaluate --run .* --checkpoint best` again"),
    ("{}", "eval-best.json: no split scored in it"),
    ('{"test": 5}', r"eval-best.json: no 'bleu' for split 'test' \(splits: test; metrics: none\)"),
    ('{"test": {"bleu": true}}', "eval-best.json: no 'bleu' for split 'test'"),
    ("[1, 2]", "eval-best.json: expected a JSON object, found list")])
def test_a_damaged_eval_record_is_named(corpus, tmp_path, text, said):
    run = _sweep_run(corpus, tmp_path / "a", size=3, bleus=[1.0])
    (run / "eval-best.json").write_text(text)
    with pytest.raises(analyze.ConfigError, match=said):
        analyze.run_score(run, metric="bleu", score_from="eval", split=None, checkpoint="best")


def test_a_run_named_twice_counts_once(corpus, tmp_path):
    a, b = (_sweep_run(corpus, tmp_path / name, size=15, bleus=[score]) for name, score in (("a", 4.0), ("b", 6.0)))
    key = "model.encoder.attention.parts.0.size"
    rows = _csv(analyze.sweep([a, b, f"{a}/"], key=key, out=tmp_path / "s")["csv"])
    assert [r[:3] for r in rows[1:]] == [["a", "15", "4.0"], ["b", "15", "6.0"]]   # short labels, a once
    assert "| b | 15 | 6.00 |" in (tmp_path / "s.md").read_text()
    assert _csv(analyze.curves([a, tmp_path / "." / "a", b], out=tmp_path / "c")["csv"])[0] == ["step", "a", "b"]


def test_small_values_keep_significant_digits_in_the_markdown():
    """A learning rate swept over 5e-4 .. 1e-3 is not 0.00 (nor 0.001 three times) in what the command prints;
    the CSV keeps full precision as before."""
    points = [A.SweepPoint(f"lr{v}", v, 20.0 + k) for k, v in enumerate((5e-4, 7e-4, 1e-3, 0.0125))]
    markdown = A.sweep_table(points, key="train.lr").markdown()
    assert [line.split(" | ")[1] for line in markdown.splitlines()[2:]] == ["0.0005", "0.0007", "0.001", "0.0125"]
    curves = A.curves_table({"a": [(1, 5e-4), (2, 0.25)], "b": [(1, 7e-4), (2, 0.0)]}).markdown()
    assert "| 1 | 0.0005 | 0.0007 |" in curves and "| 2 | 0.250 | 0.000 |" in curves
    # a value that shows two digits once rounded keeps the column's decimals: 0.10, not 0.098 beside 0.10
    deltas = A.curves_table({"a": [(1, 0.098), (2, -0.011), (3, 0.1)]}).markdown()
    assert "| 1 | 0.098 |" in deltas  # (three decimals here: 0.098 shows two digits, as it is)
    assert [A.Table(("d",), ((v,),)).markdown().splitlines()[2] for v in (0.098, -0.011, 0.1, 0.004)] == \
        ["| 0.10 |", "| -0.011 |", "| 0.10 |", "| 0.004 |"]


def test_learning_curves_name_a_record_without_a_number_and_skip_nan_for_the_best():
    records = [{"split": "valid", "step": 1, "bleu": float("nan")}, {"split": "valid", "step": 2, "bleu": 3.0},
               {"split": "valid", "step": 3, "bleu": 2.0}]
    assert A.best_validation(records, metric="bleu") == (2, 3.0)   # a leading NaN does not win
    with pytest.raises(ValueError, match="no 'valid' record has a finite bleu"):
        A.best_validation(records[:1], metric="bleu")
    with pytest.raises(ValueError, match="the 'valid' record of step 2 has bleu = None, not a number"):
        A.learning_curve([{"split": "valid", "step": 2, "bleu": None}], metric="bleu")
    with pytest.raises(ValueError, match="a 'valid' record has no step"):
        A.learning_curve([{"split": "valid", "bleu": 1.0}], metric="bleu")


def test_gates_of_repeated_kernel_sizes_are_summed():
    rows = A.gate_rows({"encoder.layers.0.mixer.mixer": [0.2, 0.5, 0.3]}, {"encoder.layers.0.mixer.mixer": [3, 3, 15]})
    table = A.gate_table(rows)
    assert table.columns == ("stack", "layer", "k=3", "k=15", "small/large")
    assert table.rows[0][2:] == pytest.approx((0.7, 0.3, 0.7 / 0.3))


def test_the_scores_stage_of_a_convolution_says_why_it_is_missing():
    with pytest.raises(KeyError, match="computes no pre-softmax scores"):
        A.trace_stage({"weights": np.zeros((1, 1, 2, 2))}, "scores")
    with pytest.raises(KeyError, match="exists only when the layer has post-softmax parts"):
        A.trace_stage({"weights": np.zeros((1, 1, 2, 2))}, "weights_final")


def test_ngram_gap_and_pairwise_need_no_source_file(corpus, tmp_path):
    base, csan = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "csan")
    for run, first in ((base, BASE_HYP), (csan, REF)):
        (run / "hyp-best-test.txt").write_text(f"{first}\n{REF}\n{REF}\n")
    for run in (base, csan):   # the split's source file is gone: the references are all these analyses read
        text = (run / "config.yaml").read_text()
        (run / "config.yaml").write_text(text.replace(str(corpus / "test.src"), str(tmp_path / "gone.src")))
    assert [r[0] for r in _csv(analyze.ngram_gap([csan], baseline=base, out=tmp_path / "gap")["csv"])[1:]] == \
        ["base"] * 4 + ["csan"] * 4
    analyze.pairwise([csan], against=[base], out=tmp_path / "pw", bootstrap_samples=20)


def test_a_split_one_run_lacks_names_that_run(corpus, tmp_path):
    base, other = make_translation_run(corpus, tmp_path / "base"), make_translation_run(corpus, tmp_path / "other")
    text = (base / "config.yaml").read_text()
    assert "    test:\n" in text
    (base / "config.yaml").write_text(text.replace("    test:\n", "    flickr:\n", 1))
    with pytest.raises(analyze.ConfigError, match=rf"unknown split 'flickr'; {other / 'config.yaml'} has: test, valid"):
        analyze.ngram_gap([other], baseline=base, out=tmp_path / "gap", split="flickr")


def test_an_evaluation_that_fails_part_way_leaves_every_split_as_its_record_says(corpus, tmp_path):
    """A split whose references do not pair with its sources fails before any split is decoded, so the earlier
    hypotheses stay those the record scored; a hypotheses file replaced behind its record's back is refused."""
    run = make_translation_run(corpus, tmp_path / "run")
    evaluate_run(run, checkpoint="best", splits=["test"])
    hyp = run / "hyp-best-test.txt"
    before = hyp.read_bytes()
    short = tmp_path / "short.tgt"
    short.write_text(f"{REF}\n")
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace(
        "    test:\n", f"    bad:\n      src: {corpus / 'test.src'}\n      tgt: {short}\n    test:\n", 1))
    from sanlab.errors import DataError

    with pytest.raises(DataError, match="line counts differ"):
        evaluate_run(run, checkpoint="best", splits=["test", "bad"], decode_overrides={"beam": 2})
    assert hyp.read_bytes() == before
    analyze.ngram_gap([run], baseline=run, out=tmp_path / "gap", split="test")
    hyp.write_text(f"{REF}\n{REF}\n{REF}\n")   # as many lines, other text
    with pytest.raises(analyze.ConfigError, match="is not the file eval-best.json scored"):
        analyze.ngram_gap([run], baseline=run, out=tmp_path / "gap", split="test")
