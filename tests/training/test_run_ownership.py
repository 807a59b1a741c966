"""Issue 27: nothing outside a sanlab run directory is deleted or rewritten, changed data is not resumed
on silently, and a failed start leaves no half-made run."""

import json
import os
import shutil

import pytest

from sanlab.cli import main
from sanlab.config import dump_config
from sanlab.errors import ConfigError, DataError
from sanlab.runs import train_run
from sanlab.training.rundir import RUN_MARKER


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _project(tmp_path):
    """A directory that is not a run: the user's own config.yaml, code and notes."""
    other = tmp_path / "other"
    (other / "src").mkdir(parents=True)
    (other / "config.yaml").write_text("foo: bar\n")
    (other / "src" / "main.py").write_text("print(1)\n")
    (other / "README").write_text("notes\n")
    return other


def test_overwrite_never_empties_a_directory_sanlab_did_not_make(tmp_path, tiny_translation):
    other = _project(tmp_path)
    before = _tree(other)
    with pytest.raises(ConfigError, match=r"other: not a sanlab run directory .*\(README, config.yaml, src\)"):
        train_run(tiny_translation(max_steps=1), other, overwrite=True, quiet=True)
    with pytest.raises(ConfigError, match=r"other: not a sanlab run directory and not empty \(holds README, "
                                          r"config.yaml, src\)"):
        train_run(tiny_translation(max_steps=1), other, quiet=True)
    assert [p for p in _tree(other) if p != ".lock"] == before
    assert (other / "config.yaml").read_text() == "foo: bar\n"


def test_the_current_directory_its_parents_and_a_repository_are_never_runs(tmp_path, tiny_translation, monkeypatch):
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    monkeypatch.chdir(project / "sub")
    for where in (".", "..", str(tmp_path)):
        with pytest.raises(ConfigError, match="a run needs a directory of its own"):
            train_run(tiny_translation(max_steps=1), where, overwrite=True, quiet=True)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"repo: holds .git \(a repository\)"):
        train_run(tiny_translation(max_steps=1), repo, quiet=True)
    assert not (project / "sub" / ".lock").exists() and not (repo / ".lock").exists()


@pytest.mark.parametrize("name", ["train.log", "subword.model", "subword-tgt.model"])
def test_a_symbolic_link_in_a_new_run_is_refused_and_its_target_never_written(tmp_path, tiny_translation, name):
    """sanlab makes no links in a run directory: one named like a run's file (a user's own subword model linked in)
    would have its target, outside the run, appended to or replaced by what training writes there."""
    mine = tmp_path / "mine.model"
    mine.write_text("the user's own file\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(mine)
    with pytest.raises(ConfigError, match=rf"run: not a sanlab run directory and not empty \(holds {name}\)"):
        train_run(tiny_translation(max_steps=1), run, quiet=True)
    assert mine.read_text() == "the user's own file\n"
    assert (run / name).is_symlink()


def test_a_recipe_named_config_yaml_is_never_rewritten(tmp_path, tiny_translation, monkeypatch, capsys):
    """`sanlab train config.yaml --run .` in the recipe's directory, or `--run` naming that directory."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    recipe = recipes / "config.yaml"
    recipe.write_text("# my recipe\n" + dump_config(tiny_translation(max_steps=1)))
    text = recipe.read_text()
    monkeypatch.chdir(recipes)
    assert main(["train", "config.yaml", "--run", ".", "--quiet"]) == 2
    assert "is the current directory" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    assert main(["train", "recipes/config.yaml", "--run", "recipes", "--quiet"]) == 2
    assert "not a sanlab run directory and not empty (holds config.yaml)" in capsys.readouterr().err
    assert recipe.read_text() == text and sorted(p.name for p in recipes.iterdir()) == [".lock", "config.yaml"]


def test_overwrite_lists_files_sanlab_did_not_write_and_deletes_only_a_runs_own(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    assert json.loads((run / "meta.json").read_text())[RUN_MARKER] == 1
    (run / "notes.txt").write_text("mine\n")
    (run / "plots").mkdir()
    with pytest.raises(ConfigError, match=r"holds files sanlab did not write \(notes.txt, plots\)"):
        train_run(tiny_translation(max_steps=1), run, overwrite=True, quiet=True)
    assert (run / "notes.txt").exists() and (run / "checkpoints").exists()
    (run / "notes.txt").unlink()
    (run / "plots").rmdir()
    train_run(tiny_translation(max_steps=1), run, overwrite=True, quiet=True)
    assert [s["from_step"] for s in json.loads((run / "meta.json").read_text())["sessions"]] == [0]


def test_overwrite_looks_inside_the_directories_it_deletes_whole(tmp_path, tiny_translation):
    """checkpoints/, averaged/ and tensorboard/ are deleted whole: what sanlab did not write inside them (a copy
    of a checkpoint kept for a paper, notes beside the average) is listed and refused like a top-level file."""
    from sanlab.runs import average_run

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    average_run(run, last=2)
    checkpoints = run / "checkpoints"
    (checkpoints / ".step-00000002.tmp").mkdir()  # sanlab's temporary names are its own (a crash leaves them)
    (checkpoints / ".latest.json.x1y2.tmp").write_text("{}")
    foreign = {"averaged/NOTES.txt": "notes", "checkpoints/paper-final/model.safetensors": "a copy",
               "checkpoints/step-00000002/notes.txt": "mine", "checkpoints/step-00000001.bak": "a copy",
               "tensorboard/plots/loss.png": "a plot"}
    for name, text in foreign.items():
        (run / name).parent.mkdir(exist_ok=True)
        (run / name).write_text(text)
    with pytest.raises(ConfigError, match=r"holds files sanlab did not write \(averaged/NOTES.txt, "
                                          r"checkpoints/paper-final, checkpoints/step-00000001.bak, "
                                          r"checkpoints/step-00000002/notes.txt, tensorboard/plots\); --overwrite"):
        train_run(tiny_translation(max_steps=2, valid_every=1), run, overwrite=True, quiet=True)
    assert all((run / name).read_text() == text for name, text in foreign.items())
    assert (checkpoints / "step-00000002" / "model.safetensors").is_file()  # nothing deleted
    for name in ("averaged/NOTES.txt", "checkpoints/paper-final", "checkpoints/step-00000001.bak",
                 "checkpoints/step-00000002/notes.txt", "tensorboard/plots"):
        shutil.move(run / name, tmp_path / name.replace("/", "-"))
    train_run(tiny_translation(max_steps=2, valid_every=1), run, overwrite=True, quiet=True)
    assert not (run / "averaged").exists() and not (checkpoints / ".step-00000002.tmp").exists()


def _as_legacy(run):
    """What a run made before the marker looks like (the committed cells of results/compare/)."""
    meta = json.loads((run / "meta.json").read_text())
    for key in (RUN_MARKER, "data_fingerprint"):
        meta.pop(key, None)
    (run / "meta.json").write_text(json.dumps(meta))
    for name in ("done.json", "compare-eval.json", "hyp-best-test.txt"):
        (run / name).write_text("{}\n")


def test_a_run_made_before_the_marker_resumes_records_its_data_and_may_be_overwritten(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    _as_legacy(run)
    summary = train_run(tiny_translation(max_steps=2), run, quiet=True)
    assert summary["step"] == 2
    meta = json.loads((run / "meta.json").read_text())
    assert str(tmp_path / "train.src") in meta["data_fingerprint"] and meta[RUN_MARKER] == 1  # recorded on resume
    _as_legacy(run)
    train_run(tiny_translation(max_steps=1), run, overwrite=True, quiet=True)
    assert not (run / "done.json").exists() and json.loads((run / "meta.json").read_text())[RUN_MARKER] == 1


def test_resuming_on_changed_data_is_an_error_naming_the_file_unless_allowed(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2), run, quiet=True)
    train = tmp_path / "train.src"
    copy = train.read_bytes()
    shutil.copy(train, tmp_path / "x")  # a copied file: new mtime, same bytes, resumes
    os.replace(tmp_path / "x", train)
    os.utime(train, (1e9, 1e9))
    assert train_run(tiny_translation(max_steps=3), run, quiet=True)["step"] == 3
    train.write_bytes(copy.replace(b"a", b"b", 1))  # same size, other content
    with pytest.raises(DataError, match=rf"{train}: changed since this run last trained on it \(same size, other "
                                        r"bytes; modified .*\).*--allow-changed-data"):
        train_run(tiny_translation(max_steps=4), run, quiet=True)
    summary = train_run(tiny_translation(max_steps=4), run, quiet=True, allow_changed_data=True)
    assert summary["step"] == 4
    assert f"WARNING: training data changed since this run last trained on it (--allow-changed-data): {train}" in \
        (run / "train.log").read_text()
    assert train_run(tiny_translation(max_steps=5), run, quiet=True)["step"] == 5  # the new data is now the run's


def test_a_data_error_at_the_start_leaves_no_half_made_run(tmp_path, tiny_translation):
    """A missing or misaligned test set is found when training starts (not by `evaluate` afterwards), and the
    run directory is left as it was: absent, or empty."""
    from sanlab.config import validate

    raw = tiny_translation(max_steps=1).model_dump(mode="json")
    raw["data"]["test"] = {"t": {"src": str(tmp_path / "test.src"), "tgt": str(tmp_path / "test.tgt")}}
    config = validate(raw, source="test")
    (tmp_path / "test.src").write_text("a b\nc d\n")
    (tmp_path / "test.tgt").write_text("b a\n")
    run = tmp_path / "run"
    with pytest.raises(DataError, match=r"test.src.*line counts differ"):
        train_run(config, run, quiet=True)
    assert not run.exists()
    run.mkdir()
    (tmp_path / "test.tgt").unlink()
    with pytest.raises(DataError, match=r"test.tgt: file not found"):
        train_run(config, run, quiet=True)
    assert list(run.iterdir()) == [run / ".lock"]
    (tmp_path / "test.tgt").write_text("b a\nd c\n")
    assert train_run(config, run, quiet=True)["step"] == 1  # fixed: a plain start, no --overwrite needed


def test_a_run_path_below_a_file_is_a_message(tmp_path, tiny_translation):
    (tmp_path / "afile.txt").write_text("x\n")
    with pytest.raises(ConfigError, match=r"afile.txt/sub: .*afile.txt is a file, not a directory"):
        train_run(tiny_translation(max_steps=1), tmp_path / "afile.txt" / "sub", quiet=True)


def test_a_learning_rate_beyond_float32_stops_with_a_message(tmp_path, tiny_translation):
    from sanlab.errors import TrainingError

    config = tiny_translation(max_steps=2, lr=1e39, schedule="constant", warmup_steps=0)
    with pytest.raises(TrainingError, match=r"update at step 1 overflows float32 \(learning rate 1e\+39\).*lower "
                                            "learning rate"):
        train_run(config, tmp_path / "run", quiet=True)


def test_a_missing_state_pt_of_the_only_checkpoint_is_a_message(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    state = run / "checkpoints" / "step-00000001" / "state.pt"
    state.unlink()
    with pytest.raises(ConfigError, match=rf"no intact checkpoint to resume from: {state}: missing"):
        train_run(tiny_translation(max_steps=2), run, quiet=True)


def test_checkpoint_names_and_average_counts_say_what_there_is(tmp_path, tiny_translation, capsys):
    from sanlab.runs import average_run, load_trained

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1, keep_last=3), run, quiet=True)
    with pytest.raises(ConfigError, match=r"asked for 3 checkpoints, the run has saved only 1 so far \(of the 3 it "
                                          r"keeps\); average fewer, or train on"):
        average_run(run, last=3)
    assert main(["evaluate", "--run", str(run), "--checkpoint", "nosuch"]) == 2
    assert ("--checkpoint nosuch: no such checkpoint of " in (err := capsys.readouterr().err)
            and "give best, last, averaged (after `sanlab average`), a step-N name of this run (step-00000001)" in err)
    assert load_trained(run, checkpoint="step-00000001")[1] is not None
    assert load_trained(run, checkpoint="step-1")[1] is not None  # the step number without the zeros


def test_copies_files_and_averages_among_the_checkpoints_are_not_checkpoints(tmp_path, tiny_translation, capsys):
    """A backup copy step-00000003.bak is not averaged with its original, a file step-list.txt stops nothing, and an
    average may not be written among the checkpoints (training reads only step-N folders there, but a folder it
    did not write would stop a later `--overwrite` and the run's own `average`)."""
    from sanlab.runs import average_run
    from sanlab.runs.trained import load_checkpoint

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=3, valid_every=1, keep_last=3), run, quiet=True)
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step-00000003", checkpoints / "step-00000003.bak")
    (checkpoints / "step-list.txt").write_text("my notes\n")
    averaged = json.loads((average_run(run, last=2) / "meta.json").read_text())["averaged"]
    assert averaged == ["step-00000002", "step-00000003"]
    inside = checkpoints / "step-avg"
    assert main(["average", "--run", str(run), "--last", "2", "--output", str(inside)]) == 2
    assert f"--output {inside}: inside {checkpoints}, where training keeps its own checkpoints" in capsys.readouterr().err
    assert not inside.exists()
    assert load_checkpoint(run, checkpoint="last")[4]["checkpoint"] == "checkpoints/step-00000003"
    assert train_run(tiny_translation(max_steps=4, valid_every=1, keep_last=3), run, quiet=True)["step"] == 4
    assert (checkpoints / "step-00000003.bak").is_dir() and (checkpoints / "step-list.txt").is_file()


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """A tiny run of two validated steps, trained once for the module's tests that copy it before use."""
    import torch

    from training_fixtures import make_reverse_config

    torch.set_num_threads(1)  # (built before the function-scoped autouse fixture that sets it)
    root = tmp_path_factory.mktemp("two-step")
    train_run(make_reverse_config(root, max_steps=2, valid_every=1), root / "run", quiet=True)
    return root / "run"


@pytest.mark.parametrize("inside", ["other/checkpoints/avg", "other/averaged/avg", "other/tensorboard/avg",
                                    "run/averaged/avg", "run/tensorboard/avg"])
def test_an_average_is_never_written_into_a_directory_a_run_keeps_for_its_own_files(tmp_path, two_step_run,
                                                                                    capsys, inside):
    """`average --output` into another run's checkpoints/ (or any run's averaged/, tensorboard/): that run's
    `--overwrite` then refused it as holding files sanlab did not write, and its `average` refused to replace
    an averaged/ holding a directory."""
    from sanlab.training.rundir import check_overwritable

    run, other = tmp_path / "run", tmp_path / "other"
    shutil.copytree(two_step_run, run)
    shutil.copytree(run, other)
    for made in ("averaged", "tensorboard"):
        (run / made).mkdir(exist_ok=True)
        (other / made).mkdir(exist_ok=True)
    before = _tree(tmp_path)
    target = tmp_path / inside
    owner = tmp_path / inside.split("/")[0]
    assert main(["average", "--run", str(run), "--last", "2", "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"--output {target}: inside {target.parent}, " in err and f"(of the run {owner})" in err
    assert f"write the average elsewhere (by default, {run / 'averaged'}; or a new directory outside" in err
    assert _tree(tmp_path) == before
    check_overwritable(other)  # still a run that --overwrite may empty


def test_an_average_output_that_is_a_symbolic_link_is_refused_and_leaves_nothing_behind(tmp_path, two_step_run,
                                                                                        capsys):
    run, store = tmp_path / "run", tmp_path / "store"
    shutil.copytree(two_step_run, run)
    assert main(["average", "--run", str(run), "--last", "2", "--output", str(store / "avg")]) == 0
    link = tmp_path / "link"
    link.symlink_to(store / "avg")
    before = _tree(tmp_path)
    assert main(["average", "--run", str(run), "--last", "1", "--output", str(link)]) == 2
    assert f"{link}: is a symbolic link (to {store / 'avg'}); refusing to replace it" in capsys.readouterr().err
    assert _tree(tmp_path) == before  # no .link.XXXX.old beside it, the average it points to unchanged


def test_the_runs_average_named_by_its_path_is_flagged_when_the_run_moved_on(tmp_path, tiny_translation, caplog):
    """`--checkpoint RUN/averaged` is `--checkpoint averaged`: the same warning once the run's last N are others
    (logged by sanlab.runs.trained)."""
    import os

    from sanlab.runs import average_run, load_trained

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    average_run(run, last=1)
    train_run(tiny_translation(max_steps=3, valid_every=1), run, quiet=True)
    for spelled in ("averaged", str(run / "averaged"), os.path.relpath(run / "averaged")):
        caplog.clear()
        load_trained(run, checkpoint=spelled)
        said = [r.getMessage() for r in caplog.records if r.name == "sanlab.runs.trained"]
        assert len(said) == 1 and "averages step-00000002 (the last 1 when it was written); the run's last 1 are " \
            "now step-00000003" in said[0], said


def test_evaluating_a_run_with_no_checkpoint_says_so(tmp_path, tiny_translation):
    from sanlab.runs import load_trained, prepare_run_dir

    run = tmp_path / "run"
    prepare_run_dir(run, tiny_translation(max_steps=1), overwrite=False)  # e.g. a start interrupted early
    with pytest.raises(ConfigError, match="no checkpoint to load"):
        load_trained(run)


def test_translate_refuses_a_plain_string_and_more_hypotheses_than_the_beam(tmp_path, tiny_translation):
    from sanlab.runs import load_trained
    from sanlab.tasks.translation import translate

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    config, model, spm = load_trained(run)
    with pytest.raises(TypeError, match=r"translate\(\) and search_translations\(\) take a list of sentences, got one str"):
        translate(model, spm, "a b c", decode=config.decode)
    assert len(translate(model, spm, ["a b c"], decode=config.decode)) == 1
    with pytest.raises(ConfigError, match=f"n_best = {config.decode.beam + 1} is more than decode.beam"):
        translate(model, spm, ["a b c"], decode=config.decode, n_best=config.decode.beam + 1)


@pytest.mark.usefixtures("private_tmpdir")  # (the launch directory is removed)
def test_allow_changed_data_reaches_torchrun_workers_and_grid_cells(tmp_path, monkeypatch):
    """`train --nproc 2` passes the flag to its torchrun command; `compare` sets it for its worker processes,
    and only while it runs."""
    import sys

    from sanlab.experiments import compare
    from sanlab.runs import ALLOW_CHANGED_DATA_ENV
    from sanlab.training import launch

    seen = []
    stub = tmp_path / "torchrun.py"  # torchrun's stand-in: writes down the arguments it was given
    stub.write_text(f"import sys\nopen({str(tmp_path / 'argv')!r}, 'w').write('\\n'.join(sys.argv[1:]))\n")
    monkeypatch.setattr(launch, "TORCHRUN", (sys.executable, str(stub)))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = tmp_path / "c.yaml"
    recipe.write_text("task: tagging\ndata: {train: a, dev: b}\n")
    assert main(["train", str(recipe), "--run", str(tmp_path / "r"), "--nproc", "2", "--allow-changed-data"]) == 0
    assert "--allow-changed-data" in (tmp_path / "argv").read_text().splitlines()
    monkeypatch.delenv(ALLOW_CHANGED_DATA_ENV, raising=False)
    monkeypatch.setattr(compare, "run_compare", lambda *a, **kw: seen.append(os.environ.get(ALLOW_CHANGED_DATA_ENV)) or 0)
    assert main(["compare", "grid.yaml", "--allow-changed-data"]) == 0
    assert main(["compare", "grid.yaml"]) == 0
    assert seen == ["1", None] and ALLOW_CHANGED_DATA_ENV not in os.environ


def test_a_run_whose_meta_json_is_damaged_is_named_as_that_not_as_a_stranger(tmp_path, tiny_translation):
    """A damaged meta.json leaves sanlab unable to tell its run from a user's directory: it says which file and
    what to do, instead of "not a sanlab run directory and not empty"; nothing in the directory changes."""
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=1, valid_every=1), run, quiet=True)
    (run / "meta.json").write_text('{"sanlab_run')
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ConfigError, match=rf"{run / 'meta.json'}: not valid JSON .*sanlab cannot tell whether "
                                          rf"{run} is its run \(meta.json says so\): restore the file"):
        train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    assert sorted(p.name for p in run.iterdir()) == before
