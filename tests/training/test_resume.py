"""Interrupting and resuming a run gives exactly the parameters of an uninterrupted run."""

import contextlib
import fcntl
import functools
import json
import os
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from sanlab.errors import ConfigError, TrainingError
from sanlab.runs import load_trained, train_run
from training_fixtures import final_weights


def test_resumed_run_equals_uninterrupted(tmp_path, tiny_translation):
    straight = tmp_path / "straight"
    train_run(tiny_translation(max_steps=7, accum_steps=2), straight, quiet=True)
    resumed = tmp_path / "resumed"
    first = train_run(tiny_translation(max_steps=3, accum_steps=2), resumed, quiet=True)
    summary = train_run(tiny_translation(max_steps=7, accum_steps=2), resumed, quiet=True)  # resumes at step 3
    assert summary["step"] == 7
    # each summary reports the progress its session's last checkpoint saved, train_seconds restored on resume
    # included (bookkeeping here, no measured time is asserted). Left out: epoch and position (a checkpoint saved
    # at the end of an epoch says (epoch e, position = its length), the summary, after the loop has moved on,
    # (e + 1, 0), the same point of the data) and best (the summary's is the best saved score, an off-schedule
    # validation's included; the checkpoint's is early stopping's reference, which leaves those out)
    from sanlab.training.checkpoint import load_state

    def progress(record: dict) -> dict:
        return {k: record[k] for k in ("step", "bad_validations", "train_seconds")}

    saved = {p.name: load_state(p)["progress"] for p in (resumed / "checkpoints").glob("step-*")}
    assert progress(first) == progress(saved["step-00000003"])
    assert progress(summary) == progress(saved["step-00000007"])
    a, b = final_weights(straight), final_weights(resumed)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_resumed_tagging_run_equals_uninterrupted(tmp_path):
    """The tagger validates after every epoch: 1 + 2 epochs in two sessions == 3 straight (dropout on)."""
    from sanlab.config import validate
    from sanlab.data.synthetic import write_tagging_corpus

    data = tmp_path / "data"
    write_tagging_corpus(data, seed=2, sizes={"train": 60, "dev": 20, "test": 20})

    def config(epochs):
        return validate({"task": "tagging", "data": {"train": str(data / "train.conllu"), "dev": str(data / "dev.conllu")},
                         "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1,
                                   "encoder": {"layers": 1}},
                         "train": {"batch_size": 8, "max_epochs": epochs, "patience": 0, "progress": False,
                                   "seed": 5}}, source="test")

    train_run(config(3), tmp_path / "straight", quiet=True)
    train_run(config(1), tmp_path / "resumed", quiet=True)
    summary = train_run(config(3), tmp_path / "resumed", quiet=True)
    assert summary["epoch"] == 3
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_resume_refuses_a_different_model(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=3), run, quiet=True)
    with pytest.raises(ConfigError, match="train.lr"):
        train_run(tiny_translation(max_steps=3, lr=0.5), run, quiet=True)


def test_a_run_whose_config_yaml_spells_inherited_keys_out_resumes_to_the_uninterrupted_weights(tmp_path,
                                                                                              tiny_translation):
    """config.yaml written before inherited keys were left out (the cross-attention's heads, dropout, bias and
    out_proj spelt out as set): the run resumes from that file to the weights of a run never stopped."""
    from sanlab.config import dump_config, load_config, validate
    from sanlab.config_yaml import dump_yaml

    def config(max_steps: int):
        raw = yaml.safe_load(dump_config(tiny_translation(max_steps=max_steps)))
        raw["model"]["decoder"]["cross_attention"] = {"dropout": 0.1}
        return validate(raw, source="test")

    run, straight = tmp_path / "run", tmp_path / "straight"
    train_run(config(3), run, quiet=True)
    old_style = dump_yaml(config(3).model_dump(mode="json"))  # what dump_config wrote before
    assert yaml.safe_load(old_style)["model"]["decoder"]["cross_attention"]["heads"] == 2
    (run / "config.yaml").write_text(old_style)
    assert train_run(load_config(run / "config.yaml", ["train.max_steps=6"]), run, quiet=True)["step"] == 6
    train_run(config(6), straight, quiet=True)
    resumed, uninterrupted = final_weights(run), final_weights(straight)
    assert resumed.keys() == uninterrupted.keys() and all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


@pytest.mark.parametrize("other, named", [((None, None), "no checkpoint"),
                                          (("step-00000002", {}), "step-00000002"),
                                          (("step-00000004", {"model.safetensors": "0" * 64}), "step-00000004 \\(other "
                                                                                               "files\\)")],
                         ids=["none", "an-older-one", "a-copy-trained-apart"])
def test_processes_that_would_resume_from_different_checkpoints_stop_before_training(tmp_path, tiny_translation,
                                                                                    monkeypatch, other, named):
    """Every process of a distributed run reads the run directory itself; one on a node that sees another copy (or
    none) must not train on from other weights. The other rank is simulated: gather gives its answer as rank 1's."""
    from sanlab.training.distributed import Distributed

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=4, valid_every=2), run, quiet=True)
    monkeypatch.setattr(Distributed, "gather", lambda self, value: [value, other])
    with pytest.raises(TrainingError, match=f"resume from different checkpoints \\(rank 0: step-0+4; rank 1: "
                                            f"{named}\\): every process must read the same run"):
        train_run(tiny_translation(max_steps=6, valid_every=2), run, quiet=True)
    monkeypatch.undo()
    assert train_run(tiny_translation(max_steps=6, valid_every=2), run, quiet=True)["step"] == 6  # nothing lost


def test_resume_refuses_a_budget_the_run_has_already_passed(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=4), run, quiet=True)
    config = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="has trained 4 updates, more than train.max_steps=2"):
        train_run(tiny_translation(max_steps=2), run, quiet=True)
    assert (run / "config.yaml").read_text() == config  # the run still says what it was trained with


def test_resume_refuses_fewer_epochs_or_a_tighter_patience_but_accepts_a_looser_one(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=30, lr=0.0, warmup_steps=0, patience=2), run, quiet=True)
    checkpoints = run / "checkpoints"
    latest = json.loads((checkpoints / "latest.json").read_text())["checkpoint"]
    epoch = json.loads((checkpoints / latest / "meta.json").read_text())["epoch"]
    assert epoch >= 1
    config = (run / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="train.patience=2; train.patience=1 would stop it"):
        train_run(tiny_translation(max_steps=30, lr=0.0, warmup_steps=0, patience=1), run, quiet=True)
    with pytest.raises(ConfigError, match=f"trained {epoch} epochs.*, more than train.max_epochs={epoch - 1}"):
        train_run(tiny_translation(max_steps=30, lr=0.0, warmup_steps=0, patience=2, max_epochs=epoch - 1), run,
                  quiet=True)
    assert (run / "config.yaml").read_text() == config
    stopped = json.loads((checkpoints / latest / "meta.json").read_text())["step"]
    looser = train_run(tiny_translation(max_steps=30, lr=0.0, warmup_steps=0, patience=3), run, quiet=True)
    assert looser["step"] > stopped  # a larger patience continues the run


def test_resume_refuses_max_epochs_equal_to_an_epoch_already_begun(tmp_path, tiny_translation):
    run = tmp_path / "run"
    summary = train_run(tiny_translation(max_steps=4, valid_every=4), run, quiet=True)
    assert summary["position"] > 0  # stopped by max_steps inside an epoch
    with pytest.raises(ConfigError, match=f"trained {summary['epoch']} epochs and {summary['position']} batches of "
                                          f"the next, more than train.max_epochs={summary['epoch']}"):
        train_run(tiny_translation(max_steps=4, valid_every=4, max_epochs=summary["epoch"]), run, quiet=True)


@pytest.mark.parametrize("clip_norm,clipping", [(0.0, r"--set train.clip_norm=1.0"),
                                                 (0.5, r"a smaller train.clip_norm \(this run clips at 0.5\)")])
def test_nan_loss_stops_without_saving(tmp_path, tiny_translation, clip_norm, clipping):
    run = tmp_path / "run"
    make = functools.partial(tiny_translation, clip_norm=clip_norm)
    train_run(make(max_steps=3), run, quiet=True)
    saved = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    with pytest.raises(TrainingError, match=r"loss is nan at update 4 \(epoch \d+\); stopping without saving it\. Last "
                                            r"good checkpoint: .*step-00000003\. Try a lower learning rate, longer "
                                            rf"warm-up or {clipping}\.$"):
        _poison_and_train(run, make)
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == saved


def test_a_non_finite_loss_under_fp16_names_bf16_first(tmp_path, tiny_translation):
    """fp16's loss scale recovers from gradients that overflow, not from a forward pass past fp16's range."""
    run = tmp_path / "run"
    fp16 = lambda **train: tiny_translation(precision="fp16", **train)  # noqa: E731
    train_run(fp16(max_steps=3), run, quiet=True)
    with pytest.raises(TrainingError, match="loss is nan at update 4 .* Under fp16 a value past 65,504 in the forward "
                                            "pass gives this: try train.precision=bf16"):
        _poison_and_train(run, fp16)


def test_non_finite_weights_are_never_validated_or_saved(tmp_path, tiny_translation, monkeypatch):
    """A step can overflow with a finite loss and gradient (here: forced after update 2)."""
    from sanlab.training import loop

    update = loop.Trainer.update

    def overflowing_update(self, group):
        result = update(self, group)
        if self.progress.step == 2:
            with torch.no_grad():
                next(self.model.parameters())[0] = float("inf")
        return result

    monkeypatch.setattr(loop.Trainer, "update", overflowing_update)
    run = tmp_path / "run"
    with pytest.raises(TrainingError, match=r"weights are not finite after update 2 \(1 tensors, e.g. .*"
                                            r"Last good checkpoint: .*step-00000001"):
        train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)
    assert [p.name for p in (run / "checkpoints").glob("step-*")] == ["step-00000001"]


def test_a_huge_finite_step_stops_at_validation(tmp_path, tiny_translation):
    """lr 1e30: update 1 leaves finite weights whose outputs overflow; the validation loss says so before
    anything is decoded or saved."""
    run = tmp_path / "run"
    config = tiny_translation(max_steps=3, valid_every=1, lr=1e30, schedule="constant", warmup_steps=0)
    with pytest.raises(TrainingError, match=r"validation loss is (nan|inf) after update 1: the model's outputs are "
                                            r"not finite.*Last good checkpoint: none yet \(no checkpoint was written\)"):
        train_run(config, run, quiet=True)
    assert not list((run / "checkpoints").glob("step-*"))


def _poison_and_train(run, make):
    """Resume the run after setting one weight to NaN: the next loss is NaN."""
    from safetensors.torch import save_file

    from sanlab.training.checkpoint import checksums

    latest = sorted((run / "checkpoints").glob("step-*"))[-1]
    weights = load_file(str(latest / "model.safetensors"))
    name = next(k for k in weights if "generator" in k or "embed" in k)
    weights[name][0, 0] = float("nan")
    save_file(weights, str(latest / "model.safetensors"))
    meta = json.loads((latest / "meta.json").read_text())  # a NaN that was written as it is, not damage
    (latest / "meta.json").write_text(json.dumps({**meta, "sha256": checksums(latest)}))
    train_run(make(max_steps=6), run, quiet=True)


def test_a_run_stopped_by_patience_does_not_train_on_when_rerun(tmp_path, tiny_translation):
    run = tmp_path / "run"
    # lr 0: the score can never improve, so patience 1 stops the run at its second validation (step 6)
    first = train_run(tiny_translation(max_steps=30, lr=0.0, warmup_steps=0, patience=1), run, quiet=True)
    again = train_run(tiny_translation(max_steps=30, lr=0.0, warmup_steps=0, patience=1), run, quiet=True)
    assert first["step"] == again["step"] == 6
    # each session's log says why it stopped: patience, in its config key's words
    stops = [line for line in (run / "train.log").read_text().splitlines() if "finished at step" in line]
    assert len(stops) == 2 and all(line.endswith("stopped early, 1 validation without a better bleu "
                                                 "(train.patience = 1)") for line in stops)
    budget = train_run(tiny_translation(max_steps=3), tmp_path / "budget", quiet=True)
    assert budget["step"] == 3
    assert (tmp_path / "budget" / "train.log").read_text().rstrip().endswith("reached train.max_steps = 3")


def test_raising_the_budget_on_resume_stops_where_a_straight_run_stops(tmp_path, tiny_translation):
    """The validation at max_steps=4 is off the valid_every=3 schedule: checkpointed, not counted for patience."""
    settings = dict(lr=0.0, warmup_steps=0, valid_every=3, patience=3)
    straight = train_run(tiny_translation(max_steps=12, **settings), tmp_path / "straight", quiet=True)
    train_run(tiny_translation(max_steps=4, **settings), tmp_path / "legs", quiet=True)
    assert (tmp_path / "legs" / "checkpoints" / "step-00000004").is_dir()  # the first leg's work is saved
    legs = train_run(tiny_translation(max_steps=12, **settings), tmp_path / "legs", quiet=True)
    assert straight["step"] == legs["step"] == 12  # lr 0: validations at 3 (best), 6, 9, 12 -> patience 3 at 12
    assert "not counted for early stopping" in (tmp_path / "legs" / "train.log").read_text()
    # an off-schedule validation is still a score: max_steps=0 validates the initial weights and reports it
    initial = train_run(tiny_translation(max_steps=0, **settings), tmp_path / "initial", quiet=True)
    assert initial["step"] == 0 and initial["best"] is not None

    def first_valid_loss(run):
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return next(r["loss"] for r in records if r.get("split") == "valid")
    # lr 0: the initial weights are the weights of the straight run's first validation (BLEU, likely 0 for both,
    # would not tell them apart; the loss does)
    assert first_valid_loss(tmp_path / "initial") == pytest.approx(first_valid_loss(tmp_path / "straight"), rel=1e-6)
    assert first_valid_loss(tmp_path / "initial") > 0


@contextlib.contextmanager
def _locked_by_another_process(run):
    """Hold the run's lock as another process would: its own open file description with an flock."""
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / ".lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, b"4242")
    try:
        yield
    finally:
        os.close(fd)


def test_second_process_on_the_same_run_is_refused_and_a_dead_holders_lock_is_free(tmp_path):
    from sanlab.runs import run_lock

    run = tmp_path / "run"
    with _locked_by_another_process(run):
        with pytest.raises(ConfigError, match=r"being trained or evaluated by another process \(pid 4242\)"):
            with run_lock(run):
                pass
    # the holder is gone (its descriptor closed, as when a process dies): the file is left, the lock is free
    assert (run / ".lock").read_text() == "4242"
    with run_lock(run):
        assert (run / ".lock").read_text() == str(os.getpid())
        with pytest.raises(ConfigError, match="another process"):  # one holder at a time, even in one process
            with run_lock(run):
                pass


def test_what_a_finished_run_records_is_written_while_the_run_is_still_locked(tmp_path, tiny_translation):
    """``train_run(on_finished=...)``: ``sanlab compare`` writes a cell's ``done.json`` there, so no other process
    finds the cell finished but unrecorded (and trains or scores it again)."""
    from sanlab.runs import run_lock

    run, seen = tmp_path / "run", []

    def on_finished(summary):
        with pytest.raises(ConfigError, match="another process"):
            with run_lock(run):
                pass
        seen.append(summary["step"])

    assert train_run(tiny_translation(max_steps=2), run, quiet=True, on_finished=on_finished)["step"] == 2
    assert seen == [2]
    with run_lock(run):  # released afterwards
        pass


def test_overwrite_never_deletes_a_run_being_trained(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2), run, quiet=True)
    with _locked_by_another_process(run):
        with pytest.raises(ConfigError, match="being trained or evaluated by another process"):
            train_run(tiny_translation(max_steps=2), run, overwrite=True, quiet=True)
    assert (run / "checkpoints").exists()
    train_run(tiny_translation(max_steps=2), run, overwrite=True, quiet=True)  # free again: starts afresh
    assert [s["from_step"] for s in json.loads((run / "meta.json").read_text())["sessions"]] == [0]


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path, tiny_translation):
    data = tmp_path / "corpus"
    data.mkdir()
    (data / "train.src").write_text("kept\n")
    with pytest.raises(ConfigError, match=r"corpus: not a sanlab run directory .*refusing to delete what it holds "
                                          r"\(train.src\)"):
        train_run(tiny_translation(max_steps=2), data, overwrite=True, quiet=True)
    assert sorted(p.name for p in data.iterdir() if p.name != ".lock") == ["train.src"]
    empty = tmp_path / "empty"
    empty.mkdir()
    train_run(tiny_translation(max_steps=2), empty, overwrite=True, quiet=True)  # an empty directory is fine
    assert (empty / "config.yaml").exists()


def test_checkpoints_without_their_config_are_never_retrained_over(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2), run, quiet=True)
    (run / "config.yaml").unlink()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(ConfigError, match="has checkpoints but no config.yaml: restore config.yaml to resume"):
        train_run(tiny_translation(max_steps=2), run, quiet=True)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints


def test_a_second_process_leaves_the_running_runs_config_alone(tmp_path, tiny_translation):
    # a resumable difference (a longer budget) would otherwise be written into the running run's
    # config.yaml before the second process found the lock taken
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2), run, quiet=True)
    config = (run / "config.yaml").read_text()
    with _locked_by_another_process(run):
        with pytest.raises(ConfigError, match="being trained or evaluated by another process"):
            train_run(tiny_translation(max_steps=5), run, quiet=True)
    assert (run / "config.yaml").read_text() == config


def _straight_and_killed(tmp_path, config, monkeypatch, *, killed_during: int):
    """Two runs of ``config``: one uninterrupted, one killed during update ``killed_during`` and then rerun (it
    resumes from its last checkpoint). Their directories."""
    from sanlab.training import loop

    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    train_run(config, straight, quiet=True)
    update = loop.Trainer.update

    def killed(self, group):
        if self.progress.step == killed_during - 1:
            raise KeyboardInterrupt("killed")
        return update(self, group)

    monkeypatch.setattr(loop.Trainer, "update", killed)
    with pytest.raises(KeyboardInterrupt):
        train_run(config, crashed, quiet=True)
    checkpoints = sorted(p.name for p in (crashed / "checkpoints").glob("step-*"))
    monkeypatch.setattr(loop.Trainer, "update", update)
    train_run(config, crashed, quiet=True)
    return straight, crashed, checkpoints


def _records(run, split):
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def test_a_crash_between_checkpoints_resumes_to_the_uninterrupted_parameters(tmp_path, tiny_translation, monkeypatch):
    """Killed mid-run (after the step-3 checkpoint, during update 5): the rerun replays updates 4-7 from the
    saved data position and RNG state and ends with the uninterrupted run's weights, validations included;
    metrics.jsonl holds each update once (update 4, logged before the crash, is not repeated)."""
    straight, crashed, checkpoints = _straight_and_killed(tmp_path, tiny_translation(max_steps=7, log_every=1),
                                                          monkeypatch, killed_during=5)
    assert checkpoints == ["step-00000003"]
    a, b = final_weights(straight), final_weights(crashed)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    valid = lambda run: [(r["step"], r["bleu"]) for r in _records(run, "valid")]  # noqa: E731
    assert valid(crashed)[-2:] == valid(straight)[-2:]
    logged = lambda run: [(r["split"], r["step"]) for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                                               .splitlines())]  # noqa: E731
    assert logged(crashed) == logged(straight) and ("train", 4) in logged(straight)
    # the dropped records are the only trace of how far the killed session got: the resume line says it
    resumed = (crashed / "train.log").read_text().split("resumed from")[-1].split("\n")[0]
    assert "(step 3, epoch" in resumed and "had logged updates up to 4: those after 3 are done again" in resumed


def test_a_session_killed_before_its_first_checkpoint_is_named_when_training_starts_again(
        tmp_path, tiny_translation, monkeypatch):
    """Killed during update 3, before the first checkpoint (update 3): the rerun starts from update 0, replaces
    the records of updates 1-2 and says that it does."""
    straight, crashed, checkpoints = _straight_and_killed(tmp_path, tiny_translation(max_steps=4, log_every=1),
                                                          monkeypatch, killed_during=3)
    assert checkpoints == []
    log = (crashed / "train.log").read_text()
    assert "an interrupted session had logged updates up to 2 before its first checkpoint" in log
    assert "resumed from" not in log
    steps = lambda run: [(r["split"], r["step"]) for r in map(json.loads, (run / "metrics.jsonl").read_text()
                                                              .splitlines())]  # noqa: E731
    assert steps(crashed) == steps(straight)


def test_a_train_record_spanning_a_resume_averages_the_same_updates_as_the_uninterrupted_runs(
        tmp_path, tiny_translation, monkeypatch):
    """log_every=4, a checkpoint every 3 updates, killed during update 7: the record at update 8 averages
    updates 5-8, two of them trained before the kill, so the loss of the updates since the last record is saved
    in the checkpoint and restored (it was lost: the record averaged updates 7-8 only)."""
    config = tiny_translation(max_steps=8, log_every=4, valid_every=3)
    straight, crashed, checkpoints = _straight_and_killed(tmp_path, config, monkeypatch, killed_during=7)
    assert checkpoints[-1] == "step-00000006"
    train = lambda run: [(r["step"], r["loss"], r["lr"]) for r in _records(run, "train")]  # noqa: E731
    assert [step for step, *_ in train(straight)] == [4, 8]
    assert train(crashed) == train(straight)  # exactly: the same float sums in the same order


def test_a_translation_run_killed_before_its_first_checkpoint_takes_the_subword_model_of_the_data_now(
        tmp_path, tiny_translation, monkeypatch):
    """Restarted from step 0 on changed data (--allow-changed-data), the run's subword model is the new data's,
    not the one it copied before it was killed; a resume keeps the model its checkpoints were trained with."""
    from training_fixtures import killed_at_its_first_update

    config = tiny_translation(max_steps=2)
    run = tmp_path / "run"
    killed_at_its_first_update(config, run, monkeypatch)
    model = run / "subword.model"
    first = model.read_bytes()
    src, tgt = (tmp_path / "train.src"), (tmp_path / "train.tgt")
    for path in (src, tgt):  # other text: other subwords
        path.write_text(path.read_text() + "".join(f"quixotic{k} zephyr{k}\n" for k in range(150)))
    train_run(config, run, quiet=True, allow_changed_data=True)
    second = model.read_bytes()
    assert second != first
    for path in (src, tgt):
        path.write_text(path.read_text() + "".join(f"jubilant{k}\n" for k in range(150)))
    train_run(tiny_translation(max_steps=3), run, quiet=True, allow_changed_data=True)  # a resume
    assert model.read_bytes() == second


def test_resume_falls_back_to_the_newest_complete_checkpoint(tmp_path, tiny_translation):
    """latest.json naming a checkpoint that is gone (or a half-written temp directory) must not restart the run."""
    from sanlab.training.checkpoint import latest_checkpoint

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=6), run, quiet=True)
    checkpoints = run / "checkpoints"
    assert latest_checkpoint(checkpoints).name == "step-00000006"
    shutil.rmtree(checkpoints / "step-00000006")
    (checkpoints / ".step-00000009.tmp").mkdir()  # a crash while writing
    assert latest_checkpoint(checkpoints).name == "step-00000003"
    summary = train_run(tiny_translation(max_steps=6), run, quiet=True)
    assert summary["step"] == 6
    assert "resumed from" in (run / "train.log").read_text() and "step 3" in (run / "train.log").read_text()
    assert not (checkpoints / ".step-00000009.tmp").exists()


def test_meta_json_records_every_session_with_the_threads_it_trained_with(tmp_path, tiny_translation):
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, threads=1), run, quiet=True)
    train_run(tiny_translation(max_steps=4, threads=1, device="cpu"), run, quiet=True)  # resumed
    meta = json.loads((run / "meta.json").read_text())
    assert meta["threads"] == 1 and meta["processes"] == 1
    assert [s["from_step"] for s in meta["sessions"]] == [0, 2]
    assert all(s["threads"] == 1 and s["command"] for s in meta["sessions"])
    # what else its speed depends on (experiments/cells.speed_conditions)
    assert [(s["device"], s["precision"], s["compile"], s["deterministic"]) for s in meta["sessions"]] == \
        [("cpu", "fp32", False, False)] * 2  # train.device auto and cpu: both the CPU here


def test_a_resume_with_other_cpu_threads_goes_on_and_says_it_is_not_exact(tmp_path, tiny_translation):
    """train.threads may change on resume (and unset, it is the machine's cores), but a CPU sum split over other
    threads rounds differently: train.log says so, naming both, against the session that trained the checkpoint
    (not a later one killed before its first checkpoint)."""
    run = tmp_path / "run"
    warning = "WARNING: not an exact resume: the updates up to 2 were computed with 1 CPU thread(s) and this " \
              "session uses 2 (train.threads, or this machine's cores when unset)"
    train_run(tiny_translation(max_steps=2, valid_every=1, threads=1), run, quiet=True)
    meta = json.loads((run / "meta.json").read_text())
    meta["sessions"].append({**meta["sessions"][-1], "from_step": 2, "threads": 2})  # killed before saving
    (run / "meta.json").write_text(json.dumps(meta))
    assert train_run(tiny_translation(max_steps=3, valid_every=1, threads=2), run, quiet=True)["step"] == 3
    assert warning in (run / "train.log").read_text()
    train_run(tiny_translation(max_steps=4, valid_every=1, threads=2), run, quiet=True)  # as the checkpoint's
    assert (run / "train.log").read_text().count("not an exact resume") == 1
    assert [s["threads"] for s in json.loads((run / "meta.json").read_text())["sessions"]] == [1, 2, 2, 2]


def test_a_programmatic_cli_call_records_its_own_command_not_the_host_process(tmp_path, tiny_translation,
                                                                                 monkeypatch):
    import sys

    from sanlab import invocation
    from sanlab.cli import main
    from sanlab.config import dump_config

    monkeypatch.delenv(invocation.COMMAND_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["host-script.py", "--its-own-flag"])
    config = tmp_path / "c.yaml"
    config.write_text(dump_config(tiny_translation(max_steps=1, threads=1)))
    argv = ["train", str(config), "--run", str(tmp_path / "run"), "--quiet"]
    assert main(argv) == 0
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["command"] == ["sanlab", *argv] and meta["sessions"][-1]["command"] == ["sanlab", *argv]
    assert invocation.command() == ["host-script.py", "--its-own-flag"]  # restored once main returns
    assert invocation.command_line(["/x/.venv/bin/sanlab", "compare", "g 1.yaml"]) == "sanlab compare 'g 1.yaml'"
    with invocation.running(["train", "c.yaml", "--nproc", "2"]):
        with invocation.running(["evaluate", "--run", "r"]):  # nested: the inner call's own command
            assert invocation.command() == ["sanlab", "evaluate", "--run", "r"]
        monkeypatch.setenv("WORLD_SIZE", "2")  # a torchrun worker of `sanlab train --nproc 2`: keeps the user's command
        with invocation.running(["train", "c.yaml", "--run-dir", "r", "--quiet"]):
            assert invocation.command() == ["sanlab", "train", "c.yaml", "--nproc", "2"]
    with invocation.running(["train", "c.yaml", "--run-dir", "r"]):  # plain torchrun -m sanlab: its own command
        assert invocation.command() == ["sanlab", "train", "c.yaml", "--run-dir", "r"]
    assert invocation.command() == ["host-script.py", "--its-own-flag"]


def test_a_checkpoint_write_that_fails_halfway_leaves_the_last_good_one(tmp_path, tiny_translation, monkeypatch):
    """The disk fills while the step-6 checkpoint is written (after its weights, before its state): no
    step-6 directory appears, latest.json still names step 3, and the rerun clears the half-written
    temporary directory and trains on to the uninterrupted weights."""
    from sanlab.training import checkpoint

    straight = tmp_path / "straight"
    train_run(tiny_translation(max_steps=9), straight, quiet=True)
    run = tmp_path / "run"
    save = checkpoint.torch.save

    def disk_full(obj, path, *args, **kwargs):
        if "step-00000006" in str(path):
            raise OSError(28, "No space left on device")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        train_run(tiny_translation(max_steps=9), run, quiet=True)
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-00000003"]
    assert json.loads((checkpoints / "latest.json").read_text()) == {"checkpoint": "step-00000003"}
    assert [p.name for p in checkpoints.glob(".step-*.tmp")] == [".step-00000006.tmp"]
    monkeypatch.setattr(checkpoint.torch, "save", save)
    train_run(tiny_translation(max_steps=9), run, quiet=True)
    assert not list(checkpoints.glob(".step-*"))
    a, b = final_weights(straight), final_weights(run)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)


def test_a_non_finite_gradient_norm_stops_without_saving(tmp_path, tiny_translation, monkeypatch):
    from sanlab.training import loop

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=3), run, quiet=True)
    clip = loop.Trainer._clip
    monkeypatch.setattr(loop.Trainer, "_clip", lambda self: torch.tensor(float("inf")) if self.progress.step == 4
                        else clip(self))
    with pytest.raises(TrainingError, match=r"gradient norm is inf at update 5 \(epoch \d+\); stopping without saving it\. "
                                            r"Last good checkpoint: .*step-00000003"):
        train_run(tiny_translation(max_steps=9), run, quiet=True)
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-00000003"]


def test_damaged_checkpoint_files_are_named_and_resume_skips_them(tmp_path, tiny_translation):
    """A damaged or missing file of the newest checkpoint is named in the log and the run resumes from the
    one before; loading it for decoding or averaging is an error naming the file."""
    from sanlab.runs import average_run

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    newest = sorted((run / "checkpoints").glob("step-*"))[-1]
    state, weights = newest / "state.pt", newest / "model.safetensors"
    good_state, good_weights = state.read_bytes(), weights.read_bytes()
    for damage in (good_state[:100], b"hello world garbage", None):  # a torn zip; not a zip at all; gone
        state.write_bytes(damage) if damage is not None else state.unlink()
        with pytest.raises(ConfigError, match=f"{state}: (damaged|missing)"):
            load_state_of(newest)
    weights.write_bytes(good_weights[:5])
    for load in (lambda: load_trained(run, checkpoint="last"), lambda: average_run(run, last=1)):
        with pytest.raises(ConfigError, match=f"{weights}: damaged"):
            load()
    weights.unlink()
    for load in (lambda: average_run(run, last=1), lambda: load_trained(run, checkpoint="last")):
        with pytest.raises(ConfigError, match=f"{newest}: no model.safetensors in this checkpoint directory"):
            load()
    weights.write_bytes(good_weights)
    summary = train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)  # state.pt is still gone
    log = (run / "train.log").read_text()
    assert f"skipping a damaged checkpoint: {state}: missing" in log and "resumed from" in log
    assert summary["step"] == 4 and "(step 1," in log.split("resumed from")[-1]
    pointer = run / "checkpoints" / "latest.json"
    pointer.write_text('{"checkpoint": 5}')
    with pytest.raises(ConfigError, match=f"{pointer}: expected"):
        train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)


def test_a_checkpoint_whose_meta_json_is_damaged_or_gone_stops_the_run_instead_of_being_written_over(
        tmp_path, tiny_translation):
    """meta.json is what makes a step-N directory a checkpoint. Damaged, or deleted (as a user might, to get past
    the error), the run must not start again from step 0 and write a new step-2 over the old one: it names the
    checkpoint and says to move it away; once moved, the run resumes from the one before."""
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    newest = run / "checkpoints" / "step-00000002"
    weights = (newest / "model.safetensors").read_bytes()
    (newest / "meta.json").write_text('{"step": 2, "sco')
    for damaged in ("not valid JSON", "checkpoint without meta.json"):
        with pytest.raises(ConfigError, match=f"{newest}.*{damaged}.*move step-00000002 out of .*checkpoints .*training "
                                              "then resumes from the checkpoint before it"):
            train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)
        with pytest.raises(ConfigError, match="step-00000002"):
            load_trained(run, checkpoint="last")
        assert (newest / "model.safetensors").read_bytes() == weights  # nothing written over
        (newest / "meta.json").unlink(missing_ok=True)
    newest.rename(tmp_path / "step-00000002.aside")
    summary = train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)
    assert summary["step"] == 4 and "(step 1," in (run / "train.log").read_text().split("resumed from")[-1]


def test_a_checkpoint_damaged_inside_its_tensors_is_caught_by_its_checksum(tmp_path, tiny_translation, monkeypatch):
    """0xff over tensor bytes leaves a readable safetensors file: only the checksum tells. Resume skips it, and
    the NaN message's "last good checkpoint" is one that loaded and validated."""
    from sanlab.training import loop

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    weights = run / "checkpoints" / "step-00000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64  # the header is at the start: it stays intact
    weights.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"{weights}: damaged: its sha256 differs"):
        load_trained(run, checkpoint="last")
    meta_path = weights.parent / "meta.json"  # the weights' checksum edited out of meta.json: not loaded unchecked
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "sha256": {"state.pt": meta["sha256"]["state.pt"]}}))
    with pytest.raises(ConfigError, match=f"{meta_path}: damaged: \"sha256\" records no checksum of "
                                          "model.safetensors"):
        load_trained(run, checkpoint="last")
    meta_path.write_text(json.dumps(meta))
    update = loop.Trainer.update

    def nan_at_four(self, group):
        if self.progress.step == 3:  # a weight turned NaN: the loss of update 4 is NaN
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return update(self, group)

    monkeypatch.setattr(loop.Trainer, "update", nan_at_four)
    with pytest.raises(TrainingError, match=r"loss is nan at update 4.*Last good checkpoint: .*step-00000003\."):
        train_run(tiny_translation(max_steps=6, valid_every=1), run, quiet=True)
    log = (run / "train.log").read_text()
    assert f"skipping a damaged checkpoint: {weights}: damaged" in log
    assert "(step 1," in log.split("resumed from")[-1]


def load_state_of(checkpoint):
    from sanlab.training.checkpoint import load_state

    return load_state(checkpoint)


def test_a_checkpoint_of_another_model_is_named(tmp_path, tiny_translation):
    run, other = tmp_path / "run", tmp_path / "other"
    train_run(tiny_translation(max_steps=1), run, quiet=True)
    config = tiny_translation(max_steps=1)
    train_run(config.model_copy(update={"model": config.model.model_copy(update={"dim": 8})}), other, quiet=True)
    foreign = sorted((other / "checkpoints").glob("step-*"))[-1]
    with pytest.raises(ConfigError, match=f"{foreign}/model.safetensors: holds the weights of another model"):
        load_trained(run, checkpoint=str(foreign))


def test_a_run_path_that_is_a_file_is_refused_and_an_untrained_run_has_nothing_to_average(tmp_path, tiny_translation):
    from sanlab.runs import average_run, prepare_run_dir

    afile = tmp_path / "afile"
    afile.write_text("not a run\n")
    with pytest.raises(ConfigError, match="afile: is a file, not a run directory"):
        train_run(tiny_translation(max_steps=1), afile, quiet=True)
    assert afile.read_text() == "not a run\n"
    run = tmp_path / "run"
    run.mkdir()
    prepare_run_dir(run, tiny_translation(max_steps=1), overwrite=False)  # config.yaml, no checkpoints yet
    with pytest.raises(ConfigError, match="run: has no checkpoints to average"):
        average_run(run, last=1)
    trained = tmp_path / "trained"
    train_run(tiny_translation(max_steps=1), trained, quiet=True)
    with pytest.raises(ConfigError, match=r"averaged: no model.safetensors in this checkpoint directory \(run "
                                          r"`sanlab average --run .*trained --last N` first\)"):
        load_trained(trained, checkpoint="averaged")


def test_a_resume_that_cannot_continue_the_gpu_random_streams_says_so(tmp_path, tiny_translation, monkeypatch):
    """A GPU run resumed on the CPU (or on a GPU the checkpoint has no stream of) is not an exact resume:
    the log says so instead of continuing quietly."""
    from sanlab.training import loop

    real = loop.rng_state
    monkeypatch.setattr(loop, "rng_state", lambda device=None: {**real(), "cuda": [torch.zeros(16, dtype=torch.uint8)]})
    train_run(tiny_translation(max_steps=3), tmp_path / "run", quiet=True)
    monkeypatch.setattr(loop, "rng_state", real)
    train_run(tiny_translation(max_steps=5), tmp_path / "run", quiet=True)
    log = (tmp_path / "run" / "train.log").read_text()
    assert ("WARNING: not an exact resume: the checkpoint has the random streams of 1 GPU(s) and this run "
            "computes on cpu") in log


def test_each_gpu_stream_goes_back_to_the_gpu_of_its_index(monkeypatch):
    from sanlab.training.checkpoint import rng_state, set_rng_state

    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, index: restored.append((int(state[0]), index)))
    state = {**rng_state(), "cuda": [torch.full((4,), 7, dtype=torch.uint8)]}
    assert set_rng_state(state, torch.device("cuda", 0)) is None and restored == [(7, 0)]
    assert "none for cuda:1" in set_rng_state(state, torch.device("cuda", 1))  # saved on one GPU, here two
    state["cuda"] *= 3
    restored.clear()
    assert set_rng_state(state, torch.device("cuda", 1)) is None and restored == [(7, 0), (7, 1)]


def test_the_stream_of_the_gpu_a_run_trained_on_goes_to_the_gpu_it_resumes_on(monkeypatch):
    """Trained on cuda:1 (dropout drew from GPU 1's stream) and resumed on cuda:0: GPU 0 continues GPU 1's
    stream, not its own untouched one; checkpoints that name no GPU keep the streams by index (above)."""
    from sanlab.training.checkpoint import rng_state, set_rng_state

    restored = []
    streams = [torch.full((4,), 0, dtype=torch.uint8), torch.full((4,), 1, dtype=torch.uint8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: streams)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, index: restored.append((int(state[0]), index)))
    state = rng_state(torch.device("cuda", 1))
    assert state["cuda_device"] == 1 and rng_state(torch.device("cpu")).keys() == state.keys() - {"cuda_device"}
    assert set_rng_state(state, torch.device("cuda", 0)) is None and restored == [(1, 0)]
    restored.clear()
    assert set_rng_state({**state, "cuda": streams[1:], "cuda_device": 0}, torch.device("cuda", 1)) is None
    assert restored == [(1, 1)]  # one GPU's stream, saved on cuda:0: continued on cuda:1, with no warning
    assert "computes on cpu" in set_rng_state(state, torch.device("cpu"))


def test_a_cpu_run_resumed_on_a_gpu_says_its_dropout_draws_start_anew():
    """A checkpoint of a run on the CPU has no CUDA stream: resumed on a GPU, dropout draws from a stream that run
    never had, which the log says (the resume goes on)."""
    from sanlab.training.checkpoint import set_rng_state

    state = {"torch": torch.get_rng_state(), "python": __import__("random").getstate()}
    assert set_rng_state(state, torch.device("cpu")) is None
    assert "written by a run on the CPU and this run computes on cuda:0" in set_rng_state(state, torch.device("cuda", 0))


def test_a_run_checkpoint_named_by_its_step_is_read_only_with_its_meta_json(tmp_path, tiny_translation):
    """``--checkpoint step-N`` reads one of the run's own checkpoints: its meta.json damaged, the error says to move
    the checkpoint away (as resuming and averaging do), not to delete the file; deleted, the weights are not loaded
    unchecked (their checksums are in it), whatever their bytes."""
    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    newest = run / "checkpoints" / "step-00000002"
    weights = newest / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64  # a readable file: only the checksum in meta.json tells
    weights.write_bytes(bytes(data))
    (newest / "meta.json").write_text('{"step": 2, "sco')
    for damaged in ("not valid JSON", "checkpoint without meta.json"):
        for name in ("step-2", str(newest)):
            with pytest.raises(ConfigError, match=f"{newest}.*{damaged}.*move step-00000002 out of "):
                load_trained(run, checkpoint=name)
        (newest / "meta.json").unlink(missing_ok=True)


def test_a_meta_json_whose_checksums_were_emptied_does_not_load_damaged_files_unchecked(tmp_path, tiny_translation):
    """Checkpoints written before checksums existed have no "sha256" at all and load unchecked; sanlab never writes
    an empty one, so ``"sha256": {}`` is an edit that would let damaged weights and state load silently."""
    from sanlab.runs import average_run

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    newest = run / "checkpoints" / "step-00000002"
    weights, meta_path = newest / "model.safetensors", newest / "meta.json"
    data = bytearray(weights.read_bytes())
    data[-64:] = b"\xff" * 64
    weights.write_bytes(bytes(data))
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "sha256": {}}))
    said = f"{meta_path}: damaged: \"sha256\" records no checksum of model.safetensors"
    for load in (lambda: load_trained(run, checkpoint="last"), lambda: average_run(run, last=1)):
        with pytest.raises(ConfigError, match=said):
            load()
    with pytest.raises(ConfigError, match=f"{meta_path}: damaged: \"sha256\" records no checksum of state.pt"):
        load_state_of(newest)


def test_a_checkpoint_file_that_cannot_be_read_is_named_not_a_traceback(tmp_path, tiny_translation, monkeypatch):
    """A model.safetensors or state.pt that cannot even be opened to check its checksum (a directory in its place;
    for another user, a file without read permission, stood in for here: the tests may run as root) is a
    DamagedCheckpoint naming it, when averaging as when loading."""
    from sanlab.runs import average_run
    from sanlab.training import checkpoint
    from sanlab.training.checkpoint import DamagedCheckpoint

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    newest = run / "checkpoints" / "step-00000002"
    weights = newest / "model.safetensors"
    weights.unlink()
    weights.mkdir()
    with pytest.raises(DamagedCheckpoint, match=f"{weights}: cannot be read \\(IsADirectoryError"):
        average_run(run, last=1)

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(checkpoint, "file_sha256", unreadable)
    with pytest.raises(DamagedCheckpoint, match=f"{newest / 'state.pt'}: cannot be read "
                                                "\\(PermissionError: .*Permission denied"):
        load_state_of(newest)


@pytest.mark.parametrize("file_name", ["state.pt", "model.safetensors"])
def test_a_resume_that_cannot_read_the_newest_checkpoint_stops_and_deletes_nothing(tmp_path, tiny_translation,
                                                                                   monkeypatch, file_name):
    """A file the operating system will not let us read (permissions, an I/O error; stood in for here, as the
    tests may run as root) is not known to be damaged: resuming from an older checkpoint would delete the newest
    (``discard_after``) and redo its updates. The resume stops naming the file, and every checkpoint stays."""
    from sanlab.training import checkpoint
    from sanlab.training.checkpoint import UnreadableCheckpoint

    run = tmp_path / "run"
    train_run(tiny_translation(max_steps=2, valid_every=1), run, quiet=True)
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    newest = run / "checkpoints" / "step-00000002"
    real_sha256 = checkpoint.file_sha256

    def unreadable(path):
        if path == newest / file_name:
            raise OSError(5, "Input/output error", str(path))
        return real_sha256(path)

    monkeypatch.setattr(checkpoint, "file_sha256", unreadable)
    with pytest.raises(UnreadableCheckpoint, match=f"{newest / file_name}: cannot be read \\(OSError: .*Input/output "
                                                   "error.*nothing was deleted"):
        train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    monkeypatch.setattr(checkpoint, "file_sha256", real_sha256)
    summary = train_run(tiny_translation(max_steps=4, valid_every=1), run, quiet=True)  # readable again: resumes
    assert summary["step"] == 4 and "(step 2," in (run / "train.log").read_text().split("resumed from")[-1]
