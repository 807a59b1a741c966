"""Symbolic links and what sanlab deletes (docs/training.md, "checkpoints/"): a run's checkpoints/ linked to a
directory of its own elsewhere (a bigger disk) is the run's checkpoints, pruned and emptied by --overwrite there, the
link kept; a step-N directory that is a link is removed as a link, and what it points to is never deleted."""

import json

import pytest

from sanlab.errors import ConfigError
from sanlab.runs.resume import prepare_run_dir
from sanlab.training.checkpoint import CheckpointManager
from sanlab.training.rundir import RUN_MARKER, check_new_run, check_overwritable, empty_run


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _checkpoint(directory, step, score=None, **meta):
    """A checkpoint's files as training writes them (contents aside)."""
    directory.mkdir(parents=True)
    (directory / "meta.json").write_text(json.dumps({"step": step, "epoch": 1, "score": score, **meta}))
    (directory / "model.safetensors").write_text("weights")
    (directory / "state.pt").write_text("state")
    return directory


def _run(tmp_path, name="run"):
    run = tmp_path / name
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({RUN_MARKER: 1}))
    (run / "config.yaml").write_text("model: {}\n")
    return run


def _manager(run, **keep):
    return CheckpointManager(run, **{"keep_best": 1, "keep_last": 1, **keep}, higher_is_better=True)


def test_checkpoints_linked_to_another_disk_are_pruned_there(tmp_path):
    run, disk = _run(tmp_path), tmp_path / "disk" / "run-checkpoints"
    disk.mkdir(parents=True)
    (run / "checkpoints").symlink_to(disk)
    for step, score in ((1, 5.0), (2, 1.0), (3, 2.0)):
        _checkpoint(disk / f"step-{step:08d}", step, score)
    _checkpoint(disk / "step-00000004", 4, resume_only=True)
    (disk / "latest.json").write_text(json.dumps({"checkpoint": "step-00000003"}))
    manager = _manager(run)
    manager.prune()  # best (1) and last (3, also the latest) stay; 2 goes, and the stale resume-only 4
    manager.discard_resume_only(but=disk / "step-00000003")
    assert sorted(p.name for p in disk.iterdir()) == ["latest.json", "step-00000001", "step-00000003"]
    assert (run / "checkpoints").is_symlink()


def test_a_linked_step_is_removed_as_a_link_and_its_target_never_emptied(tmp_path):
    """Pruning, discarding and the clean-up of a crash's leftovers remove a link, never what it points to (it was
    renamed aside to .step-N.old first, which rmtree refused as a link: the link stayed there for good)."""
    run, elsewhere = _run(tmp_path), tmp_path / "elsewhere"
    checkpoints = run / "checkpoints"
    kept = [_checkpoint(elsewhere / f"ckpt{step}", step, score) for step, score in ((1, 0.0), (2, 0.0), (5, 0.0))]
    checkpoints.mkdir()
    for target in kept:
        (checkpoints / f"step-{json.loads((target / 'meta.json').read_text())['step']:08d}").symlink_to(target)
    _checkpoint(checkpoints / "step-00000003", 3, 9.0)
    _checkpoint(checkpoints / "step-00000004", 4, 0.0)
    (checkpoints / ".step-00000007.old").symlink_to(kept[0])  # left by a crash between the rename and the delete
    before = _tree(elsewhere)
    manager = _manager(run)  # (its start clears the leftovers)
    manager.prune()  # best 3, last 5 (the latest): the links of 1 and 2 go, and 4
    manager.discard_after(3)  # the link of 5
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000003"]
    assert _tree(elsewhere) == before


def test_overwrite_empties_linked_checkpoints_there_and_keeps_the_link(tmp_path):
    run, disk = _run(tmp_path), tmp_path / "disk"
    disk.mkdir()
    (run / "checkpoints").symlink_to(disk)
    _checkpoint(disk / "step-00000001", 1)
    (disk / "latest.json").write_text(json.dumps({"checkpoint": "step-00000001"}))
    (disk / ".step-00000002.tmp").mkdir()
    (disk / "notes.txt").write_text("mine\n")
    with pytest.raises(ConfigError, match=r"holds files sanlab did not write \(checkpoints/notes.txt\)"):
        check_overwritable(run)  # looked into as the run's own directory
    (disk / "notes.txt").unlink()
    empty_run(run)
    assert _tree(run) == ["checkpoints"] and (run / "checkpoints").is_symlink()
    assert list(disk.iterdir()) == []  # the next session writes its checkpoints there again


def test_overwrite_removes_a_linked_step_and_leaves_its_target(tmp_path):
    run, elsewhere = _run(tmp_path), tmp_path / "elsewhere"
    _checkpoint(run / "checkpoints" / "step-00000001", 1)
    (run / "checkpoints" / "step-00000002").symlink_to(_checkpoint(elsewhere / "kept", 2))
    (run / "checkpoints" / "step-00000003").symlink_to(tmp_path / "gone")  # dangling
    before = _tree(elsewhere)
    empty_run(run)
    assert _tree(run) == [] and _tree(elsewhere) == before


def test_a_new_run_may_have_its_checkpoints_linked_to_an_empty_directory(tmp_path):
    """Where a user puts the checkpoints of a run before its start; a link to a directory holding anything (another
    run's checkpoints, say: they would be resumed or pruned), or any other link, is refused as before."""
    disk, run = tmp_path / "disk", tmp_path / "run"
    disk.mkdir()
    run.mkdir()
    (run / "checkpoints").symlink_to(disk)
    check_new_run(run)
    (disk / "step-00000001").mkdir()
    with pytest.raises(ConfigError, match=r"run: not a sanlab run directory and not empty \(holds checkpoints\)"):
        check_new_run(run)
    (disk / "step-00000001").rmdir()
    (run / "averaged").symlink_to(tmp_path / "empty", target_is_directory=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"\(holds averaged\)"):
        check_new_run(run)


@pytest.mark.slow  # trains twice: ~2.5 s
def test_a_run_trains_evaluates_and_is_overwritten_in_its_linked_checkpoints(tmp_path, tiny_translation):
    """Its checkpoints are its own where they lie: evaluated under their names in the run (not refused as a
    directory from outside named like one of the run's, nor recorded by their path on the other disk)."""
    from sanlab.runs import evaluate_run, train_run

    disk, run = tmp_path / "disk", tmp_path / "run"
    disk.mkdir()
    run.mkdir()
    (run / "checkpoints").symlink_to(disk)
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    assert (disk / "step-00000001" / "model.safetensors").is_file()
    record = evaluate_run(run, checkpoint="best")["valid"]
    assert record["checkpoint"] == "checkpoints/step-00000001" and record["step"] == 1
    train_run(tiny_translation(max_steps=1), run, overwrite=True, quiet=True)
    assert (run / "checkpoints").is_symlink() and (disk / "step-00000001" / "model.safetensors").is_file()


def _run_with_a_linked_step(tmp_path):
    """A run with checkpoints step 1 and 2, step-00000002 moved to ``elsewhere`` and linked back: (run, its
    checkpoints/, elsewhere, the CheckpointManager, the model saved)."""
    from torch import nn

    run, elsewhere = _run(tmp_path), tmp_path / "elsewhere"
    checkpoints = run / "checkpoints"
    manager = CheckpointManager(run, keep_best=0, keep_last=10, higher_is_better=True)
    model = nn.Linear(2, 2)
    for step in (1, 2):
        manager.save(model=model, state={"step": step}, meta={"step": step, "epoch": 0, "score": None})
    elsewhere.mkdir()
    (checkpoints / "step-00000002").rename(elsewhere / "step-00000002")
    (checkpoints / "step-00000002").symlink_to(elsewhere / "step-00000002")
    return run, checkpoints, elsewhere, manager, model


def test_saving_a_step_that_is_a_link_replaces_the_link_and_leaves_its_target(tmp_path):
    """Saving step N again over a linked step-N (a run cut by --stop-after at N, rerun with max_steps N; a damaged
    linked checkpoint replaced) writes the new one in the run and removes the link only; it failed (a link renamed
    onto a directory) and left .step-N.tmp, so training could never pass step N."""
    run, checkpoints, elsewhere, manager, model = _run_with_a_linked_step(tmp_path)
    before = {p: p.read_bytes() for p in (elsewhere / "step-00000002").iterdir()}
    saved = manager.save(model=model, state={"step": 2, "again": True}, meta={"step": 2, "epoch": 0, "score": None})
    assert saved == checkpoints / "step-00000002" and saved.is_dir() and not saved.is_symlink()
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest.json", "step-00000001", "step-00000002"]
    assert [m["step"] for m in manager.all()] == [1, 2]
    assert {p: p.read_bytes() for p in (elsewhere / "step-00000002").iterdir()} == before


def test_a_failed_save_over_a_linked_step_keeps_the_link(tmp_path, monkeypatch):
    """Saving step N again over a linked step-N whose final rename fails (ENOSPC, EIO) leaves the link where it was,
    and latest.json names a checkpoint that is there; the link was removed first, and the next start fell back to an
    older checkpoint and trained again."""
    from sanlab import files
    from sanlab.training.checkpoint import latest_checkpoint

    run, checkpoints, elsewhere, manager, model = _run_with_a_linked_step(tmp_path)
    replace = files.os.replace

    def failing(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(files.os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        manager.save(model=model, state={"step": 2}, meta={"step": 2, "epoch": 0, "score": None})
    assert (checkpoints / "step-00000002").is_symlink()
    assert latest_checkpoint(checkpoints) == checkpoints / "step-00000002"
    assert [m["step"] for m in manager.all()] == [1, 2]


def test_a_linked_step_is_named_in_the_run_not_by_where_it_lies(tmp_path):
    """A step-N moved to another disk and linked back is the run's checkpoints/step-N, whatever its target's name
    (it was named by its target: outside the run, or the raw path); a link from outside to one of the run's is named
    as in the run, as before; a directory outside is not the run's."""
    from sanlab.training.layout import RunLayout

    run, disk = _run(tmp_path), tmp_path / "disk"
    (run / "checkpoints").mkdir()
    _checkpoint(run / "checkpoints" / "step-00000001", 1)
    for step, target in ((2, "step-00000002"), (3, "moved-3")):
        (run / "checkpoints" / f"step-{step:08d}").symlink_to(_checkpoint(disk / target, step))
    (tmp_path / "mine").symlink_to(run / "checkpoints" / "step-00000001")
    layout = RunLayout(run)
    assert layout.name_in_run(run / "checkpoints" / "step-00000002") == "checkpoints/step-00000002"
    assert layout.name_in_run(run / "checkpoints" / "step-00000003") == "checkpoints/step-00000003"
    assert layout.name_in_run(tmp_path / "mine") == "checkpoints/step-00000001"
    assert layout.name_in_run(disk / "step-00000002") is None
    assert layout.name_in_run(run) == "." and layout.name_in_run(run / "checkpoints") == "checkpoints"


def test_a_linked_step_is_evaluated_as_the_runs_own(tmp_path, tiny_translation):
    """`sanlab evaluate` of a step-N linked to another disk, by its name and as best, records checkpoints/step-N; it
    was refused as a directory outside the run named like one of its own checkpoints."""
    from sanlab.runs import evaluate_run, train_run

    run, disk = tmp_path / "run", tmp_path / "disk"
    train_run(tiny_translation(max_steps=2, valid_every=1, keep_best=1, keep_last=1), run, quiet=True)
    disk.mkdir()
    for step in sorted((run / "checkpoints").glob("step-*")):
        step.rename(disk / step.name)
        step.symlink_to(disk / step.name)
    for name in sorted(p.name for p in (run / "checkpoints").glob("step-*")):
        record = evaluate_run(run, checkpoint=name, splits=["valid"])["valid"]
        assert record["checkpoint"] == f"checkpoints/{name}"
    record = evaluate_run(run, checkpoint="best", splits=["valid"])["valid"]
    assert record["checkpoint"].startswith("checkpoints/step-") and (run / "eval-best.json").is_file()


def test_only_a_step_in_checkpoints_or_averaged_is_named_by_its_link(tmp_path):
    """The link itself names the checkpoint only for a step-N directly in checkpoints/ and for averaged/; any other
    link in the run is what it resolves to. A link run/best to a directory outside was taken as the run's own."""
    from sanlab.training.layout import RunLayout

    run, disk = _run(tmp_path), tmp_path / "disk"
    (run / "checkpoints").mkdir()
    _checkpoint(run / "checkpoints" / "step-00000001", 1)
    (run / "averaged").symlink_to(_checkpoint(disk / "avg", 1))
    (run / "best").symlink_to(_checkpoint(disk / "best", 1))
    (run / "checkpoints" / "other").symlink_to(run / "checkpoints" / "step-00000001")
    layout = RunLayout(run)
    assert layout.name_in_run(run / "averaged") == "averaged"
    assert layout.name_in_run(run / "best") is None
    assert layout.name_in_run(run / "checkpoints" / "other") == "checkpoints/step-00000001"


@pytest.mark.slow
def test_a_path_named_like_another_of_the_runs_checkpoints_is_refused(tmp_path, tiny_translation):
    """Given as a path, a directory named best/last, or a step-N/averaged whose name in the run is not its own, would
    write its records over that checkpoint's: refused, eval-best.json and its hypotheses untouched. Both were taken:
    run/best linked to a directory outside (a link in the run counted as the run's), and elsewhere/best linked to a
    non-best step of the run (it resolves into the run)."""
    import shutil

    from sanlab.runs import evaluate_run, train_run

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1, keep_best=2, keep_last=2), run, quiet=True)
    best = evaluate_run(run, checkpoint="best", splits=["valid"])["valid"]["checkpoint"]
    other = next(p for p in sorted((run / "checkpoints").glob("step-*")) if f"checkpoints/{p.name}" != best)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name.startswith(("eval-", "hyp-"))}
    assert "eval-best.json" in before
    shutil.copytree(other, tmp_path / "foreign" / "best")
    (run / "best").symlink_to(tmp_path / "foreign" / "best")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "best").symlink_to(other)
    (tmp_path / "elsewhere" / "averaged").symlink_to(other)
    (run / best.split("/")[-1]).symlink_to(other)  # the best's step-N name, in the run's root, to another step
    (tmp_path / "elsewhere" / "last").symlink_to(run / best)
    for path in (run / "best", tmp_path / "elsewhere" / "best", tmp_path / "elsewhere" / "averaged",
                 tmp_path / "elsewhere" / "last", run / best.split("/")[-1]):
        with pytest.raises(ConfigError, match="named like one of its own checkpoints"):
            evaluate_run(run, checkpoint=str(path), splits=["valid"])
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name.startswith(("eval-", "hyp-"))} == before
    record = evaluate_run(run, checkpoint=str(other), splits=["valid"])["valid"]  # its own name: taken
    assert record["checkpoint"] == f"checkpoints/{other.name}"


@pytest.mark.parametrize("held", ["step-00000001", "notes.txt"])
def test_a_new_run_linked_to_a_directory_holding_anything_is_told_so(tmp_path, held, tiny_translation):
    """A new run whose checkpoints/ the user linked to a directory that is not empty (another run's checkpoints, a
    note) is refused naming the link, its target and what it holds: it was told it "has checkpoints" and to
    "restore config.yaml to resume", of a run that never trained there."""
    disk, run = tmp_path / "disk", tmp_path / "run"
    disk.mkdir()
    run.mkdir()
    (disk / held).mkdir() if held.startswith("step") else (disk / held).write_text("mine")
    (run / "checkpoints").symlink_to(disk)
    with pytest.raises(ConfigError) as err:
        prepare_run_dir(run, tiny_translation(max_steps=2), overwrite=False)
    message = str(err.value)
    assert f"checkpoints is a link to {disk}, which holds {held}; a new run's checkpoints go into an empty" in message
    assert sorted(p.name for p in disk.iterdir()) == [held] and (run / "checkpoints").is_symlink()


def _dangling_run(tmp_path, config=None):
    """A run whose checkpoints/ links to a directory that is not there (a disk not mounted): (run, the target)."""
    from sanlab.config import dump_config

    run, gone = _run(tmp_path), tmp_path / "unmounted" / "run-checkpoints"
    if config is not None:
        (run / "config.yaml").write_text(dump_config(config))
    (run / "checkpoints").symlink_to(gone)
    return run, gone


def _dangling_message(run, gone):
    import re

    return re.escape(f"{run / 'checkpoints'} is a symbolic link to {gone}, which does not exist (mount the disk "
                     "it is on, or remove the link)")


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_run_whose_checkpoints_link_dangles_is_refused_as_such(tmp_path, overwrite, tiny_translation):
    """Resumed or overwritten with its checkpoints' disk not mounted, a run is refused naming the link and its missing
    target, and nothing is written or deleted: resumed, it crashed (FileExistsError) after starting from scratch as
    if it had no checkpoints; overwritten, the link was deleted and the checkpoints written into the run."""
    run, gone = _dangling_run(tmp_path, tiny_translation(max_steps=2))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match=_dangling_message(run, gone)):
        prepare_run_dir(run, tiny_translation(max_steps=2), overwrite=overwrite)
    assert (run / "checkpoints").is_symlink() and not gone.exists()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    with pytest.raises(ConfigError, match=_dangling_message(run, gone)):
        check_overwritable(run)  # (a grid checks each of its runs before it overwrites any)


def test_a_new_run_whose_checkpoints_link_dangles_is_refused_as_such(tmp_path, tiny_translation):
    """It was refused as "not a sanlab run directory and not empty (holds checkpoints)"."""
    run, gone = tmp_path / "run", tmp_path / "unmounted"
    run.mkdir()
    (run / "checkpoints").symlink_to(gone)
    with pytest.raises(ConfigError, match=_dangling_message(run, gone)):
        prepare_run_dir(run, tiny_translation(max_steps=2), overwrite=False)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"] and (run / "checkpoints").is_symlink()


@pytest.mark.parametrize("checkpoint", ["best", "last", "step-00000001", "step-1"])
def test_evaluating_a_run_whose_checkpoints_link_dangles_says_so(tmp_path, checkpoint, tiny_translation):
    """It said "no checkpoint to load (train first)", or that step-N is no checkpoint of the run (none yet)."""
    from sanlab.runs import evaluate_run

    run, gone = _dangling_run(tmp_path, tiny_translation(max_steps=2))
    with pytest.raises(ConfigError, match=_dangling_message(run, gone)):
        evaluate_run(run, checkpoint=checkpoint, splits=["valid"])
    assert not list(run.glob("eval-*")) and (run / "checkpoints").is_symlink()


@pytest.mark.parametrize("which", [{"last": 1}, {"best": 1}])
def test_averaging_a_run_whose_checkpoints_link_dangles_says_so(tmp_path, which, tiny_translation):
    """It said the run "has no checkpoints to average (train it first)"."""
    from sanlab.runs.trained import average_run

    run, gone = _dangling_run(tmp_path, tiny_translation(max_steps=2))
    with pytest.raises(ConfigError, match=_dangling_message(run, gone)):
        average_run(run, **which)
    assert not (run / "averaged").exists() and (run / "checkpoints").is_symlink()


def test_a_chain_of_links_is_named_with_the_end_that_is_missing(tmp_path, tiny_translation):
    """checkpoints -> hop -> nowhere: "a link to hop, which does not exist" was untrue of hop."""
    import re

    run, hop, gone = tmp_path / "run", tmp_path / "hop", tmp_path / "unmounted"
    run.mkdir()
    hop.symlink_to(gone)
    (run / "checkpoints").symlink_to(hop)
    with pytest.raises(ConfigError, match=re.escape(f"{run / 'checkpoints'} is a symbolic link to {hop} (a link on "
                                                    f"to {gone}), which does not exist")):
        prepare_run_dir(run, tiny_translation(max_steps=2), overwrite=False)


def test_a_run_directory_that_is_a_dangling_link_is_refused_as_such(tmp_path, tiny_translation):
    """--run pointing through a link to a disk not mounted failed with a bare "File exists"."""
    from sanlab.runs import train_run

    run, gone = tmp_path / "run", tmp_path / "unmounted"
    run.symlink_to(gone)
    with pytest.raises(ConfigError, match=f"--run {run}: is a symbolic link to {gone}, which does not exist"):
        train_run(tiny_translation(max_steps=2), run, quiet=True)
    assert run.is_symlink() and not gone.exists()


def test_a_loop_of_links_is_named_as_one(tmp_path, tiny_translation):
    """checkpoints -> a -> b -> a was "a link on to .../a, which does not exist", and a exists."""
    run, a, b = tmp_path / "run", tmp_path / "a", tmp_path / "b"
    run.mkdir()
    a.symlink_to(b)
    b.symlink_to(a)
    (run / "checkpoints").symlink_to(a)
    with pytest.raises(ConfigError, match=f"{run / 'checkpoints'} is a symbolic link to {a}, and its links go round "
                                          "in a loop"):
        prepare_run_dir(run, tiny_translation(max_steps=2), overwrite=False)


@pytest.mark.parametrize("linked", [False, True])
def test_a_checkpoints_file_is_refused_as_one(tmp_path, linked, tiny_translation):
    """It failed with a bare "Not a directory" (exit status 1); nothing is deleted."""
    run, file = tmp_path / "run", tmp_path / "notes.txt"
    run.mkdir()
    file.write_text("mine\n")
    if linked:
        (run / "checkpoints").symlink_to(file)
    else:
        (run / "checkpoints").write_text("mine\n")
    what = f"a symbolic link to {file}, which is a file" if linked else "a file"
    with pytest.raises(ConfigError, match=f"{run / 'checkpoints'} is {what}, not a directory of checkpoints"):
        prepare_run_dir(run, tiny_translation(max_steps=2), overwrite=False)
    assert (run / "checkpoints").read_text() == "mine\n" and file.read_text() == "mine\n"


def test_a_dangling_averaged_link_is_named_as_one(tmp_path, tiny_translation):
    """It said "no model.safetensors in this checkpoint directory (run `sanlab average` ... first)"."""
    from sanlab.runs import train_run
    from sanlab.runs.trained import select_checkpoint

    config = tiny_translation(max_steps=2)
    run, gone = tmp_path / "run", tmp_path / "unmounted"
    train_run(config, run, quiet=True)
    (run / "averaged").symlink_to(gone)
    with pytest.raises(ConfigError, match=f"{run / 'averaged'} is a symbolic link to {gone}, which does not exist"):
        select_checkpoint(run, "averaged", config)
    assert (run / "averaged").is_symlink()
