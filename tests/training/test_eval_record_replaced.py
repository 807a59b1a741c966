"""`sanlab evaluate` keeps one record (and one hypotheses file) per split of a checkpoint: evaluating a split again
with other decode settings replaces them (docs/training.md). That is said when it happens, with the score that is
being replaced, so an earlier evaluation is never lost without a word. On a copy of the committed tiny run
(tests/fixtures/rundir-v1, the ``legacy`` fixture)."""

import logging
from pathlib import Path

from sanlab.files import read_json
from sanlab.runs import evaluate_run

RUN = Path("translation")  # its saved config decodes with beam 2


def _replacement_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "is replaced by" in r.getMessage()]


def test_other_decode_settings_replace_a_split_s_record_with_a_warning(legacy, caplog):
    with caplog.at_level(logging.WARNING, logger="sanlab"):
        first = evaluate_run(RUN, checkpoint="best")["test"]  # over the committed record: its settings, read as then
        again = evaluate_run(RUN, checkpoint="best")["test"]  # the same settings: nothing to say
    assert again["bleu"] == first["bleu"] and _replacement_warnings(caplog) == []

    with caplog.at_level(logging.WARNING, logger="sanlab"):
        greedy = evaluate_run(RUN, checkpoint="best", decode_overrides={"beam": 1})["test"]
    [message] = _replacement_warnings(caplog)
    assert "length penalty style" not in message  # a key added since the committed record, at the value it meant
    assert "eval-best.json" in message and "'test'" in message
    assert "beam 2" in message and "beam 1" in message  # what differs, old and new
    assert f"bleu = {first['bleu']:.2f}" in message      # the score that is replaced
    assert "hyp-best-test.txt" in message
    assert "10 of 10 hypotheses differ" in message       # beam 1 decodes every line of this tiny run otherwise
    assert f"bleu = {greedy['bleu']:.2f}" in message.split("replaced by")[1]  # and the score that replaces it
    assert read_json(RUN / "eval-best.json")["test"]["decode"] == greedy["decode"]


def test_a_record_of_another_split_or_precision_is_no_replacement(legacy, caplog):
    evaluate_run(RUN, checkpoint="best")
    with caplog.at_level(logging.WARNING, logger="sanlab"):
        evaluate_run(RUN, checkpoint="best", decode_overrides={"beam": 1}, precision="bf16")  # eval-best-bf16.json
    assert _replacement_warnings(caplog) == []


def test_other_settings_that_decode_the_same_hypotheses_replace_the_record_without_a_warning(legacy, caplog):
    """Only --batch-sentences changed: the same hypotheses, line for line (compared with the file before it is
    rewritten), so nothing is lost: an INFO line says the record was made again, not a warning."""
    before = (RUN / "hyp-best-test.txt").read_text(encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="sanlab"):
        again = evaluate_run(RUN, checkpoint="best", decode_overrides={"batch_sentences": 3})["test"]
    assert _replacement_warnings(caplog) == []
    [info] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "replaced" in r.getMessage()]
    assert "batch sentences 64" in info and "batch sentences 3" in info and "the same hypotheses" in info
    assert (RUN / "hyp-best-test.txt").read_text(encoding="utf-8") == before
    assert read_json(RUN / "eval-best.json")["test"]["decode"] == again["decode"]  # replaced all the same


def test_a_hypotheses_file_that_is_not_its_records_is_not_compared(legacy, caplog):
    """The earlier hypotheses file edited (or lost) behind its record's back says nothing of what the record scored:
    the replacement is a warning, with no count of lines."""
    evaluate_run(RUN, checkpoint="best")  # a record with its hypotheses' digest
    hypotheses = RUN / "hyp-best-test.txt"
    hypotheses.write_text(hypotheses.read_text(encoding="utf-8").replace("und", "and"), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="sanlab"):
        evaluate_run(RUN, checkpoint="best", decode_overrides={"batch_sentences": 3})
    [message] = _replacement_warnings(caplog)
    assert "differ" not in message and "same hypotheses" not in message

    hypotheses.unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sanlab"):
        evaluate_run(RUN, checkpoint="best")
    [message] = _replacement_warnings(caplog)
    assert "differ" not in message and "same hypotheses" not in message


def _hypotheses_read(monkeypatch) -> list[str]:
    """The names of the hypotheses files opened for reading from now on (what evaluate reads back)."""
    read, real = [], Path.open

    def spy(self, mode="r", *args, **kwargs):
        if self.name.startswith("hyp-") and not any(c in mode for c in "wax+"):
            read.append(self.name)
        return real(self, mode, *args, **kwargs)
    monkeypatch.setattr(Path, "open", spy)
    return read


def test_the_same_settings_read_no_hypotheses_file(legacy, monkeypatch, caplog):
    """Evaluated again with the same decode settings, nothing is compared: the earlier hypotheses file is not read
    before decoding, nor the new one after (each was read whole, and the comparison thrown away)."""
    evaluate_run(RUN, checkpoint="best")
    read = _hypotheses_read(monkeypatch)
    with caplog.at_level(logging.INFO, logger="sanlab"):
        evaluate_run(RUN, checkpoint="best")
    assert read == [] and not [r for r in caplog.records if "replaced" in r.getMessage()]


def test_other_settings_are_told_the_same_hypotheses_by_the_records_digests(legacy, monkeypatch, caplog):
    """Other settings, the same hypotheses: the two records' hypotheses_sha256 say so; the new file is not read back
    (the earlier one is read once, before decoding rewrites it, to be compared line for line if they differ)."""
    evaluate_run(RUN, checkpoint="best")  # a record with its hypotheses' digest
    read = _hypotheses_read(monkeypatch)
    with caplog.at_level(logging.INFO, logger="sanlab"):
        evaluate_run(RUN, checkpoint="best", decode_overrides={"batch_sentences": 3})
    assert read == ["hyp-best-test.txt"]
    [info] = [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]
    assert "the same hypotheses" in info


def test_a_step_named_without_its_zeros_is_recorded_under_its_directorys_name(legacy):
    """`--checkpoint step-4` and `step-00000004` are one checkpoint, and its evaluation one record named after its
    directory (docs/training.md): the short name wrote eval-step-4.json beside eval-step-00000004.json."""
    short = evaluate_run(RUN, checkpoint="step-4")["test"]
    full = evaluate_run(RUN, checkpoint="step-00000004")["test"]
    assert short["bleu"] == full["bleu"] and short["hypotheses"] == "hyp-step-00000004-test.txt"
    assert sorted(p.name for p in RUN.glob("*step-*")) == ["eval-step-00000004.json", "hyp-step-00000004-test.txt"]
