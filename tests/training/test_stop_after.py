"""``sanlab train --stop-after``: a session ended at a wall-time limit resumes to exactly the uninterrupted run:
its weights, its metrics.jsonl records and the checkpoints it ends with. The clock is a stand-in that advances one
second per look, so the limit falls on a chosen update (no real time is waited for or asserted)."""

import itertools
import json
import re
import types

import pytest
import torch

from sanlab.runs import train_run
from sanlab.training import stop_after as stop_after_module
from sanlab.training.checkpoint import RESUME_ONLY, load_state
from sanlab.training.stop_after import StopAfter
from training_fixtures import final_weights, make_reverse_config

# validations at 3, 6, 9 and 12, "train" records at 5 and 10: update 8 is neither (nor an epoch's end: checked
# below), and the device was last read at 6 (the validation), so the updates 7 and 8 are unread at the stop
SETTINGS = dict(max_steps=12, valid_every=3, log_every=5, keep_last=1, keep_best=1)
SECONDS = r"<0\.1s|\d\.\ds|\d{2,}s"  # a wall time as training.logging.duration shows it (the loop's: real time)


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic() for --stop-after: 0, 1, 2, ... one second a look (the loop looks once after each update);
    calling the fixture's value starts it again at 0 (a new session). time.time() steps back an hour at each read
    (an NTP step, a clock set by hand), which must move no limit."""
    import sanlab.cli

    ticks, steps = [itertools.count()], itertools.count()
    fake = types.SimpleNamespace(monotonic=lambda: float(next(ticks[0])), time=lambda: 1e9 - 3600.0 * next(steps))
    monkeypatch.setattr(stop_after_module, "time", fake)
    monkeypatch.setattr(sanlab.cli, "time", fake)  # (the command's start: its first look)
    return lambda: ticks.__setitem__(0, itertools.count())


def _limit_at(update: int) -> StopAfter:
    """A limit the stand-in clock reaches at the look after ``update`` (the first look reads 0)."""
    return StopAfter(f"{update}s", deadline_mono=float(update - 1))


def _records(run) -> list[dict]:
    """metrics.jsonl without what measures time (tokens/s, the speed record)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "time")} for r in records
            if r["split"] != "speed"]


def _checkpoints(run) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step-*"))


def _meta(run, name) -> dict:
    return json.loads((run / "checkpoints" / name / "meta.json").read_text())


def _assert_same_run(a, b):
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=0, msg=name)
    assert _records(a) == _records(b)
    assert _checkpoints(a) == _checkpoints(b)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """SETTINGS' config, its uninterrupted run (trained once for the module; the tests only read it) and that
    run's summary. The cut runs of the tests train on the same data files, so their config.yaml is the same."""
    torch.set_num_threads(1)  # (built before the function-scoped autouse fixture that sets it)
    root = tmp_path_factory.mktemp("uninterrupted")
    config = make_reverse_config(root, **SETTINGS)
    done = train_run(config, root / "straight", quiet=True)
    return config, root / "straight", done


def test_a_run_stopped_between_validations_resumes_to_the_uninterrupted_run(tmp_path, uninterrupted, clock):
    config, straight, _ = uninterrupted
    cut = tmp_path / "cut"
    summary = train_run(config, cut, quiet=True, stop_after=_limit_at(8))
    assert summary["step"] == 8 and summary["stopped_after"] == "8s"
    # the validated checkpoint of update 6 is kept beside the one to resume from (keep_last=1 counts validated ones)
    assert _checkpoints(cut)[-2:] == ["step-00000006", "step-00000008"]
    meta = _meta(cut, "step-00000008")
    assert meta[RESUME_ONLY] is True and meta["metrics"] == {} and meta["score"] is None
    assert 0 < meta["position"]  # inside an epoch
    state = load_state(cut / "checkpoints" / "step-00000008")
    assert state["interval"]["updates"] == 2  # updates 7 and 8: unread at the stop, their sums saved as read
    assert [r["step"] for r in _records(cut) if r["split"] == "valid"] == [3, 6]  # no validation at the stop
    last = (cut / "train.log").read_text().rstrip().splitlines()[-1]
    # the limit counts from the command's start, the session's time from the loop's: both said, and which is which
    # (it said "(18s this session): stopped after 20s", which read as a contradiction); the stand-in clock's look
    # that saw the limit read 7 with the command's start at -1: the time then, not after the checkpoint's save
    assert re.search(rf"\({SECONDS} this session\): --stop-after 8s reached at update 8 of 12, 8\.0s after the "
                     rf"command started \({SECONDS} of them training\); rerun the same command to resume$", last), last
    assert summary["command_seconds"] == 8.0
    assert (cut / "config.yaml").read_text() == (straight / "config.yaml").read_text()  # the session's, not the run's

    resumed = train_run(config, cut, quiet=True)  # without the limit: the same run
    assert resumed["step"] == 12 and resumed["stopped_after"] is None
    _assert_same_run(straight, cut)
    assert not any(_meta(cut, name).get(RESUME_ONLY) for name in _checkpoints(cut))
    assert "finished at step 12" in (cut / "train.log").read_text()


def test_each_session_cut_again_still_ends_as_the_uninterrupted_run(tmp_path, uninterrupted, clock):
    """Two cuts in a row before the next validation (7, then 8): the second replaces the first's checkpoint."""
    config, straight, _ = uninterrupted
    cut = tmp_path / "cut"
    train_run(config, cut, quiet=True, stop_after=_limit_at(7))
    clock()  # (a new session: its clock starts again)
    assert train_run(config, cut, quiet=True, stop_after=_limit_at(1))["step"] == 8
    assert _checkpoints(cut)[-2:] == ["step-00000006", "step-00000008"]
    train_run(config, cut, quiet=True)
    _assert_same_run(straight, cut)


def test_the_checkpoint_to_resume_from_pushes_no_validated_one_out_and_is_never_the_last(tmp_path, tiny_translation,
                                                                                          clock):
    """lr 0: every validation scores the same, and of equal scores the newest is the best, so keep_last=2 alone
    decides which validated checkpoints stay."""
    from sanlab.runs.trained import select_checkpoint

    config = tiny_translation(max_steps=8, valid_every=3, keep_last=2, keep_best=1, lr=0.0, warmup_steps=0)
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    train_run(config, straight, quiet=True)
    train_run(config, cut, quiet=True, stop_after=_limit_at(7))
    assert _checkpoints(cut) == ["step-00000003", "step-00000006", "step-00000007"]
    assert select_checkpoint(cut, "last", config).name == select_checkpoint(cut, "best", config).name == "step-00000006"
    train_run(config, cut, quiet=True)
    _assert_same_run(straight, cut)
    assert _checkpoints(cut) == ["step-00000006", "step-00000008"]


def test_a_limit_at_a_validation_saves_no_other_checkpoint_and_at_the_end_changes_nothing(tmp_path,
                                                                                           uninterrupted, clock):
    config, straight, done = uninterrupted
    cut = tmp_path / "cut"
    assert train_run(config, cut, quiet=True, stop_after=_limit_at(6))["stopped_after"] == "6s"
    assert _checkpoints(cut)[-1] == "step-00000006" and not _meta(cut, "step-00000006").get(RESUME_ONLY)
    clock()
    # reached with the run's last update: the run finished, as without a limit
    summary = train_run(config, cut, quiet=True, stop_after=_limit_at(6))
    assert summary["step"] == 12 and summary["stopped_after"] is None and summary["best"] == done["best"]
    _assert_same_run(straight, cut)


def test_a_session_that_ends_before_the_limit_trains_as_without_it(tmp_path, tiny_translation):
    config = tiny_translation(**SETTINGS)
    summary = train_run(config, tmp_path / "run", quiet=True, stop_after=StopAfter.starting("1h"))
    assert summary["step"] == 12 and summary["stopped_after"] is None
    assert "reached train.max_steps = 12" in (tmp_path / "run" / "train.log").read_text().splitlines()[-1]


def test_the_command_says_where_it_stopped_exits_0_and_a_rerun_without_the_limit_finishes(tmp_path, tiny_translation,
                                                                                         clock, capsys):
    from sanlab.cli import main
    from sanlab.config import dump_config

    recipe, run = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(dump_config(tiny_translation(max_steps=6, valid_every=4, log_every=5)))
    # the command's start reads 0; the looks after updates 1, 2 and 3 read 1, 2 and 3: the third sees the limit
    assert main(["train", str(recipe), "--run", str(run), "--quiet", "--stop-after", "3s"]) == 0
    assert re.fullmatch(rf"stopped: --stop-after 3s reached at update 3 of 6, 3\.0s after the command started "
                        rf"\(({SECONDS}) of them training\); rerun the same command to resume\n",
                        capsys.readouterr().out)
    assert "stop" not in (run / "config.yaml").read_text().replace(str(tmp_path), "")
    # cut before its first validation (at update 4): no best to give, said so ("best bleu none" before)
    assert "at step 3, epoch 0, no bleu validated yet (" in (run / "train.log").read_text().splitlines()[-1]
    assert main(["train", str(recipe), "--run", str(run), "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("done: step 6, best bleu ")


def test_a_session_cut_under_overwrite_says_to_rerun_without_it(tmp_path, tiny_translation, clock, capsys):
    """"rerun the same command to resume" after `train --overwrite --stop-after`: the same command empties the run
    and starts it again, and every session's training is lost. The stop says to rerun it without --overwrite, on
    the console and in train.log, and that resumes."""
    from sanlab.cli import main
    from sanlab.config import dump_config

    recipe, run = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(dump_config(tiny_translation(max_steps=6, valid_every=4, log_every=5)))
    assert main(["train", str(recipe), "--run", str(run), "--quiet", "--overwrite", "--stop-after", "3s"]) == 0
    said = "rerun the command without --overwrite to resume (with it, the run starts again from update 0)"
    assert capsys.readouterr().out.rstrip().endswith(said)
    assert (run / "train.log").read_text().rstrip().endswith(said)
    clock()
    assert main(["train", str(recipe), "--run", str(run), "--quiet"]) == 0
    assert "resumed from" in (run / "train.log").read_text()


@pytest.mark.parametrize("max_steps, said", [
    (8, "update 4 of 8"),  # 8 updates come before 2 epochs' 12
    (12, "update 4 of 12"),  # both with update 12: train.max_steps, as the run's end says
    (13, "update 4 (0 of 2 epochs done)")])  # 2 epochs' 12 updates come first
def test_where_a_run_stopped_is_said_by_the_bound_that_ends_it(tmp_path, tiny_translation, clock, max_steps, said):
    """An epoch is 6 updates: the bound reached first ends the run, and the stop says how far it is from that one
    (train.max_steps' default 100,000 told a tagger bounded by train.max_epochs nothing)."""
    config = tiny_translation(max_steps=max_steps, max_epochs=2, valid_every=0, log_every=5)
    summary = train_run(config, tmp_path / "run", quiet=True, stop_after=_limit_at(4))
    assert summary["stopped_at"] == said
    assert re.search(rf": --stop-after 4s reached at {re.escape(said)}, .* after the command started \(.*\); rerun the "
                     "same command to resume$", (tmp_path / "run" / "train.log").read_text().rstrip())


def test_a_tagger_bounded_by_epochs_says_its_epochs_not_its_updates(tmp_path, clock, capsys):
    """The taggers' recipes bound a run by train.max_epochs (train.max_steps left at its default): 60 sentences in
    batches of 8 are 8 updates an epoch, so update 10 falls in the second of 3 epochs, with 1 done."""
    from sanlab.cli import main
    from sanlab.config import dump_config
    from training_fixtures import make_tagging_config

    recipe, run = tmp_path / "recipe.yaml", tmp_path / "run"
    recipe.write_text(dump_config(make_tagging_config(tmp_path, max_epochs=3, log_every=5)))
    # the command's start reads 0; the looks after updates 1 to 10 read 1 to 10
    assert main(["train", str(recipe), "--run", str(run), "--quiet", "--stop-after", "10s"]) == 0
    assert re.fullmatch(r"stopped: --stop-after 10s reached at update 10 \(1 of 3 epochs done\), 10s after the "
                        rf"command started \(({SECONDS}) of them training\); rerun the same command to resume\n",
                        capsys.readouterr().out)


@pytest.mark.parametrize("argv, said", [("0s", "expected a duration above 0, got '0s'"),
                                        ("90", "'90' has no unit: give one, e.g. 90s or 90m"),
                                        ("soon", "expected a duration such as 90s, 9m or 1.5h")])
def test_a_duration_that_is_not_one_is_a_usage_error(argv, said, capsys):
    from sanlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "c.yaml", "--run", "r", "--stop-after", argv])
    assert exit_.value.code == 2 and f"sanlab train: error: argument --stop-after: {said}" in capsys.readouterr().err


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("9m", 540), ("1.5h", 5400), (".5m", 30), ("2M", 120)])
def test_durations(text, seconds):
    assert stop_after_module.parse_duration(text) == seconds


@pytest.mark.parametrize("text, said", [("0s", "above 0"), ("-5m", "above 0"), ("90", "no unit"),
                                        ("9 min", "such as 90s"), ("", "such as 90s"), ("1h30m", "such as 90s")])
def test_durations_refused(text, said):
    with pytest.raises(ValueError, match=said):
        stop_after_module.parse_duration(text)


@pytest.mark.slow  # three launches of two processes: ~60 s on 2 cores
@pytest.mark.usefixtures("private_tmpdir")
def test_two_processes_stop_at_the_same_update_and_resume_to_the_uninterrupted_run(tmp_path, tiny_translation,
                                                                                   capfd):
    """Process 0 decides at the "train" records' updates (log_every=4) and tells the other: a limit that has passed
    by the first of them (0.001s: the start alone takes longer) stops both after update 4, past the validation at
    3, and the rerun without it ends as the uninterrupted two-process run."""
    from sanlab.cli import main
    from sanlab.config import dump_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(dump_config(tiny_translation(max_steps=8, valid_every=3, log_every=4)))
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main(["train", str(recipe), "--run", str(straight), "--nproc", "2", "--quiet"]) == 0
    assert main(["train", str(recipe), "--run", str(cut), "--nproc", "2", "--quiet", "--stop-after", "0.001s"]) == 0
    assert "stopped: --stop-after 0.001s reached at update 4 of 8, " in capfd.readouterr().out
    assert _checkpoints(cut) == ["step-00000003", "step-00000004"] and _meta(cut, "step-00000004")[RESUME_ONLY]
    assert main(["train", str(recipe), "--run", str(cut), "--nproc", "2", "--quiet"]) == 0
    _assert_same_run(straight, cut)


@pytest.fixture
def clocks(monkeypatch):
    """Stand-ins for time.time() (``wall``) and time.monotonic() (``mono``), set by hand."""
    now = types.SimpleNamespace(wall=1_000_000.0, mono=50.0)
    monkeypatch.setattr(stop_after_module, "time", types.SimpleNamespace(time=lambda: now.wall,
                                                                         monotonic=lambda: now.mono))
    return now


def test_a_worker_of_the_launcher_takes_the_launchers_deadline(monkeypatch, clocks):
    """`sanlab train --nproc N`'s processes start later than the command: the limit counts from the command's start,
    which the launcher passes on as a wall-clock time, converted on arrival; a process outside a launch (no
    WORLD_SIZE) counts from its own start (a time.monotonic() reading)."""
    monkeypatch.setenv(stop_after_module.DEADLINE_ENV, repr(clocks.wall + 100.5))
    assert StopAfter.starting("9m", started=40.0).deadline_mono == 40.0 + 540
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert StopAfter.starting("9m", started=40.0) == StopAfter("9m", deadline_mono=clocks.mono + 100.5)


@pytest.mark.parametrize("step", [3600.0, -3600.0])
def test_a_clock_change_during_the_session_moves_no_limit(clocks, monkeypatch, step):
    """An NTP step or a clock set by hand moves time.time(), not time.monotonic(): the limit is kept by the latter,
    the wall clock read only where the deadline crosses processes (``stop_at``, once each way)."""
    limit = StopAfter.starting("9m")
    monkeypatch.setenv(stop_after_module.DEADLINE_ENV, repr(limit.stop_at()))
    monkeypatch.setenv("WORLD_SIZE", "2")
    worker = StopAfter.starting("9m")
    assert worker.deadline_mono == limit.deadline_mono == clocks.mono + 540
    clocks.wall += step
    clocks.mono += 539
    assert not limit.reached() and not worker.reached()
    clocks.mono += 1
    assert limit.reached() and worker.reached()


def test_a_limit_handed_to_a_spawned_process_keeps_its_time_left(clocks):
    """``sanlab compare --jobs N`` pickles the limit to processes whose time.monotonic() need not share the
    grid process's reference: it crosses as a wall-clock time, converted back on arrival."""
    import pickle

    limit = StopAfter.starting("9m")
    sent = pickle.dumps(limit)
    clocks.mono, clocks.wall = 7_000.0, clocks.wall + 40  # another process, 40 s later
    arrived = pickle.loads(sent)
    assert arrived.text == "9m" and arrived.deadline_mono == 7_000.0 + 500


def _assert_ends_alike(a, b, config):
    """The same run, and the same weights under `--checkpoint last` and `best`."""
    from sanlab.runs.trained import select_checkpoint

    _assert_same_run(a, b)
    for which in ("last", "best"):
        ca, cb = select_checkpoint(a, which, config), select_checkpoint(b, which, config)
        assert ca.name == cb.name and _meta(a, ca.name).get("score") == _meta(b, cb.name).get("score")
        # the files' bytes: the same weights are the same bytes, tied ones too (test_checkpoint_bytes.py)
        assert (ca / "model.safetensors").read_bytes() == (cb / "model.safetensors").read_bytes(), which


@pytest.mark.slow  # three runs: ~9 s
def test_a_budget_lowered_to_the_update_of_a_cut_ends_as_a_run_trained_to_it(tmp_path, tiny_translation, clock):
    """Cut at update 8 (between the validations at 6 and 9), then resumed with train.max_steps=8: the rerun trains
    no update but validates and saves update 8, as a run of 8 updates does; the checkpoint it resumed from goes."""
    config, lowered = tiny_translation(**SETTINGS), tiny_translation(**{**SETTINGS, "max_steps": 8})
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    done = train_run(lowered, straight, quiet=True)
    train_run(config, cut, quiet=True, stop_after=_limit_at(8))
    summary = train_run(lowered, cut, quiet=True)
    assert summary["step"] == 8 and summary["stopped_after"] is None and summary["best"] == done["best"]
    assert [r["step"] for r in _records(cut) if r["split"] == "valid"] == [3, 6, 8]
    _assert_ends_alike(straight, cut, lowered)
    assert not any(_meta(cut, name).get(RESUME_ONLY) for name in _checkpoints(cut))
    assert "finished at step 8" in (cut / "train.log").read_text().splitlines()[-1]


@pytest.mark.slow  # three runs: ~9 s
def test_a_cut_at_an_epochs_end_with_max_epochs_lowered_to_it_ends_as_a_run_of_those_epochs(tmp_path, tiny_translation,
                                                                                           clock):
    """An epoch is 6 updates; validations every 4: the cut at update 6 ends epoch 0 between two of them."""
    settings = dict(max_epochs=2, valid_every=4, log_every=5, keep_last=1, keep_best=1)
    config, lowered = tiny_translation(**settings), tiny_translation(**{**settings, "max_epochs": 1})
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert train_run(lowered, straight, quiet=True)["step"] == 6
    train_run(config, cut, quiet=True, stop_after=_limit_at(6))
    meta = _meta(cut, "step-00000006")
    assert meta[RESUME_ONLY] and (meta["epoch"], meta["position"]) == (1, 0)  # at the epoch's end
    summary = train_run(lowered, cut, quiet=True)
    assert (summary["step"], summary["epoch"], summary["stopped_after"]) == (6, 1, None)
    assert [r["step"] for r in _records(cut) if r["split"] == "valid"] == [4, 6]
    _assert_ends_alike(straight, cut, lowered)
    assert "reached train.max_epochs = 1" in (cut / "train.log").read_text().splitlines()[-1]


def test_a_stale_resume_only_checkpoint_is_discarded_and_nothing_else(tmp_path):
    """A crash between writing latest.json and pruning leaves an older resume-only checkpoint: the next session's
    resume discards it, keeping the one resumed from, every validated one, and whatever sanlab did not write."""
    from sanlab.training.checkpoint import CheckpointManager, checkpoint_names

    directory = tmp_path / "checkpoints"
    for step, meta in {3: {"score": 1.0}, 5: {RESUME_ONLY: True}, 6: {"score": 2.0}, 7: {RESUME_ONLY: True}}.items():
        (directory / f"step-{step:08d}").mkdir(parents=True)
        (directory / f"step-{step:08d}" / "meta.json").write_text(json.dumps({"step": step, "epoch": 0, **meta}))
    (directory / "step-00000005.bak").mkdir()  # a user's copy of the stale one: not a checkpoint
    (directory / "step-00000005.bak" / "meta.json").write_text(json.dumps({"step": 5, RESUME_ONLY: True}))
    (directory / "step-notes.txt").write_text("mine\n")
    manager = CheckpointManager(tmp_path, keep_best=0, keep_last=0, higher_is_better=True)
    manager.discard_resume_only(but=directory / "step-00000007")
    assert checkpoint_names(tmp_path) == ["step-00000003", "step-00000006", "step-00000007"]
    assert (directory / "step-00000005.bak" / "meta.json").is_file() and (directory / "step-notes.txt").is_file()
    manager.discard_resume_only(but=directory / "step-00000006")  # resumed from a validated one: none stays
    assert checkpoint_names(tmp_path) == ["step-00000003", "step-00000006"]


@pytest.mark.slow  # three runs: ~7 s
def test_a_resume_only_checkpoint_left_by_a_crash_before_pruning_goes_at_the_next_resume(tmp_path, tiny_translation,
                                                                                       clock, monkeypatch):
    """Cut at 7; the next session saves update 9 (validated) and crashes before pruning, so step-7 stays; a rerun
    whose budget ends at 9 saves nothing, yet step-7 goes."""
    from sanlab.training.checkpoint import CheckpointManager

    config, lowered = tiny_translation(**SETTINGS), tiny_translation(**{**SETTINGS, "max_steps": 9})
    cut = tmp_path / "cut"
    train_run(config, cut, quiet=True, stop_after=_limit_at(7))
    with monkeypatch.context() as crash:
        crash.setattr(CheckpointManager, "prune", lambda self: None)
        train_run(lowered, cut, quiet=True)
    before = _checkpoints(cut)
    assert "step-00000007" in before and _meta(cut, "step-00000007")[RESUME_ONLY]
    assert train_run(lowered, cut, quiet=True)["step"] == 9
    assert _checkpoints(cut) == [name for name in before if name != "step-00000007"]
