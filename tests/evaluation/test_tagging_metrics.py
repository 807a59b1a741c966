"""Tagging metrics on a toy corpus whose word groups (OOV, ambiguous, ...) are counted by hand."""

from __future__ import annotations

import pytest

from sanlab.evaluation.tagging import (
    GROUPS,
    ambiguous_words,
    correctness,
    format_report,
    per_tag_report,
    tagging_accuracy,
    token_groups,
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
# A vocabulary built on all splits and cut by frequency (spec C.10): "rare" is a training word left
# OUT of it, "cat" a test-only word kept IN it. Neither changes OOV or Ambiguous (they come from the
# training data); "cat" is the one "OOV in vocabulary" token.
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
    ["DT", "VB", "DT", "VBD"],  # "cat" and "that" wrong
    ["NN", "NN", "DT", "NN"],  # "rare" wrong
    ["NN", "VBZ"],
    ["VBP"],
]
# Token by token (group; correct?):
#   s0: the (one tag, ok)  cat (OOV: never in training, though in the vocabulary; WRONG)
#       that (AMB, WRONG)  fell (one tag, ok)
#   s1: rare (AMB: 2 training tags, although outside the vocabulary; WRONG)  bark (AMB, ok)
#       that (AMB, ok)  dog (one tag, ok)
#   s2: zebra (OOV, not in the vocabulary, ok)  barks (one tag, ok)
#   s3: bark (AMB, ok)
# All:            11 tokens, 3 wrong                                   -> 8/11
# OOV:            cat x, zebra ok = 2 tokens                           -> 1/2
# OOV in vocab.:  cat x = 1 token                                      -> 0/1
# Ambiguous:      that x, rare x, bark ok, that ok, bark ok = 5 tokens -> 3/5
# One tag:        the, fell, dog, barks = 4 tokens, all right          -> 4/4
# OOV + Ambiguous + one tag = 2 + 5 + 4 = 11 = All, and (1 + 3 + 4) / 11 = All accuracy.


def test_word_tags_and_ambiguous_words_from_training():
    tags = word_tags(TRAIN)
    assert tags["bark"] == {"NN", "VBP"} and tags["dog"] == {"NN"}
    assert set(ambiguous_words(TRAIN)) == {"bark", "that", "rare"}


@pytest.mark.parametrize("in_vocab", [VOCAB, VOCAB.__contains__])
def test_groups_counted_by_hand(in_vocab):
    scores = tagging_accuracy(gold=GOLD, pred=PRED, words=WORDS, in_vocab=in_vocab, train_word_tags=word_tags(TRAIN))
    assert (scores.n_all, scores.n_oov, scores.n_oov_in_vocab, scores.n_ambiguous, scores.n_unambiguous) == \
        (11, 2, 1, 5, 4)
    assert scores.all == pytest.approx(100 * 8 / 11)
    assert (scores.oov, scores.oov_in_vocab) == (pytest.approx(50.0), 0.0)
    assert (scores.ambiguous, scores.unambiguous) == (pytest.approx(60.0), 100.0)


def test_oov_ambiguous_and_one_tag_partition_all():
    scores = tagging_accuracy(gold=GOLD, pred=PRED, words=WORDS, in_vocab=VOCAB, train_word_tags=word_tags(TRAIN))
    parts = ("oov", "ambiguous", "unambiguous")
    assert sum(getattr(scores, f"n_{g}") for g in parts) == scores.n_all
    weighted = sum(getattr(scores, g) * getattr(scores, f"n_{g}") for g in parts) / scores.n_all
    assert weighted == pytest.approx(scores.all)


def test_the_vocabulary_changes_only_the_oov_in_vocabulary_group():
    # OOV and ambiguity come from the training sentences: a train-only, an all-splits or an empty
    # vocabulary give the same groups; only "OOV in vocabulary" reads the vocabulary.
    train_words = {w for s in TRAIN for w, _ in s}
    scores = {name: tagging_accuracy(gold=GOLD, pred=PRED, words=WORDS, in_vocab=vocab, train_word_tags=word_tags(TRAIN))
              for name, vocab in (("all splits", VOCAB), ("train", train_words), ("empty", set()))}
    for name, s in scores.items():
        assert (s.n_oov, s.n_ambiguous, s.n_unambiguous, s.oov, s.ambiguous) == (2, 5, 4, 50.0, 60.0), name
    assert [scores[n].n_oov_in_vocab for n in scores] == [1, 0, 0]
    assert scores["train"].oov_in_vocab is None


def test_group_flags_match_hand_count():
    flags = token_groups(WORDS, in_vocab=VOCAB, train_word_tags=word_tags(TRAIN))
    assert list(flags) == list(GROUPS)
    assert flags["oov"] == [[False, True, False, False], [False] * 4, [True, False], [False]]
    assert flags["oov_in_vocab"] == [[False, True, False, False], [False] * 4, [False, False], [False]]
    assert flags["ambiguous"] == [[False, False, True, False], [True, True, True, False], [False, False], [True]]
    assert flags["unambiguous"] == [[True, False, False, True], [False, False, False, True], [False, True], [False]]
    assert correctness(gold=GOLD, pred=PRED)[0] == [True, False, False, True]


def test_empty_group_is_none_and_record_has_every_group():
    scores = tagging_accuracy(
        gold=[["DT"]], pred=[["DT"]], words=[["the"]], in_vocab=VOCAB, train_word_tags=word_tags(TRAIN)
    )
    assert scores.all == 100.0 and scores.unambiguous == 100.0
    assert scores.oov is None and scores.n_oov == 0
    assert scores.ambiguous is None and scores.n_ambiguous == 0
    assert scores.record() == {"all": 100.0, "oov": None, "oov_in_vocab": None, "ambiguous": None,
                               "unambiguous": 100.0, "n_all": 1, "n_oov": 0, "n_oov_in_vocab": 0,
                               "n_ambiguous": 0, "n_unambiguous": 1}


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
