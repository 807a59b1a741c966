"""The state of a grid's cells on disk: ``cell_state`` (pending, training, trained, evaluated, conflict) from a
cell's run directory, ``done.json`` and evaluation record, and the digests that tie an evaluation record to
its evidence, its scores and the data it was scored on (``data_digests``, ``evidence_intact``,
``scores_digest``), and the key an evaluation depends on (``eval_key``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from sanlab.config import Config, validate, without_ignored_train_keys
from sanlab.config_yaml import read_yaml_mapping
from sanlab.errors import ConfigError
from sanlab.experiments.grid_schema import Cell, EvalSpec
from sanlab.files import read_json
from sanlab.runs import RESUMABLE_KEYS, config_differences, shorter_budget
from sanlab.training.checkpoint import META, latest_checkpoint
from sanlab.training.layout import RunLayout

DONE_FILE = RunLayout.done.name          # written when train_run returns: the cell finished training
EVAL_FILE = RunLayout.compare_eval.name  # written when the cell was evaluated the way the grid asks
FAILED_FILE = RunLayout.failed.name      # the last error of a cell that failed; removed when it is evaluated
# Keys that do not change what was trained: a finished cell stays finished when only these change (a cell
# trained on a GPU is evaluated, not trained again, by a grid run on the CPU, and the other way round).
NOT_TRAINING_KEYS = ("decode.", "train.progress", "train.threads", "train.log_every", "train.device",
                     "train.find_unused_parameters", "train.deterministic")


RERUN_ADVICE = "rerun with the settings (--set) it was trained with, delete it, or choose another --runs-dir"


@dataclass(frozen=True)
class CellState:
    status: Literal["pending", "training", "trained", "evaluated", "conflict"]
    step: int | None = None
    detail: str = ""
    advice: str = RERUN_ADVICE  # what to do about a conflict, where its detail does not say it already

    def describe(self, progress: str = "") -> str:
        """The state in words; ``progress`` follows the status (a live run's log, ``--dry-run``)."""
        text = {"training": f"training step {self.step}", "trained": f"trained (step {self.step})",
                "evaluated": f"evaluated (step {self.step})"}.get(self.status, self.status)
        return text + progress + (f" — {self.detail}" if self.detail else "")


def latest_step(run_dir: Path) -> int | None:
    """Step of the checkpoint a resume would start from, read without creating anything."""
    latest = latest_checkpoint(RunLayout(run_dir).checkpoints)
    if latest is None:
        return None
    meta = read_json(latest / META)
    if meta is None or "step" not in meta:
        raise ConfigError(f"{latest}: checkpoint without meta.json (or without its step); delete it to resume "
                          "from the one before")
    return meta["step"]


def file_digest(path: Path) -> str:
    """sha256 of a file: ties an evaluation record to the evidence file it wrote."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def split_files(cell: Cell) -> list[Path]:
    """The data files the cell is scored on: source and reference (translation) or the CoNLL-U file."""
    return cell.kind.split_files(cell.config, cell.split)


@functools.lru_cache(maxsize=256)
def _digest_of(path: str, mtime_ns: int, size: int) -> str:
    return file_digest(Path(path))


def data_digests(cell: Cell) -> dict[str, str]:
    """sha256 of each file the cell is scored on (missing files are left out); recorded with an
    evaluation, so a test set corrected in place makes the cell score again."""
    found = {}
    for path in split_files(cell):
        if path.is_file():
            stat = path.stat()
            found[str(path)] = _digest_of(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    return found


def evidence_intact(run_dir: Path, record: dict) -> bool:
    """Whether the per-sentence evidence an evaluation record names is still what it wrote (``sanlab
    evaluate`` writes the same ``hyp-*.txt`` and may have replaced it). Records without a digest
    (written before digests existed) are trusted if the file exists."""
    path = Path(run_dir) / record.get("evidence", "")
    if not record.get("evidence") or not path.is_file():
        return False
    if "scores_sha256" in record and scores_digest(record) != record["scores_sha256"]:  # scores edited by hand
        return False
    return "evidence_sha256" not in record or file_digest(path) == record["evidence_sha256"]


def scores_digest(record: dict) -> str:
    """sha256 of an evaluation record's scores with its evidence digest: a score edited by hand (or a merge
    gone wrong) makes the cell score again instead of entering the table."""
    text = json.dumps({"scores": record.get("scores"), "evidence_sha256": record.get("evidence_sha256")},
                      sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_dict(config: Config) -> dict:
    return config.model_dump(mode="json")


def eval_key(cell: Cell, spec: EvalSpec) -> dict:
    """What an evaluation depends on besides the weights; a different key means evaluate again."""
    return {"checkpoint": spec.checkpoint, "average_last": spec.average_last, "split": cell.split,
            **cell.kind.eval_key(cell.config)}


def _stale_groups(record: dict | None, key: dict) -> bool:
    """Whether an evaluation record differs from ``key`` only in the tagging word groups it was scored with."""
    old = dict((record or {}).get("key") or {})
    return "word_groups" in key and old.get("word_groups") != key["word_groups"] and \
        {**old, "word_groups": key["word_groups"]} == key


def _normalised(raw: dict, *, source: Path) -> dict:
    """A saved config re-validated, so keys added to the schema since then compare as their defaults (and keys
    its task never read are dropped, ``without_ignored_train_keys``)."""
    return config_dict(validate(without_ignored_train_keys(raw), source=str(source)))


def read_done(cell: Cell) -> dict | None:
    """The cell's ``done.json`` (None if it has none); a ConfigError naming the file if it is not of the form
    ``cells.train_cell`` writes (the config it trained, its summary's step, when it finished): a file edited or
    cut short outside sanlab makes the cell a conflict, not a traceback."""
    done = read_json(cell.layout.done)
    if done is None:
        return None
    summary = done.get("summary")
    if not (isinstance(done.get("config"), dict) and isinstance(summary, dict) and isinstance(summary.get("step"), int)
            and isinstance(done.get("finished_at"), (int, float))):
        raise ConfigError(f"{cell.layout.done}: not a record of a finished cell (config, summary.step and "
                          "finished_at are expected); delete the cell to train it again")
    return done


def training_changes(done: dict, cell: Cell) -> list[str]:
    """Config keys that changed since the cell finished training (ignoring decode, logging)."""
    old = _normalised(done["config"], source=cell.layout.done)
    return [k for k in config_differences(old, config_dict(cell.config)) if not k.startswith(NOT_TRAINING_KEYS)]


def cell_state(cell: Cell, spec: EvalSpec) -> CellState:
    """pending / training step N / trained / evaluated; ``conflict`` if the directory holds another run
    or cannot be read (the detail says why: one unreadable cell does not stop the grid).

    A finished cell is judged by ``done.json`` alone (decode settings may change: it is only evaluated
    again); an unfinished one by ``config.yaml``, with the rules ``runs.train_run`` will apply to it.
    """
    try:
        return _cell_state(cell, spec)
    except ConfigError as err:
        return CellState("conflict", None, str(err))


def _cell_state(cell: Cell, spec: EvalSpec) -> CellState:
    run, layout = cell.run_dir, cell.layout
    if not layout.config.exists():
        return CellState("pending")
    on_disk, done = latest_step(run), read_done(cell)
    step = done["summary"]["step"] if done and on_disk is None else on_disk  # None: checkpoints not here
    changes = training_changes(done, cell) if done else []
    same_run = ""  # a changed budget under which it would have stopped where it did
    if done:
        if not changes and step > done["summary"]["step"]:  # e.g. `sanlab train` with a larger budget; a
            # budget the grid itself raised (changes) resumes past done.json and is judged by config.yaml below
            return _trained_on_after(step, done)
        changed_data = _changed_training_data(cell)
        if changed_data:
            return CellState("conflict", step, changed_data, advice="")
        if changes and all(k.startswith(RESUMABLE_KEYS) for k in changes):  # only its budget changed
            shorter = shorter_budget(run, cell.config, _normalised(done["config"], source=layout.done),
                                     trained=done["summary"])
            if shorter:
                return CellState("conflict", step, shorter)
            if not _goes_on(done, cell.config):  # the new budget stops it where it stopped: the same run
                if step > done["summary"]["step"]:  # ... unless it was trained on outside the grid since
                    return _trained_on_after(step, done)
                same_run = f"{', '.join(changes)} changed, but it would stop at step {step} all the same"
                changes = []
            elif on_disk is None:
                return CellState("conflict", step, f"{', '.join(changes)} changed, which would train it on from step "
                                                   f"{step}, but its checkpoints are not here (a committed or imported "
                                                   "cell): rerun with the budget it was trained with, or bring its "
                                                   "checkpoints back", advice="")
    if done and not changes:
        state = _finished_state(cell, spec, done, step)
        if state.status == "trained" and on_disk is None and not state.detail.startswith(STALE_GROUPS):
            why = state.detail or "not scored as the grid asks"
            return CellState("conflict", step, f"{why}, and its checkpoints are not here (a committed or imported "
                                               "cell), so it cannot be scored again: rerun with the evaluation "
                                               "settings it was scored with, or bring its checkpoints back", advice="")
        return replace(state, detail=state.detail or same_run)
    saved = _normalised(read_yaml_mapping(layout.config, what="run config"), source=layout.config)
    blocking = [k for k in config_differences(saved, config_dict(cell.config)) if not k.startswith(RESUMABLE_KEYS)]
    if blocking:
        return CellState("conflict", step, f"the directory holds a run with other values of: {', '.join(blocking)}")
    shorter = shorter_budget(run, cell.config, saved, trained=done["summary"] if done else None)
    if shorter:
        return CellState("conflict", step, shorter)
    detail = f"continues: {', '.join(changes)} changed" if changes else ""
    return CellState("training" if step is not None else "pending", step, detail)


STALE_GROUPS = "scored with the OOV/ambiguous definitions before 2026-11-25"


def _finished_state(cell: Cell, spec: EvalSpec, done: dict, step: int) -> CellState:
    """``evaluated`` or ``trained`` (with why it is to be scored again) for a cell that finished training as the
    grid asks."""
    record = read_json(cell.layout.compare_eval)
    if not record or record.get("trained_at") != done["finished_at"]:
        return CellState("trained", step)
    key = eval_key(cell, spec)
    if record.get("key") == key:
        changed = [p for p, digest in (record.get("data_sha256") or {}).items()
                   if data_digests(cell).get(p, digest) != digest]  # records before digests are trusted
        if changed:
            return CellState("trained", step, f"{', '.join(changed)} changed since the cell was scored")
        if evidence_intact(cell.run_dir, record):
            return CellState("evaluated", step)
        return CellState("trained", step, f"{record.get('evidence')} or the recorded scores changed (or the file is "
                                          "missing) since it was scored")
    if _stale_groups(record, key):
        return CellState("trained", step, f"{STALE_GROUPS}: `sanlab compare GRID --rescore` scores it again from its "
                                          "predictions")
    return CellState("trained", step, f"scored with {_key_text(record.get('key'))}, the grid asks for {_key_text(key)}")


def _key_text(key: dict | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (key or {}).items()) or "no recorded settings"


def _trained_on_after(step: int, done: dict) -> CellState:
    return CellState("conflict", step, f"trained on after the grid finished it (checkpoints reach step {step}, "
                                       f"{DONE_FILE} says {done['summary']['step']}): not the grid's cell any more")


def _goes_on(done: dict, config: Config) -> bool:
    """Whether training the finished cell under ``config`` would add updates (``Trainer.fit``'s stopping rules): no
    limit it reached and a patience it has not used up. Otherwise a changed budget would resume it for no update,
    score it again and rewrite ``done.json``: it is the same run."""
    old = _normalised(done["config"], source=Path(DONE_FILE))["train"]
    summary, new = done["summary"], config.train
    step, epoch, bad = summary["step"], summary.get("epoch") or 0, summary.get("bad_validations")
    if step >= new.max_steps or epoch >= new.max_epochs:
        return False
    if bad is None:  # finished before done.json recorded it: stopped early if no limit stopped it
        bad = old["patience"] if step < old["max_steps"] and epoch < old["max_epochs"] and old["patience"] else 0
    return not (new.patience > 0 and bad >= new.patience)


def _changed_training_data(cell: Cell) -> str:
    """Why a finished cell does not stand for the grid's training data any more (it changed in place since the
    cell trained on it), or "". ``sanlab compare --allow-changed-data`` keeps such cells as they are."""
    from sanlab.runs import ALLOW_CHANGED_DATA_ENV, training_data_changes

    if os.environ.get(ALLOW_CHANGED_DATA_ENV) == "1":
        return ""
    try:
        found = training_data_changes(cell.run_dir, cell.config)
    except ConfigError:  # meta.json unreadable: its provenance is lost, not the cell
        return ""
    if not found:
        return ""
    path, what = next(iter(found.items()))
    return (f"the training data changed since it was trained ({path}: {what}): pass --allow-changed-data to keep "
            "it as it was trained, or delete it to train it again")
