"""A test set is scored on every one of its lines; data.skip_empty only thins training and validation."""

from sanlab.config import validate
from sanlab.runs import evaluate_run, train_run
from sanlab.tasks.translation import read_hypotheses


def test_blank_test_lines_are_scored_with_empty_hypotheses_and_skipped_training_pairs_are_logged(tmp_path,
                                                                                                  tiny_translation):
    base = tiny_translation(max_steps=2)
    (tmp_path / "train.src").write_text((tmp_path / "train.src").read_text() + "\n")  # one blank pair at the end
    (tmp_path / "train.tgt").write_text((tmp_path / "train.tgt").read_text() + "\n")
    (tmp_path / "test.src").write_text("a b c\n\nd e\n")
    (tmp_path / "test.tgt").write_text("c b a\nnichts\ne d\n")
    raw = base.model_dump()
    raw["data"]["skip_empty"] = True
    raw["data"]["test"] = {"t": {"src": str(tmp_path / "test.src"), "tgt": str(tmp_path / "test.tgt")}}
    run = tmp_path / "run"
    train_run(validate(raw, source="test"), run, quiet=True)
    assert " of 201 pairs kept (1 with an empty side skipped, " in (run / "train.log").read_text()
    result = evaluate_run(run, checkpoint="last", splits=["t"])["t"]
    assert result["sentences"] == 3
    hyps = read_hypotheses(run / "hyp-last-t.txt")
    assert len(hyps) == 3 and hyps[1] == ""


def test_sentences_longer_than_the_model_accepts_are_named_and_translations_capped(tmp_path, tiny_translation):
    import pytest

    from sanlab.config import DecodeConfig
    from sanlab.errors import ConfigError, DataError
    from sanlab.runs import load_trained
    from sanlab.tasks.translation import translate

    from sanlab.tasks import translation

    raw = tiny_translation(max_steps=1).model_dump()
    raw["model"]["max_positions"] = 8
    raw["model"]["positions"] = "learned"  # a table of 8 positions: one more would fail, not pass silently
    raw["data"]["max_len"] = 7
    run = tmp_path / "run"
    train_run(validate(raw, source="test"), run, quiet=True)
    _, model, spm = load_trained(run, checkpoint="last")
    with pytest.raises(DataError, match=r"test.src:2: \d+ subword tokens .*model.max_positions = 8"):
        translate(model, spm, ["a b", "a b c d e f g h i j k l", ""], decode=DecodeConfig(), source="test.src")
    asked, search = [], translation.beam_search

    def spy(*args, **kwargs):
        asked.append(kwargs["max_lengths"].tolist())
        return search(*args, **kwargs)

    long_output = DecodeConfig(beam=2, max_len_a=10.0, max_len_b=50)  # would allow 70+ tokens
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(translation, "beam_search", spy)
        hyps = translate(model, spm, ["a b c", ""], decode=long_output, n_best=1)
    assert asked == [[8]]  # 8 output tokens read decoder positions 0..7: exactly the table
    assert hyps[1] == ""
    raw["data"]["max_len"] = 8
    with pytest.raises(ConfigError, match="data.max_len 8 .* exceeds model.max_positions 8"):
        validate(raw, source="test")


def test_a_validation_pair_too_long_for_the_model_stops_training_before_it_starts(tmp_path, tiny_translation):
    import pytest

    from sanlab.errors import DataError

    raw = tiny_translation(max_steps=1).model_dump()
    raw["model"]["max_positions"] = 9
    raw["data"]["max_len"] = 8
    (tmp_path / "valid.src").write_text("a b\n" + "a b c d e f g h i j k l m n o p\n")
    (tmp_path / "valid.tgt").write_text("b a\n" + "p o n m l k j i h g f e d c b a\n")
    with pytest.raises(DataError, match=r"valid.src:2: this pair has \d+ subword tokens"):
        train_run(validate(raw, source="test"), tmp_path / "run", quiet=True)
    raw["data"]["skip_empty"] = True  # pairs are then counted after the empty ones were dropped
    with pytest.raises(DataError, match=r"valid.src: validation pair 2 \(counted after data.skip_empty\) has "
                                        r"\d+ subword tokens"):
        train_run(validate(raw, source="test"), tmp_path / "run2", quiet=True)
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
    raw["data"]["skip_empty"] = False
    (tmp_path / "valid.src").write_text("a b\nb a\n")  # the long side is the target's: its file is named
    with pytest.raises(DataError, match=r"valid.tgt:2: this pair has \d+ subword tokens on this side"):
        train_run(validate(raw, source="test"), tmp_path / "run3", quiet=True)


def test_a_test_sentence_too_long_for_the_model_stops_training_before_it_starts(tmp_path, tiny_translation):
    """`sanlab evaluate` refuses such a source line (translate cannot take it): found when training starts, with
    its file and line, not after the run trained."""
    import pytest

    from sanlab.errors import DataError

    raw = tiny_translation(max_steps=1).model_dump()
    raw["model"]["max_positions"] = 9
    raw["data"]["max_len"] = 8
    (tmp_path / "test.src").write_text("a b\n" + "a b c d e f g h i j k l m n o p\n")
    (tmp_path / "test.tgt").write_text("b a\nshort\n")
    raw["data"]["test"] = {"t": {"src": str(tmp_path / "test.src"), "tgt": str(tmp_path / "test.tgt")}}
    with pytest.raises(DataError, match=r"test.src:2: \d+ subword tokens .*more than model.max_positions = 9"):
        train_run(validate(raw, source="test"), tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())


def test_max_output_lengths_follow_fairseqs_rule_in_double_precision():
    import torch

    from sanlab.config import DecodeConfig
    from sanlab.tasks.translation import max_output_lengths

    src_len = torch.tensor([1, 50, 90, 100])
    # fairseq: int(a * len + b) tokens, then EOS; float32 would give 126 for 1.3 * 90 + 10 and 114 for 2.1 * 50 + 10
    assert max_output_lengths(src_len, DecodeConfig(max_len_a=1.3, max_len_b=10), None).tolist() == [12, 76, 128, 141]
    assert max_output_lengths(src_len, DecodeConfig(max_len_a=2.1, max_len_b=10), None).tolist() == [
        int(2.1 * n + 10) + 1 for n in (1, 50, 90, 100)]
    assert max_output_lengths(src_len, DecodeConfig(max_len_a=2.1, max_len_b=10), 100).tolist() == [13, 100, 100, 100]
    # a = b = 0 allows the end of sentence alone (an empty translation), not a zero-length search
    assert max_output_lengths(src_len, DecodeConfig(max_len_a=0, max_len_b=0), None).tolist() == [1, 1, 1, 1]


def test_a_zero_length_budget_translates_to_empty_lines_and_evaluate_ignores_the_runs_n_best(tmp_path,
                                                                                             tiny_translation):
    from sanlab.config import DecodeConfig
    from sanlab.runs import load_trained
    from sanlab.tasks.translation import translate

    raw = tiny_translation(max_steps=1).model_dump()
    raw["decode"]["beam"], raw["decode"]["n_best"] = 3, 3  # for `translate`; evaluate scores one hypothesis
    (tmp_path / "test.src").write_text("a b c\nd e\n")
    (tmp_path / "test.tgt").write_text("c b a\ne d\n")
    raw["data"]["test"] = {"t": {"src": str(tmp_path / "test.src"), "tgt": str(tmp_path / "test.tgt")}}
    run = tmp_path / "run"
    train_run(validate(raw, source="test"), run, quiet=True)
    _, model, spm = load_trained(run, checkpoint="last")
    assert translate(model, spm, ["a b c", "d e"], decode=DecodeConfig(max_len_a=0, max_len_b=0)) == ["", ""]
    assert evaluate_run(run, checkpoint="last", splits=["t"], decode_overrides={"beam": 1})["t"]["sentences"] == 2
