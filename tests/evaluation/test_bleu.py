"""BLEU / chrF wrappers: values derived by hand or from sacreBLEU's own objects."""

from __future__ import annotations

import math

import pytest
from sacrebleu.metrics import BLEU

from sanlab.evaluation.bleu import bleu_by_length, corpus_scores, ngram_precisions

# Hand case: hyp "a b c d e" vs ref "a b c d f" (13a leaves single letters alone).
#   1-grams: a b c d e -> 4 of 5 match;  2-grams: ab bc cd de -> 3 of 4 (de is not in the ref)
#   3-grams: abc bcd cde -> 2 of 3;      4-grams: abcd bcde -> 1 of 2
#   equal lengths -> BP = 1;  BLEU = 100 * (4/5 * 3/4 * 2/3 * 1/2) ** (1/4) = 100 * 0.2 ** 0.25
HYP, REF = "a b c d e", "a b c d f"
HAND_BLEU = 100 * 0.2**0.25


def test_identical_text_scores_100_with_standard_signature():
    text = ["The cat sat on the mat .", "A dog barked ."]
    scores = corpus_scores(text, text)
    assert scores.bleu == pytest.approx(100.0)
    assert scores.chrf == pytest.approx(100.0)
    assert "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in scores.bleu_signature
    assert scores.bp == 1.0 and scores.sys_len == scores.ref_len


def test_hand_computed_bleu_and_precisions():
    scores = corpus_scores([HYP], [REF])
    assert scores.bleu == pytest.approx(HAND_BLEU)
    assert scores.precisions == pytest.approx((80.0, 75.0, 200 / 3, 50.0))
    assert scores.counts == (4, 3, 2, 1) and scores.totals == (5, 4, 3, 2)
    assert (scores.sys_len, scores.ref_len, scores.bp) == (5, 5, 1.0)


def test_brevity_penalty_by_hand():
    # hyp 4 tokens, ref 6 tokens, all hyp n-grams match: BLEU = exp(1 - 6/4) * 100
    scores = corpus_scores(["a b c d"], ["a b c d e f"])
    assert scores.bp == pytest.approx(math.exp(-0.5))
    assert scores.bleu == pytest.approx(100 * math.exp(-0.5))


def test_multiple_reference_streams():
    # the second reference equals the hypothesis, so BLEU is 100 whatever the first says
    scores = corpus_scores([HYP], [[REF], [HYP]])
    assert scores.bleu == pytest.approx(100.0)
    assert "nrefs:2" in scores.bleu_signature


def test_format_matches_sacrebleu_one_liner():
    scores = corpus_scores([HYP, "x y z"], [REF, "x y w"])
    metric = BLEU(tokenize="13a")
    expected = metric.corpus_score([HYP, "x y z"], [[REF, "x y w"]]).format(signature=str(metric.get_signature()))
    bleu_line, chrf_line = scores.format().split("\n")
    assert bleu_line == expected
    assert chrf_line.startswith("chrF2|nrefs:1|") and chrf_line.endswith(f" = {scores.chrf:.2f}")


def test_count_mismatch_names_both_counts():
    with pytest.raises(ValueError, match=r"3 hypotheses, 2 references"):
        corpus_scores(["a", "b", "c"], ["a", "b"])
    with pytest.raises(ValueError, match=r"2 hypotheses, 1 references in reference stream 1"):
        corpus_scores(["a", "b"], [["a", "b"], ["a"]])


def test_ngram_precisions_are_raw_counts():
    rows = ngram_precisions([HYP], [REF])
    assert [(r.order, r.matches, r.total) for r in rows] == [(1, 4, 5), (2, 3, 4), (3, 2, 3), (4, 1, 2)]
    assert [r.precision for r in rows] == pytest.approx([80.0, 75.0, 200 / 3, 50.0])
    # "a b" vs "a c": bigram "a b" unmatched -> 0 (not sacreBLEU's smoothed value); no 3-gram -> NaN
    short = ngram_precisions(["a b"], ["a c"])
    assert short[0].precision == 50.0 and short[1].precision == 0.0
    assert math.isnan(short[2].precision) and short[2].total == 0


def test_bleu_by_length_scores_each_bucket_as_a_corpus():
    hyps = ["p q r s", HYP, "u v w x"]
    refs = ["p q r s", REF, "u v w y"]
    src_lengths = [3, 12, 25]
    rows = bleu_by_length(hyps, refs, src_lengths, buckets=(10, 20, 30))
    assert [r.label for r in rows] == ["1-10", "11-20", "21-30", ">30"]
    assert [r.count for r in rows] == [1, 1, 1, 0]
    assert rows[0].bleu == pytest.approx(100.0)
    assert rows[1].bleu == pytest.approx(HAND_BLEU)
    assert rows[2].bleu == pytest.approx(corpus_scores([hyps[2]], [refs[2]]).bleu)
    assert math.isnan(rows[3].bleu)


def test_bleu_by_length_rejects_bad_input():
    with pytest.raises(ValueError, match="2 source lengths for 1 hypotheses"):
        bleu_by_length([HYP], [REF], [3, 4], buckets=(10,))
    with pytest.raises(ValueError, match="strictly increasing"):
        bleu_by_length([HYP], [REF], [3], buckets=(20, 10))
    with pytest.raises(ValueError, match="upper edges >= 1"):  # 0 would count length-0 sentences twice
        bleu_by_length([HYP], [REF], [0], buckets=(0, 10))


def test_one_string_is_not_a_list_of_references():
    from sanlab.evaluation.bleu import corpus_scores

    with pytest.raises(TypeError, match="not one string"):
        corpus_scores(["x", "y"], "ab")


@pytest.mark.parametrize("score", [corpus_scores, ngram_precisions,
                                   lambda h, r: bleu_by_length(h, r, [1] * len(r), buckets=(10,))])
def test_one_string_is_not_a_list_of_hypotheses(score):
    """A notebook's ``corpus_scores(hyp, refs)`` with one hypothesis string was scored character by character
    against as many references as it has characters (BLEU 0, chrF 11 for "the cat sat" against 11 copies of
    itself): refused, as one string of references is."""
    with pytest.raises(TypeError, match="hypotheses must be a list of strings, not one string"):
        score("the cat sat", ["the cat sat"] * 11)
