"""--precision fp32|bf16 on translate, tag and evaluate (issue 24), on copies of the committed tiny runs
(tests/fixtures/rundir-v1, the ``legacy`` fixture), and scripts/decode_agreement.py end to end."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from sanlab.cli import DECODE_PRECISIONS, main
from sanlab.errors import ConfigError
from sanlab.runs import evaluate_run
from sanlab.tasks.base import Task
from sanlab.training import rundir
from sanlab.training.device import decoding_precision
from sanlab.training.layout import RunLayout

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "rundir-v1"


def test_the_cli_offers_the_precisions_decoding_has():
    from sanlab.training import device

    assert DECODE_PRECISIONS == device.DECODE_PRECISIONS == ("fp32", "bf16")
    for name in ("fp16", "tf32"):
        with pytest.raises(ConfigError, match="expected one of fp32, bf16"):
            decoding_precision(name, torch.device("cpu"))


def test_layout_names_a_bf16_evaluation_beside_the_fp32_one():
    run = RunLayout("runs/x")
    assert run.eval_record("best") == run.eval_record("best", "fp32") == Path("runs/x/eval-best.json")
    assert run.eval_record("checkpoints/step-00000004", "bf16") == Path("runs/x/eval-step-00000004-bf16.json")
    assert run.hypotheses("best", "test", "bf16") == Path("runs/x/hyp-best-bf16-test.txt")
    assert run.hypotheses("best", "test") == Path("runs/x/hyp-best-test.txt")
    # sanlab wrote them: --overwrite may delete them, and they make no directory a stranger's
    assert rundir.is_known("eval-best-bf16.json") and rundir.is_known("hyp-best-bf16-test.txt")


def test_translate_in_bf16_runs_the_model_under_autocast_and_the_search_in_fp32(legacy, monkeypatch):
    from sanlab.runs import load_trained
    from sanlab.tasks import translation

    config, model, spm = load_trained(Path("translation"), device="cpu")
    seen = []
    real = translation.beam_search

    def spying(step, state, **kw):
        def watched(tokens, cache):
            log_probs, cache = step(tokens, cache)
            seen.append((torch.is_autocast_enabled("cpu"), log_probs.dtype))
            return log_probs, cache

        assert not torch.is_autocast_enabled("cpu")  # the search's own arithmetic is outside autocast
        return real(watched, state, **kw)

    monkeypatch.setattr(translation, "beam_search", spying)
    sources = Path("data/translation/test.src").read_text(encoding="utf-8").splitlines()
    bf16 = translation.translate(model, spm, sources, decode=config.decode,
                                 precision=decoding_precision("bf16", torch.device("cpu")))
    assert len(bf16) == len(sources) and seen and all(dtype == torch.float32 for _, dtype in seen)
    seen.clear()
    fp32 = translation.translate(model, spm, sources, decode=config.decode)
    assert seen and all(dtype == torch.float32 for _, dtype in seen)
    assert fp32 == Path("translation/hyp-best-test.txt").read_text(encoding="utf-8").splitlines()  # unchanged


def test_bf16_decoding_casts_the_weights_once_per_batch_not_at_every_step(legacy, monkeypatch):
    """torch drops autocast's bf16 copies of the weights when the outermost autocast context exits; the search
    holds one open over each batch (``Precision.cast_cache``), so the copies are made once per batch."""
    from sanlab.runs import load_trained
    from sanlab.tasks import translation

    config, model, spm = load_trained(Path("translation"), device="cpu")
    cleared, steps = [], []
    real_clear, real_step = torch.clear_autocast_cache, model.decode_step
    monkeypatch.setattr(torch, "clear_autocast_cache", lambda: (cleared.append(1), real_clear()))
    monkeypatch.setattr(model, "decode_step", lambda *a, **k: (steps.append(1), real_step(*a, **k))[1])
    sources = Path("data/translation/test.src").read_text(encoding="utf-8").splitlines()
    decode = config.decode.model_copy(update={"batch_sentences": 4})
    translation.translate(model, spm, sources, decode=decode, precision=decoding_precision("bf16", torch.device("cpu")))
    batches = -(-sum(1 for s in sources if s.strip()) // 4)
    assert batches > 1 and len(steps) > 2 * batches
    assert len(cleared) == batches


def test_bf16_translation_chooses_among_its_hypotheses_by_their_fp32_scores(legacy, monkeypatch):
    """The search runs in bf16 and keeps every finished hypothesis; the fp32 model then scores each one,
    teacher-forced, and the best by that score is the translation: the scores returned are fp32's, computed
    here independently, and nothing the search found is lost or invented."""
    from sanlab.runs import load_trained
    from sanlab.tasks import translation

    config, model, spm = load_trained(Path("translation"), device="cpu")
    searched = []
    real = translation.beam_search
    monkeypatch.setattr(translation, "beam_search",
                        lambda *a, **kw: searched.append(kw["n_best"]) or searched.append(found := real(*a, **kw))
                        or found)
    sources = [s for s in Path("data/translation/test.src").read_text(encoding="utf-8").splitlines() if s.strip()][:6]
    k = config.decode.beam
    bf16 = decoding_precision("bf16", torch.device("cpu"))
    for sentence in sources:  # one at a time: the search's output is then this sentence's
        searched.clear()
        (options,) = translation.translate(model, spm, [sentence], decode=config.decode, n_best=k, precision=bf16)
        (n_best, (hyps,)) = searched
        assert n_best == k  # every finished hypothesis, whatever n_best
        assert sorted(t for t, _ in options) == sorted(spm.tgt.decode(h.tokens) for h in hyps)
        assert [score for _, score in options] == sorted((score for _, score in options), reverse=True)
        src = torch.tensor([spm.src.encode(sentence) + [spm.eos_id]])
        for hyp in hyps:
            with torch.no_grad():
                logits = model(src, torch.tensor([[spm.bos_id] + hyp.tokens]))[0]
            gold = torch.tensor(hyp.tokens + [spm.eos_id])
            log_prob = torch.log_softmax(logits.float(), -1)[torch.arange(len(gold)), gold].sum().item()
            expected = log_prob / (len(hyp.tokens) + 1) ** config.decode.length_penalty
            assert dict(options)[spm.tgt.decode(hyp.tokens)] == pytest.approx(expected, abs=1e-5)


def test_decode_step_projects_to_the_vocabulary_in_fp32_under_autocast(legacy):
    """bf16 logits keep about three significant digits, enough to flip a close choice of the beam: the
    output projection of a decoding step runs in fp32 whatever the autocast around it."""
    from sanlab.runs import load_trained

    _, model, spm = load_trained(Path("translation"), device="cpu")
    seen = []
    model.generator.register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    src = torch.tensor([spm.src.encode("a b c") + [spm.eos_id]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = model.start_decoding(src)
        log_probs, _ = model.decode_step(torch.tensor([[spm.bos_id]]), state)
    (inputs, logits), = seen
    assert logits.dtype == inputs.dtype == log_probs.dtype == torch.float32
    torch.testing.assert_close(logits, inputs @ model.generator.weight.T + (
        0 if model.generator.bias is None else model.generator.bias), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1))


def test_translate_command_with_precision(legacy, tmp_path, capsys):
    out32, out16 = tmp_path / "fp32.txt", tmp_path / "bf16.txt"
    common = ["translate", "--run", "translation", "--device", "cpu", "--input", "data/translation/test.src"]
    assert main([*common, "--output", str(out32)]) == 0
    assert main([*common, "--precision", "bf16", "--output", str(out16)]) == 0
    assert out32.read_text(encoding="utf-8") == Path("translation/hyp-best-test.txt").read_text(encoding="utf-8")
    assert len(out16.read_text(encoding="utf-8").splitlines()) == len(out32.read_text(encoding="utf-8").splitlines())
    with pytest.raises(SystemExit):  # argparse: not a choice
        main([*common, "--precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_evaluate_in_bf16_keeps_the_fp32_record_and_says_its_precision(legacy, capsys):
    run = Path("translation")
    committed = (run / "eval-best.json").read_bytes(), (run / "hyp-best-test.txt").read_bytes()
    assert main(["evaluate", "--run", str(run), "--device", "cpu", "--precision", "bf16"]) == 0
    assert "BLEU" in capsys.readouterr().out
    assert ((run / "eval-best.json").read_bytes(), (run / "hyp-best-test.txt").read_bytes()) == committed
    bf16 = json.loads((run / "eval-best-bf16.json").read_text(encoding="utf-8"))["test"]
    assert bf16["precision"] == "bf16" and bf16["step"] == 4 and bf16["sentences"] == 10
    assert Path(bf16["hypotheses"]).name == "hyp-best-bf16-test.txt" and (run / "hyp-best-bf16-test.txt").is_file()
    # fp32 again: the same scores and hypotheses as the committed record, which now names its precision
    old = json.loads(committed[0])["test"]
    fp32 = evaluate_run(run, checkpoint="best")["test"]
    assert fp32["precision"] == "fp32" and (fp32["bleu"], fp32["chrf"]) == (old["bleu"], old["chrf"])
    assert (run / "hyp-best-test.txt").read_bytes() == committed[1]
    assert json.loads((run / "eval-best-bf16.json").read_text(encoding="utf-8"))["test"]["precision"] == "bf16"
    with pytest.raises(ConfigError, match="expected one of fp32, bf16"):
        evaluate_run(run, precision="fp16")


def test_tag_and_evaluate_a_tagger_in_bf16(legacy, tmp_path):
    run = Path("tagging")
    committed = (run / "eval-best.json").read_bytes()
    out32, out16 = tmp_path / "fp32.tsv", tmp_path / "bf16.tsv"
    data = next(Path("data/tagging").glob("test*"))
    common = ["tag", "--run", str(run), "--device", "cpu", "--input", str(data)]
    assert main([*common, "--output", str(out32)]) == 0
    assert main([*common, "--precision", "bf16", "--output", str(out16)]) == 0
    import conllu  # CoNLL-U in, CoNLL-U out: the same words, each with a tag, in either precision

    tagged = lambda p: [(t["form"], t["upos"]) for s in conllu.parse(p.read_text(encoding="utf-8"))  # noqa: E731
                        for t in s if isinstance(t["id"], int)]
    gold = [(t["form"], t["upos"]) for s in conllu.parse(data.read_text(encoding="utf-8"))
            for t in s if isinstance(t["id"], int)]
    for out in (out32, out16):
        assert [form for form, _ in tagged(out)] == [form for form, _ in gold] and len(gold) > 0
        assert all(tag not in (None, "_") for _, tag in tagged(out))
    assert main(["evaluate", "--run", str(run), "--device", "cpu", "--precision", "bf16"]) == 0
    assert (run / "eval-best.json").read_bytes() == committed
    bf16 = json.loads((run / "eval-best-bf16.json").read_text(encoding="utf-8"))
    assert set(bf16) == set(json.loads(committed)) and all(r["precision"] == "bf16" for r in bf16.values())
    assert all(0 <= r["all"] <= 100 for r in bf16.values())


def test_a_task_that_decodes_only_in_fp32_says_so():
    class Copy(Task):
        name = "copy"

    Copy().require_precision("fp32", "runs/c")
    with pytest.raises(ConfigError, match="runs/c is a copy run; it decodes in fp32, not bf16"):
        Copy().require_precision("bf16", "runs/c")


def _script():
    spec = importlib.util.spec_from_file_location("decode_agreement", ROOT / "scripts" / "decode_agreement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agreement_script_end_to_end(legacy, tmp_path, capsys):
    report = tmp_path / "agreement.md"
    assert _script().main(["--run", "translation", "--device", "cpu", "--output", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert text == capsys.readouterr().out
    assert text.startswith("# Decoding in bf16 against fp32: translation, test")
    assert "Identical hypotheses: **" in text and " of 10 sentences (" in text
    assert "| BLEU | 0.00 |" in text and "wall time, s" in text and "CPU's bf16" in text
    names = lambda d: sorted(p.name for p in d.iterdir())  # noqa: E731
    assert names(Path("translation")) == names(FIXTURE / "translation")  # it wrote nothing into the run


@pytest.mark.parametrize("output", ["translation/config.yaml", "data/translation/test.tgt"])
def test_the_agreement_report_never_replaces_a_runs_file_or_its_input(legacy, capsys, output):
    """--output naming the run's config or the references it scores against: the report was written over it."""
    kept = Path(output).read_bytes()
    assert _script().main(["--run", "translation", "--device", "cpu", "--output", output]) == 2
    err = capsys.readouterr().err
    assert f"--output {output}: " in err and "which the output would replace" in err
    assert Path(output).read_bytes() == kept


def test_the_agreement_report_never_replaces_a_file_that_is_not_such_a_report(legacy, tmp_path, capsys, monkeypatch):
    """--output naming a file of the user's (notes.md): it was written over; now refused before decoding, as
    bench/report.py refuses an --out that is no report of its bench."""
    script = _script()
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n", encoding="utf-8")
    monkeypatch.setattr(script, "report", lambda *a, **k: pytest.fail("decoded before refusing the --output"))
    assert script.main(["--run", "translation", "--device", "cpu", "--output", str(notes)]) == 2
    assert (f"--output {notes}: the file exists and is no report of scripts/decode_agreement.py (it does not name "
            "the script); not overwritten") in capsys.readouterr().err
    assert notes.read_text(encoding="utf-8") == "my notes\n"


def test_the_agreement_report_replaces_an_earlier_one_whole(legacy, tmp_path, capsys, monkeypatch):
    """An earlier report of the script is replaced, but only by a complete one: a report that fails while it is
    written (here, text that UTF-8 cannot encode) leaves the earlier one as it was, not truncated."""
    script = _script()
    report = tmp_path / "reports" / "agreement.md"
    assert script.main(["--run", "translation", "--device", "cpu", "--output", str(report)]) == 0
    earlier = report.read_text(encoding="utf-8")
    monkeypatch.setattr(script, "report", lambda *a, **k: "# Decoding in bf16 against fp32\n\ud800\n")
    with pytest.raises(UnicodeEncodeError):
        script.main(["--run", "translation", "--device", "cpu", "--output", str(report)])
    assert report.read_text(encoding="utf-8") == earlier
    assert sorted(p.name for p in report.parent.iterdir()) == ["agreement.md"]  # no temporary file left beside it


def test_the_agreement_script_refuses_a_tagging_run_and_an_unknown_split(legacy, capsys):
    script = _script()
    assert script.main(["--run", "tagging", "--device", "cpu"]) == 2
    assert "sanlab translate` needs a translation run" in capsys.readouterr().err
    assert script.main(["--run", "translation", "--device", "cpu", "--split", "nope"]) == 2
    assert "unknown split 'nope'" in capsys.readouterr().err


def test_the_agreement_scripts_rounds_alternate_which_precision_runs_first(legacy, tmp_path, capsys):
    """One timed pass each, fp32 always first: whichever ran second met a warmer (or busier) machine."""
    script = _script()
    assert [script.pass_order(["fp32", "bf16"], r) for r in range(3)] == [["fp32", "bf16"], ["bf16", "fp32"],
                                                                        ["fp32", "bf16"]]
    report = tmp_path / "agreement.md"
    assert script.main(["--run", "translation", "--device", "cpu", "--rounds", "3", "--output", str(report)]) == 0
    text = report.read_text(encoding="utf-8")
    assert "| wall time, s (median) |" in text and "the median of 3 rounds, fp32 first in the odd rounds" in text
    per_round = re.search(r"seconds per round: fp32 ([\d., ]+); bf16 ([\d., ]+)\)", text)
    assert per_round and all(len(times.split(", ")) == 3 for times in per_round.groups())
    with pytest.raises(SystemExit) as usage:
        script.main(["--run", "translation", "--device", "cpu", "--rounds", "0"])
    assert usage.value.code == 2 and "--rounds must be at least 1, not 0" in capsys.readouterr().err
