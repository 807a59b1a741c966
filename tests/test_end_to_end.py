"""The CLI pipeline on tiny runs: train -> average -> translate / tag -> evaluate."""

import contextlib
import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import conllu
import yaml
from safetensors.torch import load_file, save_file

from sanlab.cli import main
from sanlab.config import dump_config, validate
from sanlab.data.synthetic import write_tagging_corpus
from sanlab.errors import ConfigError
from sanlab.runs import load_trained, train_run
from sanlab.runs.resume import load_run_config
from sanlab.runs.trained import select_checkpoint


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory):
    from training_fixtures import make_reverse_config

    root = tmp_path_factory.mktemp("mt")
    config = make_reverse_config(root, max_steps=12, valid_every=4, keep_last=3, keep_best=3)
    train_run(config, root / "run", quiet=True)
    return root / "run"


def test_average_is_the_fp32_mean_of_the_last_checkpoints(translation_run):
    assert main(["average", "--run", str(translation_run), "--last", "3"]) == 0
    steps = sorted((translation_run / "checkpoints").glob("step-*"))[-3:]
    weights = [load_file(str(s / "model.safetensors")) for s in steps]
    averaged = load_file(str(translation_run / "averaged" / "model.safetensors"))
    assert averaged.keys() == weights[0].keys()  # no tensor dropped
    for name, value in averaged.items():
        assert value.dtype == weights[0][name].dtype
        torch.testing.assert_close(value, sum(w[name] for w in weights) / 3)


def test_average_refuses_tensors_of_other_shapes_and_keeps_integer_ones_from_the_newest(tmp_path):
    from sanlab.errors import ConfigError
    from sanlab.training.average import average_weights

    def checkpoint(name, **tensors):
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
        return tmp_path / name

    a = checkpoint("a", w=torch.ones(2, 3), steps=torch.tensor([4]))
    b = checkpoint("b", w=torch.zeros(2, 3), steps=torch.tensor([8]))
    mean = average_weights([a, b])
    assert mean["w"].eq(0.5).all() and mean["steps"].tolist() == [8] and mean["steps"].dtype == torch.int64
    # --best N lists them best first: the counter is the newest checkpoint's (by the step its meta.json records)
    (a / "meta.json").write_text('{"step": 20}')
    (b / "meta.json").write_text('{"step": 10}')
    assert average_weights([b, a])["steps"].tolist() == [4] and average_weights([a, b])["steps"].tolist() == [4]
    row = checkpoint("row", w=torch.zeros(1, 3), steps=torch.tensor([8]))  # [2, 3] + [1, 3] broadcasts, silently
    with pytest.raises(ConfigError, match="w is torch.float32 of shape \\[1, 3\\], .* has torch.float32 of shape"):
        average_weights([a, row])


def test_average_replaces_only_an_averaged_checkpoint(translation_run, capsys):
    """--output may replace an earlier average, never a run, its checkpoints or a training checkpoint."""
    assert main(["average", "--run", str(translation_run), "--last", "2"]) == 0  # replaces the earlier average
    step = sorted((translation_run / "checkpoints").glob("step-*"))[-1]
    before = sorted(p.relative_to(translation_run) for p in translation_run.rglob("*"))
    for target, why in ((translation_run, f"{translation_run}: exists and is not an averaged checkpoint"),
                        (translation_run / "checkpoints",
                         f"--output {translation_run / 'checkpoints'}: is checkpoints, a name the run keeps for its files"),
                        (step, f"{step}: --output may not be named {step.name!r}")):
        assert main(["average", "--run", str(translation_run), "--last", "2", "--output", str(target)]) == 2
        assert why in capsys.readouterr().err
    assert sorted(p.relative_to(translation_run) for p in translation_run.rglob("*")) == before


def test_average_never_replaces_an_average_holding_the_users_files(translation_run, tmp_path, capsys):
    output = tmp_path / "my avg"
    assert main(["average", "--run", str(translation_run), "--last", "2", "--output", str(output)]) == 0
    (output / "NOTES.md").write_text("keep me")
    assert main(["average", "--run", str(translation_run), "--last", "2", "--output", str(output)]) == 2
    assert "holds files sanlab did not write (NOTES.md); refusing to replace it" in capsys.readouterr().err
    assert (output / "NOTES.md").read_text() == "keep me"


def test_an_average_is_named_by_its_checkpoints_and_flagged_when_the_run_moved_on(translation_run, capsys, caplog,
                                                                                  monkeypatch):
    """meta.json names the averaged checkpoints by directory name (another spelling of the run's path changes
    nothing) and how they were chosen; once the run's last N are others, loading the average warns. The library
    warns through logging (``sanlab.runs.trained``: a Python user filters or captures it; it printed to stderr
    itself), the CLI prints it as "WARNING: ..." on stderr, once."""
    import json
    import logging
    import os

    assert main(["average", "--run", str(translation_run), "--last", "2"]) == 0
    meta = json.loads((translation_run / "averaged" / "meta.json").read_text())
    last = sorted(p.name for p in (translation_run / "checkpoints").glob("step-*"))[-2:]
    assert (meta["averaged"], meta["selection"]) == (last, "last 2")
    elsewhere = os.path.relpath(translation_run)  # the same run, spelled another way
    assert main(["average", "--run", elsewhere, "--last", "2"]) == 0
    assert json.loads((translation_run / "averaged" / "meta.json").read_text())["averaged"] == last
    capsys.readouterr()
    load_trained(translation_run, checkpoint="averaged")
    assert "WARNING" not in capsys.readouterr().err and not caplog.records
    meta["averaged"] = [last[0], "step-00000001"]  # as if the run had saved other checkpoints since
    (translation_run / "averaged" / "meta.json").write_text(json.dumps(meta))
    load_trained(translation_run, checkpoint="averaged")
    said = (f"{translation_run / 'averaged'} averages {last[0]}, step-00000001 (the last 2 when it was written); "
            f"the run's last 2 are now {', '.join(last)}: run `sanlab average` again for those")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("sanlab.runs.trained", logging.WARNING,
                                                                              said)]
    assert capsys.readouterr().err == ""  # (the caller's logging shows it, or Python's last resort when it has none)
    caplog.clear()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\n")))
    assert main(["translate", "--run", str(translation_run), "--checkpoint", "averaged", "--beam", "1"]) == 0
    assert capsys.readouterr().err == f"WARNING: {said}\n"
    assert not logging.getLogger("sanlab").handlers  # (the CLI's, only while a command runs: none piles up)
    assert main(["average", "--run", str(translation_run), "--last", "2"]) == 0  # (the fixture's state again)


def test_average_output_may_not_take_the_name_of_a_runs_checkpoint(translation_run, tmp_path, capsys):
    """`evaluate --checkpoint X/best` names its records eval-best.json: they would replace the run's own."""
    for name in ("best", "last", "averaged", "step-00000004", "best-bf16"):
        assert main(["average", "--run", str(translation_run), "--last", "2", "--output", str(tmp_path / name)]) == 2
        assert f"--output may not be named {name!r}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    own = translation_run / "averaged"  # the run's own average, by its path: the default's place
    assert main(["average", "--run", str(translation_run), "--last", "2", "--output", str(own)]) == 0


def test_evaluating_a_directory_from_elsewhere_named_like_a_runs_checkpoint_is_refused(translation_run, tmp_path):
    """evaluate --checkpoint X/best would write eval-best.json and replace (and delete) the run's own records."""
    import shutil

    from sanlab.errors import ConfigError
    from sanlab.runs import evaluate_run

    step = sorted((translation_run / "checkpoints").glob("step-*"))[-1]
    before = sorted(p.name for p in translation_run.iterdir())
    borrowed = tmp_path / "best"
    shutil.copytree(step, borrowed)
    with pytest.raises(ConfigError, match=f"--checkpoint {borrowed}: a directory outside .* named like one of its "):
        evaluate_run(translation_run, checkpoint=str(borrowed), splits=["valid"])
    assert sorted(p.name for p in translation_run.iterdir()) == before
    shutil.move(str(borrowed), str(tmp_path / "my-copy"))  # another name: evaluated, under its own records
    evaluate_run(translation_run, checkpoint=str(tmp_path / "my-copy"), splits=["valid"])
    assert (translation_run / "eval-my-copy.json").is_file()


def test_average_output_leaves_the_directories_beside_it_alone(translation_run, tmp_path):
    """--output may be anywhere: the staging and set-aside names beside it are new ones, never a user's
    ``.NAME.tmp`` or ``.NAME.old`` emptied or replaced."""
    output = tmp_path / "mine" / "avg"
    output.parent.mkdir()
    for name in (".avg.tmp", ".avg.old"):
        (output.parent / name).mkdir()
        (output.parent / name / "notes.txt").write_text("keep me")
    for _ in range(2):  # written, then replaced
        assert main(["average", "--run", str(translation_run), "--last", "2", "--output", str(output)]) == 0
        assert sorted(p.name for p in output.parent.iterdir()) == [".avg.old", ".avg.tmp", "avg"]
    assert all((output.parent / n / "notes.txt").read_text() == "keep me" for n in (".avg.tmp", ".avg.old"))
    assert sorted(p.name for p in output.iterdir()) == ["meta.json", "model.safetensors"]


def test_translate_reads_stdin_and_writes_one_line_per_input(translation_run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\nd e\n")))
    assert main(["translate", "--run", str(translation_run), "--beam", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\n")))
    assert main(["translate", "--run", str(translation_run), "--beam", "3", "--n-best", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(line.startswith("0 ||| ") for line in lines)


def test_a_line_the_subword_model_encodes_to_nothing_gets_an_empty_translation(translation_run, monkeypatch, capsys):
    """A zero-width space or a stray BOM is not blank to str.strip() but encodes to no piece: decoding it would
    translate a bare end of sentence, which training never shows the model."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\u200b\na b c\n\ufeff\n".encode())))
    assert main(["translate", "--run", str(translation_run), "--beam", "2"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert lines[0] == "" and lines[2] == "" and lines[3:] == [""]


def test_translate_n_best_defaults_to_the_runs_decode_config(translation_run, tmp_path, monkeypatch, capsys):
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["decode"].update(beam=3, n_best=2)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\nd e\n")))
    assert main(["translate", "--run", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "1"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\n")))
    assert main(["translate", "--run", str(run), "--beam", "1"]) == 2  # n_best 2 from the run: say what to pass
    assert "--beam 1 cannot return the run's decode.n_best = 2 hypotheses; pass --n-best" in capsys.readouterr().err


def test_batch_sentences_sets_how_many_sentences_decode_at_a_time(translation_run, monkeypatch, capsys):
    """``--batch-sentences`` on translate and evaluate: the same translations (plain attention does not depend on
    its batch), the batches of that size, and the setting recorded with the scores."""
    import sanlab.tasks.translation as translation

    batches, real = [], translation.beam_search

    def counting(*args, batch_size, **kw):
        batches.append(batch_size)
        return real(*args, batch_size=batch_size, **kw)

    monkeypatch.setattr(translation, "beam_search", counting)
    text = b"a b c\nd e\nf g h i\n"
    outputs = []
    for extra in ([], ["--batch-sentences", "1"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))
        assert main(["translate", "--run", str(translation_run), "--beam", "2", *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and batches == [3, 1, 1, 1]
    assert main(["evaluate", "--run", str(translation_run), "--split", "valid", "--batch-sentences", "2"]) == 0
    assert json.loads((translation_run / "eval-best.json").read_text())["valid"]["decode"]["batch_sentences"] == 2
    assert main(["evaluate", "--run", str(translation_run), "--split", "valid"]) == 0  # as the run says again
    with pytest.raises(SystemExit):  # argparse's own refusal
        main(["translate", "--run", str(translation_run), "--batch-sentences", "0"])
    assert "argument --batch-sentences: expected a number >= 1, got 0" in capsys.readouterr().err


def test_a_batch_of_sentences_that_does_not_fit_the_device_stops_with_what_to_try(translation_run, monkeypatch,
                                                                                  capsys):
    import sanlab.tasks.translation as translation

    def out_of_memory(*args, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 6.00 GiB.")

    monkeypatch.setattr(translation, "beam_search", out_of_memory)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\nd e\n")))
    assert main(["translate", "--run", str(translation_run), "--beam", "2", "--output", "-"]) == 2
    err = capsys.readouterr().err
    assert "sanlab translate: error: decoding 2 sentences of up to 4 subword tokens from <stdin> with beam 2 ran out " \
           "of memory on cpu: CUDA out of memory. Tried to allocate 6.00 GiB. Decode fewer sentences at a time " \
           "(--batch-sentences on translate and evaluate; the run's decode.batch_sentences is 64)" in err


def test_a_run_trained_deterministically_decodes_deterministically(tmp_path, monkeypatch, capsys):
    """``train.deterministic`` holds for what decodes the run afterwards (translate, evaluate), not only for its
    validation; and is off again after."""
    from training_fixtures import make_reverse_config

    import sanlab.tasks.translation as translation

    run = tmp_path / "run"
    train_run(make_reverse_config(tmp_path, max_steps=2, valid_every=2, deterministic=True), run, quiet=True)
    seen, real = [], translation.beam_search

    def watching(*args, **kw):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real(*args, **kw)

    monkeypatch.setattr(translation, "beam_search", watching)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b c\n")))
    assert main(["translate", "--run", str(run), "--beam", "2"]) == 0
    assert main(["evaluate", "--run", str(run), "--split", "valid"]) == 0
    assert seen and all(seen) and not torch.are_deterministic_algorithms_enabled()


def test_evaluate_names_each_split_of_the_run_once(translation_run, capsys):
    assert main(["evaluate", "--run", str(translation_run), "--split", "nosuch"]) == 2
    assert "unknown split(s) ['nosuch']; this run has: valid\n" in capsys.readouterr().err  # not "valid, valid"


def test_evaluate_prints_sacrebleu_signature_and_its_scores(translation_run, capsys):
    import sacrebleu

    from sanlab.data.parallel import read_parallel
    from sanlab.tasks.translation import read_hypotheses

    assert main(["evaluate", "--run", str(translation_run), "--checkpoint", "last"]) == 0
    out = capsys.readouterr().out
    assert "BLEU" in out and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in out
    saved = json.loads((translation_run / "eval-last.json").read_text())["valid"]
    config = load_trained(translation_run, checkpoint="last")[0]
    references = [t for _, t in read_parallel(config.data.valid.src, config.data.valid.tgt, keep_empty=True)]
    hypotheses = read_hypotheses(translation_run / "hyp-last-valid.txt")
    assert len(hypotheses) == len(references)  # line-aligned with the references
    assert saved["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert saved["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)


@pytest.mark.parametrize("beam", [1, 2, 5])
def test_translations_come_back_in_input_order_whatever_the_batching(translation_run, beam):
    """Length-sorted batches of 2 and of all, against one sentence at a time: the same translations in input
    order, also for duplicates (equal lengths: the sort must keep them apart), one-token and blank lines."""
    from sanlab.tasks.translation import translate

    config, model, spm = load_trained(translation_run, checkpoint="last")
    # lengths out of order, an empty and a blank one, a line repeated, one-token lines
    sentences = ["a b c d e f", "b", "c d e", "", "d e f a b c d", "e f", "c d e", "  ", "a", "b", "a b c d e f"]
    decode = config.decode.updated(beam=beam)
    alone = [translate(model, spm, [s], decode=decode.updated(batch_sentences=1))[0] for s in sentences]
    for size in (2, len(sentences)):
        assert translate(model, spm, sentences, decode=decode.updated(batch_sentences=size)) == alone
    assert alone[3] == alone[7] == "" and alone[2] == alone[6] and alone[0] == alone[10]
    assert len(set(alone)) > 2  # outputs differ, so a shuffled order would show


def test_bad_decode_settings_and_the_wrong_kind_of_run_are_one_line_errors(translation_run, tmp_path, capsys):
    run = str(translation_run)
    (tmp_path / "in.txt").write_text("a b c\n")
    cases = [(["translate", "--run", run, "--input", str(tmp_path / "in.txt"), "--n-best", "8"],
              "invalid decode settings: decode: n_best 8 is more than the beam of 2 can return"),
             (["translate", "--run", run, "--input", str(tmp_path / "in.txt"), "--beam", "0"],
              "decode.beam: Input should be greater than or equal to 1"),
             (["translate", "--run", run, "--input", str(tmp_path / "in.txt"), "--beam", "-1"],
              "decode.beam: Input should be greater than or equal to 1"),
             (["translate", "--run", run, "--input", str(tmp_path / "in.txt"), "--length-penalty", "nan"],
              "decode.length_penalty: Input should be a finite number"),
             (["translate", "--run", run, "--input", str(tmp_path / "in.txt"), "--length-penalty=-inf"],
              "decode.length_penalty: Input should be a finite number"),
             (["tag", "--run", run, "--input", str(tmp_path / "in.txt")], "is a translation run; `sanlab tag` needs"),
             (["translate", "--run", run, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path / "no" / "o")],
              f"--output {tmp_path / 'no' / 'o'}: the directory {tmp_path / 'no'} does not exist"),
             (["tag", "--run", run, "--input", str(tmp_path / "in.txt"), "--output", str(tmp_path)],
              f"--output {tmp_path}: is a directory; give a file name"),
             (["translate", "--run", str(tmp_path / "in.txt")], "not a run directory"),
             (["average", "--run", run, "--last", "0"], "expected a number >= 1, got 0")]
    for argv, message in cases:
        with pytest.raises(SystemExit) if argv[0] == "average" else contextlib.nullcontext():
            assert main(argv) == 2
        assert message in capsys.readouterr().err, argv


def test_a_checkpoint_pruned_while_it_is_loaded_is_chosen_again(translation_run, tmp_path, monkeypatch):
    """A training process may prune the chosen checkpoint between choosing and reading it: the checkpoint
    code's own rename-away (not a stand-in error), then the next best is loaded."""
    import shutil

    from sanlab.training import checkpoint as ckpt

    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    real, read = ckpt.load_model, []

    def pruned_before_reading(model, filename):
        read.append(Path(filename).parent.name)
        if len(read) == 1:
            ckpt._remove(Path(filename).parent)
        return real(model, filename)

    monkeypatch.setattr(ckpt, "load_model", pruned_before_reading)
    chosen_first = select_checkpoint(run, "best", load_run_config(run)).name
    load_trained(run, checkpoint="best")
    assert read[0] == chosen_first and len(read) == 2 and read[1] != chosen_first
    assert not (run / "checkpoints" / chosen_first).exists()

    def always_pruned(model, filename):  # and a newer one written meanwhile, as a training process does
        chosen = Path(filename).parent
        shutil.copytree(chosen, chosen.with_name(f"step-{int(chosen.name.removeprefix('step-')) + 1000:08d}"))
        ckpt._remove(chosen)
        return real(model, filename)

    monkeypatch.setattr(ckpt, "load_model", always_pruned)
    with pytest.raises(ConfigError, match="disappeared while it was loaded"):
        load_trained(run, checkpoint="best")


def test_a_checkpoint_without_its_weights_is_damaged_not_pruned(translation_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    chosen = select_checkpoint(run, "best", load_run_config(run))
    (chosen / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no model.safetensors"):
        load_trained(run, checkpoint="best")


def test_listing_skips_a_checkpoint_pruned_while_listed(translation_run, tmp_path, monkeypatch):
    import shutil

    from sanlab.training import checkpoint as ckpt

    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    directory = run / "checkpoints"
    names = sorted(p.name for p in directory.glob("step-*"))
    real = ckpt.read_meta

    def pruned_while_listed(checkpoint):
        if checkpoint.name == names[0]:
            ckpt._remove(checkpoint)
        return real(checkpoint)

    monkeypatch.setattr(ckpt, "read_meta", pruned_while_listed)
    assert [Path(m["path"]).name for m in ckpt.complete_checkpoints(directory)] == names[1:]
    monkeypatch.setattr(ckpt, "read_meta", real)
    (directory / names[1] / "meta.json").unlink()  # still there, without its meta: damaged, an error
    with pytest.raises(ConfigError, match="checkpoint without meta.json") as raised:
        ckpt.complete_checkpoints(directory)
    # said to whichever command read the checkpoints (averaging them too), not only to a resume
    assert str(raised.value).endswith(f"move {names[1]} out of {directory} (or restore the file): the run's "
                                      "checkpoints are read only once it is whole or gone, and training then resumes "
                                      "from the checkpoint before it")


def test_run_directory_records_provenance(translation_run):
    meta = json.loads((translation_run / "meta.json").read_text())
    assert meta["seed"] == 3 and meta["versions"]["torch"] and "git_revision" in meta
    assert (translation_run / "subword.model").exists() and (translation_run / "metrics.jsonl").exists()
    assert any((translation_run / "tensorboard").iterdir())


def test_bf16_autocast_computes_in_bf16_keeps_fp32_weights_and_learns(tmp_path):
    from training_fixtures import make_reverse_config

    seen = set()

    def record(module, args, output):
        if isinstance(module, torch.nn.Linear) and module.training:
            seen.add(output.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        config = make_reverse_config(tmp_path, max_steps=40, log_every=1, bf16=True, lr=3e-3)
        summary = train_run(config, tmp_path / "run", quiet=True)
    finally:
        hook.remove()
    assert summary["step"] == 40
    assert seen == {torch.bfloat16}  # every training matmul ran under autocast
    saved = load_file(str(sorted((tmp_path / "run" / "checkpoints").glob("step-*"))[-1] / "model.safetensors"))
    assert {w.dtype for w in saved.values()} == {torch.float32}
    losses = [r["loss"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
              if r["split"] == "train"]
    assert len(losses) == 40 and all(map(math.isfinite, losses))
    assert sum(losses[-5:]) < 0.8 * sum(losses[:5])


def test_tagger_pipeline(tmp_path, capsys):
    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 300, "dev": 40, "test": 40})
    config = validate({"task": "tagging", "data": {"train": str(data / "train.conllu"),
                                                    "dev": str(data / "dev.conllu"), "test": str(data / "test.conllu")},
                       "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1,
                                 "encoder": {"layers": 1}},
                       "train": {"max_epochs": 2, "batch_size": 16, "progress": False}}, source="test")
    (tmp_path / "c.yaml").write_text(dump_config(config))
    assert main(["train", str(tmp_path / "c.yaml"), "--run", str(tmp_path / "run"), "--quiet"]) == 0
    assert main(["evaluate", "--run", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "== dev" in out and "== test" in out and "ambiguous" in out
    (tmp_path / "in.txt").write_text("the dog runs .\n")
    assert main(["tag", "--run", str(tmp_path / "run"), "--input", str(tmp_path / "in.txt")]) == 0
    tagged = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert [line.split("\t")[0] for line in tagged] == ["the", "dog", "runs", "."]
    # plain text: block n is line n (a blank line gives an empty block); tokens split at spaces and tabs only
    (tmp_path / "in.txt").write_text("the dog runs .\n\n  \nthe\tcat\u00a0cat  runs\n")
    assert main(["tag", "--run", str(tmp_path / "run"), "--input", str(tmp_path / "in.txt")]) == 0
    words = [line.split("\t")[0] for line in capsys.readouterr().out.split("\n")]
    assert words == ["the", "dog", "runs", ".", "", "", "", "the", "cat\u00a0cat", "runs", "", ""]
    # untagged CoNLL-U ("_" in UPOS), the usual input of a tagger: CoNLL-U back, UPOS filled in, every other
    # line and column as it was (comments, a multiword token, an empty node, LEMMA and MISC)
    rows = ["# sent_id = 1", "# text = the dog runs.", "1\tthe\tTHE", "2\tdog\tDOG", "3-4\truns.\t_",
            "3\truns\tRUNS\t_\t_\t_\t_\t_\t_\tSpaceAfter=No", "4\t.\t.", "4.1\tgone\t_\t_\t_\t_\t_\t_\t4:dep\t_",
            "", "", "# sent_id = 2", "1\tdog\t_"]
    conllu_text = "".join(r + ("\t_" * (9 - r.count("\t")) if r and not r.startswith("#") else "") + "\n"
                          for r in rows)  # word lines completed to ten columns with "_"
    (tmp_path / "in.conllu").write_text(conllu_text)
    assert main(["tag", "--run", str(tmp_path / "run"), "--input", str(tmp_path / "in.conllu")]) == 0
    out = capsys.readouterr().out
    parsed = conllu.parse(out)
    assert [s.metadata["sent_id"] for s in parsed] == ["1", "2"]
    words = [t for t in parsed[0] if isinstance(t["id"], int)]
    assert [(t["form"], t["lemma"]) for t in words] == [("the", "THE"), ("dog", "DOG"), ("runs", "RUNS"), (".", ".")]
    assert all(t["upos"] not in (None, "_") for t in words) and words[2]["misc"] == {"SpaceAfter": "No"}
    assert [t["form"] for t in parsed[0] if not isinstance(t["id"], int)] == ["runs.", "gone"]  # kept, untagged
    body = lambda text: [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]  # noqa: E731
    assert [c[:3] + c[4:] for c in body(out)] == [c[:3] + c[4:] for c in body(conllu_text)]  # only UPOS changed
    comments = lambda text: [line for line in text.splitlines() if line.startswith("#")]  # noqa: E731
    assert comments(out) == comments(conllu_text)
    assert out.endswith("\n\n") and "\n\n\n" not in out  # one blank line after each sentence
    # the same CoNLL-U under another name, and on standard input: recognised by its columns, not tagged as text
    (tmp_path / "in.conll").write_text(conllu_text)
    assert main(["tag", "--run", str(tmp_path / "run"), "--input", str(tmp_path / "in.conll")]) == 0
    assert capsys.readouterr().out == out
    import io
    import sys

    class Stdin:
        buffer = io.BytesIO(conllu_text.encode())

    for dash in ([], ["--input", "-"]):  # -: standard input, as without --input
        real, sys.stdin = sys.stdin, Stdin()
        Stdin.buffer.seek(0)
        try:
            assert main(["tag", "--run", str(tmp_path / "run"), *dash]) == 0
        finally:
            sys.stdin = real
        assert capsys.readouterr().out == out
    # user mistakes are one line each, not a traceback
    assert main(["tag", "--run", str(tmp_path / "run"), "--input", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt: input file not found" in capsys.readouterr().err
    assert main(["tag", "--run", str(tmp_path / "run"), "--input", str(data)]) == 2
    assert f"{data}: is a directory; give an input file" in capsys.readouterr().err
    assert main(["evaluate", "--run", str(tmp_path / "run"), "--split", "tset"]) == 2
    assert "unknown split 'tset'; this run has: dev, test" in capsys.readouterr().err


def test_separate_source_and_target_vocabularies(tmp_path, capsys):
    from training_fixtures import make_reverse_config

    config = make_reverse_config(tmp_path, max_steps=4)
    raw = yaml.safe_load(dump_config(config))
    raw["data"]["subword"]["joint"] = False
    with pytest.raises(ConfigError, match="share_embeddings needs data.subword.joint"):
        validate(raw, source="test")
    raw["model"]["share_embeddings"] = False
    (tmp_path / "sep.yaml").write_text(yaml.safe_dump(raw))
    # the target side gets its own words: a model of one side must not know the other's
    (tmp_path / "train.tgt").write_text((tmp_path / "train.tgt").read_text().upper())
    assert main(["train", str(tmp_path / "sep.yaml"), "--run", str(tmp_path / "run"), "--quiet"]) == 0
    run = tmp_path / "run"
    assert (run / "subword-src.model").exists() and (run / "subword-tgt.model").exists()
    assert not (run / "subword.model").exists()
    _, model, spm = load_trained(run)
    assert not spm.joint and model.src_embed is not model.tgt_embed
    assert spm.src.encode("A B") != spm.tgt.encode("A B")
    (tmp_path / "in.txt").write_text("a b c\n")
    capsys.readouterr()
    assert main(["translate", "--run", str(run), "--input", str(tmp_path / "in.txt")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out == out.upper()  # written with the target model's (upper-case) pieces
