"""Creating or resuming a run directory: the saved config against the new one (``RESUMABLE_KEYS`` may
differ), the training data against its fingerprint, and budgets that would shorten a trained run."""

from __future__ import annotations

import os
from pathlib import Path

from sanlab.config import TASKS, Config, dump_config, validate, without_ignored_train_keys
from sanlab.config_yaml import read_yaml_mapping
from sanlab.data.fingerprint import changes, fingerprints, with_content
from sanlab.errors import ConfigError, DataError
from sanlab.files import read_json, write_json, write_text
from sanlab.training import rundir
from sanlab.training.checkpoint import META, CheckpointManager, check_checkpoints_link, latest_checkpoint
from sanlab.training.layout import RunLayout
from sanlab.runs.provenance import provenance
from sanlab.tasks.base import task_for, task_named


RESUMABLE_KEYS = ("train.max_steps", "train.max_epochs", "train.patience", "train.progress", "train.threads",
                  "train.find_unused_parameters", "train.device",  # a CPU run may go on on a GPU, and back
                  "train.deterministic",  # which kernels compute (up to rounding), not what: may change mid-run
                  "train.log_every", "decode.beam", "decode.length_penalty",
                  "decode.length_penalty_style", "decode.n_best")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_differences(old: dict, new: dict) -> list[str]:
    """The dotted keys whose values differ between two dumped configs; ``train.best_metric`` compared as the
    metric it means (unset: the task's own), so spelling out the task's own is no change."""
    a, b = _flatten(_best_metric_named(old)), _flatten(_best_metric_named(new))
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def _best_metric_named(dumped: dict) -> dict:
    """``dumped`` with an unset ``train.best_metric`` set to its task's own metric (a task not registered here:
    as it is)."""
    train = dumped.get("train")
    if not isinstance(train, dict) or train.get("best_metric") is not None or dumped.get("task") not in TASKS.names():
        return dumped
    return {**dumped, "train": {**train, "best_metric": task_named(dumped["task"]).metric}}


def _best_metric_hint(old: dict, blocking: list[str]) -> str:
    """Where train.best_metric differs, the --set that resumes the run as it trained (a run begun before its recipe
    chose a metric, e.g. the IWSLT14 recipes' loss, picks by its task's own); where other keys differ too, it alone
    would not resume it."""
    chosen = _best_metric_named(old).get("train", {}).get("best_metric")
    if "train.best_metric" not in blocking or not isinstance(chosen, str):
        return ""
    if blocking == ["train.best_metric"]:
        return f" (it picks its best checkpoints by {chosen}: add --set train.best_metric={chosen} to resume it)"
    return (f" (it picks its best checkpoints by {chosen}: to resume it, set the other keys back as it trained and "
            f"add --set train.best_metric={chosen})")


def prepare_run_dir(run_dir: Path, config: Config, *, overwrite: bool) -> bool:
    """Create ``run_dir`` for ``config``; returns True if it holds a run to resume.

    Resuming with a different config is an error unless only ``RESUMABLE_KEYS`` differ (e.g. a
    larger ``train.max_steps``); pass ``--overwrite`` to start again or choose another directory.
    A directory sanlab did not make is never written into or emptied (``training.rundir``).
    Call it holding ``run_lock(run_dir)`` (``train_run`` does), so that no other process is writing the run.
    """
    run_dir, layout = Path(run_dir), RunLayout(run_dir)
    rundir.check_location(run_dir)
    check_checkpoints_link(run_dir)  # before anything reads the run as one without checkpoints
    saved = layout.config
    if overwrite:
        rundir.empty_run(run_dir)
    if not saved.exists() and layout.checkpoints.exists() and not rundir.is_empty_directory(layout.checkpoints):
        if layout.checkpoints.is_symlink():  # the user's link for a new run: no run of this directory trained there
            held = sorted(p.name for p in layout.checkpoints.iterdir())
            raise ConfigError(f"{run_dir}: checkpoints is a link to {os.readlink(layout.checkpoints)}, which holds "
                              f"{', '.join(held[:5])}{' ...' if len(held) > 5 else ''}; a new run's checkpoints go "
                              "into an empty directory: link one (a directory of this run's own), or move those away (if they are "
                              "this run's, restore its config.yaml to resume)")
        # a resume could not be checked, and a fresh start would replace them
        raise ConfigError(f"{run_dir}: has checkpoints but no config.yaml: restore config.yaml to resume, or "
                          "move the checkpoints away (or choose another --run directory) to start again")
    if layout.done.exists() and saved.exists() and not CheckpointManager.has_checkpoints(run_dir):
        # committed or imported with its small files only: a "resume" would start from scratch over its results
        raise ConfigError(f"{run_dir}: a finished grid cell whose checkpoints are not here ({layout.done.name} "
                          "without checkpoints/): it cannot train on; train in another --run directory, or pass "
                          "--overwrite to replace it")
    if not rundir.is_run(run_dir):
        rundir.check_new_run(run_dir)
    text = dump_config(config)
    if saved.exists():
        # Re-validated as load_run_config does, so keys added to the schema since then compare as their defaults;
        # the values compared, not the file's spelling (a key inherited, or written out as set by older code)
        old = load_run_config(run_dir).model_dump(mode="json")
        diff = config_differences(old, config.model_dump(mode="json"))
        blocking = [k for k in diff if not k.startswith(RESUMABLE_KEYS)]
        if blocking:
            raise ConfigError(f"{run_dir} holds a run with a different config ({saved}); differing keys: "
                              f"{', '.join(blocking)}. Resume with the same config, pass --overwrite to start "
                              f"again, or choose another --run directory{_best_metric_hint(old, blocking)}")
        problem = shorter_budget(run_dir, config, old)
        if problem:
            raise ConfigError(f"{run_dir}: {problem}; a shorter budget needs a new run (another --run directory, "
                              "or --overwrite)")
        if diff:  # the run's own saved config, rewritten only when a resumable key changed
            write_text(saved, text)
        return CheckpointManager.has_checkpoints(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(layout.meta, provenance(config))  # the marker first: from here on it is a run
    write_text(saved, text)
    return False


def training_data_changes(run_dir: Path, config: Config) -> dict[str, str]:
    """What changed, by file, in the training data since the run last trained on it (``data.fingerprint.changes``;
    nothing for a run that recorded no fingerprint). Reads only."""
    return _data_changes(read_json(RunLayout(run_dir).meta) or {}, config)[2]


def refuse_changed_scored_files(run_dir: Path, config: Config, files: list[str] | None = None) -> None:
    """A DataError naming the first of ``files`` (default ``Task.scored_against``: the tagger's training file, its
    word groups, OOV, ambiguous, one training tag, are counted against it) that changed since the run trained on
    it, or the scores would be counted against other data under this run's name (``sanlab evaluate``, ``compare
    --rescore``). A run whose meta.json cannot be read has lost that record, not its weights: it is scored (as a
    grid does)."""
    files = task_for(config).scored_against(config) if files is None else files
    if not files:
        return
    try:
        changed = training_data_changes(run_dir, config)
    except ConfigError:
        return
    for path in map(str, files):
        if path in changed:
            raise DataError(f"changed since the run in {run_dir} trained on it ({changed[path]}): the scores would be "
                            "counted against other training data than the run's (a tagger's word groups come from its "
                            "training file, a vocabulary built again from its training files); restore the file "
                            "the run trained on, or train the run again", path=path)


def _data_changes(meta: dict, config: Config) -> tuple[dict, dict, dict[str, str]]:
    recorded, current = meta.get("data_fingerprint") or {}, fingerprints(task_for(config).training_files(config))
    return recorded, current, changes(recorded, current)


def check_training_data(run_dir: Path, config: Config, *, allow_changed: bool) -> list[str]:
    """Compare the training data with the fingerprint recorded in ``meta.json`` (``data_fingerprint``).
    Changed data is a DataError naming the file, unless ``allow_changed``; then the changes are returned
    (for the log) and the new fingerprint recorded. A run without one (new, or made before fingerprints)
    records the data it starts or resumes on."""
    path = RunLayout(run_dir).meta
    meta = read_json(path) or provenance(config)
    recorded, current, found = _data_changes(meta, config)
    if found and not allow_changed:
        first = next(iter(found))
        more = f" (and {len(found) - 1} more file(s): {', '.join(list(found)[1:])})" if len(found) > 1 else ""
        raise DataError(f"changed since this run last trained on it ({found[first]}){more}; resuming would "
                        "continue on other data: pass --allow-changed-data to do so anyway, or start a new run "
                        "(another --run directory, or --overwrite)", path=first)
    current = with_content(recorded, current)
    if current != {p: recorded.get(p) for p in current}:
        meta["data_fingerprint"] = {**recorded, **current}
        write_json(path, meta)
    return [f"{p}: {what}" for p, what in found.items()]


def shorter_budget(run_dir: Path, config: Config, old: dict, *, trained: dict | None = None) -> str | None:
    """Why resuming ``run_dir`` (trained under the config dict ``old``) with ``config`` would shorten it
    or tighten its stopping rule, or None. A resume must not: the weights would be saved under a budget
    they have exceeded (a finished run relabelled with settings it did not train under). ``trained``
    ({"step", "epoch"}, e.g. a finished run's summary) stands in when the checkpoints are not there."""
    latest = latest_checkpoint(RunLayout(run_dir).checkpoints)
    meta = (read_json(latest / META) or {}) if latest else (trained or {})
    train = config.train
    step, epoch, patience = meta.get("step"), meta.get("epoch"), old.get("train", {}).get("patience")
    # (a budget lowered to exactly the update or epoch trained is no shorter: a --stop-after checkpoint there is
    # then validated and saved as the run's end, training/loop.py's fit)
    if step is not None and step > train.max_steps:
        return f"it has trained {step} updates, more than train.max_steps={train.max_steps}"
    into = meta.get("position") or 0  # batches into the epoch in progress (recorded since checkpoints name it)
    if epoch is not None and (epoch > train.max_epochs or (epoch == train.max_epochs and into > 0)):
        trained = f"{epoch} epochs" + (f" and {into} batches of the next" if into else "")
        return f"it has trained {trained}, more than train.max_epochs={train.max_epochs}"
    tighter = train.patience > 0 and (patience == 0 or train.patience < patience)  # 0: never stop early
    if meta and patience is not None and tighter:
        return (f"it was trained with train.patience={patience}; train.patience={train.patience} would stop it "
                "under a rule it did not train under")
    return None


def load_run_config(run_dir: Path) -> Config:
    path = RunLayout(run_dir).config
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run directory (no {path.name})")
    # (a run trained before such keys were refused ignored them: they are dropped, not an error)
    return validate(without_ignored_train_keys(read_yaml_mapping(path, what="run config")), source=str(path))
