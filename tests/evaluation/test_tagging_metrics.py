"""Tagging metrics of spec C.11 on a toy corpus whose OOV / ambiguous sets are counted by hand."""

from __future__ import annotations

import pytest

from sanlab.evaluation.tagging import (
    ambiguous_words,
    correctness,
    format_report,
    per_tag_report,
    tagging_accuracy,
    token_subsets,
    word_tags,
)

# Training data -> tags per word type:
#   the {DT}  dog {NN}  barks {VBZ}  bark {NN, VBP}*  fell {VBD}  that {DT, IN}*  dogs {NNS}
#   rare {JJ, NN}*   (* = more than one tag in training)
TRAIN = [
    [("the", "DT"), ("dog", "NN"), ("barks", "VBZ")],
    [("the", "DT"), ("bark", "NN"), ("fell", "VBD")],
    [("dogs", "NNS"), ("bark", "VBP")],
    [("that", "DT"), ("rare", "JJ"), ("dog", "NN")],
    [("that", "IN"), ("rare", "NN"), ("fell", "VBD")],
]
# Vocabulary (built on all splits and cut by frequency, C.10): "rare" is a training word left
# OUT of it (so OOV), "cat" is a test-only word kept IN it (so not OOV, and not ambiguous).
VOCAB = {"the", "dog", "barks", "bark", "fell", "that", "dogs", "cat"}

WORDS = [
    ["the", "cat", "that", "fell"],
    ["rare", "bark", "that", "dog"],
    ["zebra", "barks"],
    ["bark"],
]
GOLD = [
    ["DT", "NN", "IN", "VBD"],
    ["JJ", "NN", "DT", "NN"],
    ["NN", "VBZ"],
    ["VBP"],
]
PRED = [
    ["DT", "NN", "DT", "VBD"],  # "that" wrong
    ["NN", "NN", "DT", "NN"],  # "rare" wrong
    ["NN", "VBZ"],
    ["VBP"],
]
# Token by token (in vocab? ambiguous? correct?):
#   s0: the (in, -, ok)  cat (in, - : never in training, ok)  that (in, AMB, WRONG)  fell (in, -, ok)
#   s1: rare (OOV: 2 train tags but OOV is excluded from ambiguous, WRONG)  bark (in, AMB, ok)
#       that (in, AMB, ok)  dog (in, -, ok)
#   s2: zebra (OOV, ok)  barks (in, -, ok)
#   s3: bark (in, AMB, ok)
# All:       11 tokens, 2 wrong (s0 "that", s1 "rare")      -> 9/11
# OOV:       rare, zebra = 2 tokens, zebra correct          -> 1/2
# Ambiguous: that(s0) x, bark(s1) ok, that(s1) ok, bark(s3) ok = 4 tokens -> 3/4


def test_word_tags_and_ambiguous_words_from_training():
    tags = word_tags(TRAIN)
    assert tags["bark"] == {"NN", "VBP"} and tags["dog"] == {"NN"}
    assert set(ambiguous_words(TRAIN)) == {"bark", "that", "rare"}


@pytest.mark.parametrize("train_word_tags", [word_tags(TRAIN), ambiguous_words(TRAIN)])
@pytest.mark.parametrize("in_vocab", [VOCAB, VOCAB.__contains__])
def test_all_oov_ambiguous_counted_by_hand(train_word_tags, in_vocab):
    scores = tagging_accuracy(gold=GOLD, pred=PRED, words=WORDS, in_vocab=in_vocab, train_word_tags=train_word_tags)
    assert (scores.n_all, scores.n_oov, scores.n_ambiguous) == (11, 2, 4)
    assert scores.all == pytest.approx(100 * 9 / 11)
    assert scores.oov == pytest.approx(50.0)
    assert scores.ambiguous == pytest.approx(75.0)


def test_oov_is_the_vocabulary_not_unseen_in_training():
    # Using the training words as "vocabulary" is the mistake C.11 warns about: "rare" would be
    # in-vocabulary (and ambiguous), "cat" OOV. The counts then differ from the hand count above.
    train_words = {w for s in TRAIN for w, _ in s}
    wrong = tagging_accuracy(gold=GOLD, pred=PRED, words=WORDS, in_vocab=train_words, train_word_tags=word_tags(TRAIN))
    assert (wrong.n_oov, wrong.n_ambiguous) == (2, 5)  # cat + zebra; rare joins ambiguous


def test_subset_flags_match_hand_count():
    oov, amb = token_subsets(WORDS, in_vocab=VOCAB, train_word_tags=word_tags(TRAIN))
    assert oov == [[False] * 4, [True, False, False, False], [True, False], [False]]
    assert amb == [[False, False, True, False], [False, True, True, False], [False, False], [True]]
    assert correctness(gold=GOLD, pred=PRED)[0] == [True, True, False, True]


def test_empty_subset_is_none():
    scores = tagging_accuracy(
        gold=[["DT"]], pred=[["DT"]], words=[["the"]], in_vocab=VOCAB, train_word_tags=word_tags(TRAIN)
    )
    assert scores.all == 100.0
    assert scores.oov is None and scores.n_oov == 0
    assert scores.ambiguous is None and scores.n_ambiguous == 0


def test_length_mismatch_names_sentence_and_lengths():
    bad_pred = [PRED[0], PRED[1][:3], PRED[2], PRED[3]]
    with pytest.raises(ValueError, match="sentence 1: gold has 4 tokens but pred has 3"):
        tagging_accuracy(gold=GOLD, pred=bad_pred, words=WORDS, in_vocab=VOCAB, train_word_tags={})
    with pytest.raises(ValueError, match="gold has 4 sentences but words has 3"):
        tagging_accuracy(gold=GOLD, pred=PRED, words=WORDS[:3], in_vocab=VOCAB, train_word_tags={})


# Per-tag report. Tokens (gold, pred): (A,A) (B,D) (A,A) | (C,C) (A,B)
#   A: support 3, predicted 2 (both right)   -> P 2/2 = 100, R 2/3, F1 = 2*1*(2/3)/(1+2/3) = 80
#   B: support 1, predicted 1 (gold A: wrong) -> P 0, R 0, F1 0
#   C: support 1, predicted 1, right         -> 100 / 100 / 100
#   D: support 0, predicted 1, wrong          -> P 0, R undefined -> 0, F1 0
#   accuracy 3/5 = 60; macro F1 = (80 + 0 + 100 + 0) / 4 = 45
REPORT_GOLD = [["A", "B", "A"], ["C", "A"]]
REPORT_PRED = [["A", "D", "A"], ["C", "B"]]


def test_per_tag_report_by_hand():
    rows = {r.tag: r for r in per_tag_report(REPORT_GOLD, REPORT_PRED)}
    assert list(rows) == ["A", "B", "C", "D"]
    assert (rows["A"].support, rows["A"].precision, rows["A"].recall) == (3, 100.0, pytest.approx(200 / 3))
    assert rows["A"].f1 == pytest.approx(80.0)
    assert (rows["B"].support, rows["B"].precision, rows["B"].recall, rows["B"].f1) == (1, 0.0, 0.0, 0.0)
    assert (rows["C"].precision, rows["C"].recall, rows["C"].f1) == (100.0, 100.0, 100.0)
    assert (rows["D"].support, rows["D"].precision, rows["D"].recall, rows["D"].f1) == (0, 0.0, 0.0, 0.0)


def test_format_report_is_fixed_width():
    text = format_report(per_tag_report(REPORT_GOLD, REPORT_PRED))
    lines = text.split("\n")
    assert len({len(line) for line in lines}) == 1  # every line has the same width
    assert lines[0].split() == ["tag", "support", "prec", "recall", "f1"]
    assert lines[2].split() == ["A", "3", "100.00", "66.67", "80.00"]
    assert lines[-2].split() == ["accuracy", "5", "60.00"]
    assert lines[-1].split() == ["macro", "F1", "5", "45.00"]
