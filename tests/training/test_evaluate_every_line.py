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
    assert "skipped 1 of 201 pairs with an empty side" in (run / "train.log").read_text()
    result = evaluate_run(run, checkpoint="last", splits=["t"])["t"]
    assert result["sentences"] == 3
    hyps = read_hypotheses(run / "hyp-last-t.txt")
    assert len(hyps) == 3 and hyps[1] == ""
