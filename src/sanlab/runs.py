"""Run directories: create or resume, record provenance, build the task, load trained models.

A run directory holds ``config.yaml`` (resolved), ``meta.json`` (seed, library versions, git
revision, command line), ``metrics.jsonl``, ``train.log``, ``checkpoints/``, TensorBoard logs,
and the vocabularies (sentencepiece model or tagger vocabulary).
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path

import torch
import yaml

from sanlab import invocation
from sanlab.config import Config, TaggingConfig, TranslationConfig, dump_config, read_yaml_mapping, validate
from sanlab.data.fingerprint import changes, fingerprints, training_files
from sanlab.errors import ConfigError, DataError, SanlabError
from sanlab.files import read_json, write_json, write_text
from sanlab.training import rundir
from sanlab.training.checkpoint import CheckpointManager, checkpoint_names, latest_checkpoint, load_weights
from sanlab.training.logging import RunLogger
from sanlab.training.rundir import RUN_FORMAT, RUN_MARKER, run_lock  # noqa: F401  (run_lock: sanlab.runs' API)

LIBRARIES = ("torch", "sacrebleu", "sentencepiece", "conllu", "safetensors", "pydantic", "numpy")


def git_revision() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if rev.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def provenance(config: Config) -> dict:
    versions = {}
    for lib in ("sanlab",) + LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return {RUN_MARKER: RUN_FORMAT, "seed": config.train.seed, "versions": versions, "python": platform.python_version(),
            "git_revision": git_revision(), "command": invocation.command(), "machine": platform.machine(),
            **_session_conditions(config)}


GRID_JOBS_ENV = "SANLAB_GRID_JOBS"
ALLOW_CHANGED_DATA_ENV = "SANLAB_ALLOW_CHANGED_DATA"  # `sanlab compare --allow-changed-data`, seen by its workers


def _session_conditions(config: Config) -> dict:
    # threads as training will set them (meta.json is written before _train_locked applies train.threads)
    # jobs: cells a `sanlab compare --jobs` grid trains side by side with this one (set in its workers)
    return {"threads": config.train.threads or torch.get_num_threads(),
            "processes": int(os.environ.get("WORLD_SIZE", "1")), "jobs": int(os.environ.get(GRID_JOBS_ENV, "1"))}


def record_session(run_dir: Path, config: Config, *, step: int) -> None:
    """Append this training session to ``meta.json``'s ``sessions``: a resumed run may have been continued
    with other code, command, threads or processes than the ones recorded when it was created."""
    path = Path(run_dir) / "meta.json"
    meta = read_json(path) or provenance(config)
    session = {"started_at": datetime.now().astimezone().isoformat(timespec="seconds"), "from_step": step,
               "git_revision": git_revision(), "command": invocation.command(), **_session_conditions(config)}
    meta["sessions"] = [*meta.get("sessions", []), session]
    meta.setdefault(RUN_MARKER, RUN_FORMAT)  # a run made before the marker is marked when it trains again
    write_json(path, meta)


# Keys that may change when a run is resumed (they do not change what was already trained).
RESUMABLE_KEYS = ("train.max_steps", "train.max_epochs", "train.patience", "train.progress", "train.threads",
                  "train.find_unused_parameters", "train.device",  # a CPU run may go on on a GPU, and back
                  "train.log_every", "decode.beam", "decode.length_penalty", "decode.n_best")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_differences(old: dict, new: dict) -> list[str]:
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def prepare_run_dir(run_dir: Path, config: Config, *, overwrite: bool) -> bool:
    """Create ``run_dir`` for ``config``; returns True if it holds a run to resume.

    Resuming with a different config is an error unless only ``RESUMABLE_KEYS`` differ (e.g. a
    larger ``train.max_steps``); pass ``--overwrite`` to start again or choose another directory.
    A directory sanlab did not make is never written into or emptied (``training.rundir``).
    Call it holding ``run_lock(run_dir)`` (``train_run`` does), so that no other process is writing the run.
    """
    run_dir = Path(run_dir)
    rundir.check_location(run_dir)
    saved = run_dir / "config.yaml"
    if overwrite:
        rundir.empty_run(run_dir)
    if not saved.exists() and (run_dir / "checkpoints").exists():
        # a resume could not be checked, and a fresh start would replace them
        raise ConfigError(f"{run_dir}: has checkpoints but no config.yaml: restore config.yaml to resume, or "
                          "move the checkpoints away (or choose another --run directory) to start again")
    if not rundir.is_run(run_dir):
        rundir.check_new_run(run_dir)
    text = dump_config(config)
    if saved.exists():
        # Re-validate the saved config so keys added to the schema since then compare as their defaults.
        old = yaml.safe_load(dump_config(validate(read_yaml_mapping(saved, what="run config"), source=str(saved))))
        diff = config_differences(old, yaml.safe_load(text))
        blocking = [k for k in diff if not k.startswith(RESUMABLE_KEYS)]
        if blocking:
            raise ConfigError(f"{run_dir} holds a run with a different config ({saved}); differing keys: "
                              f"{', '.join(blocking)}. Resume with the same config, pass --overwrite to start "
                              "again, or choose another --run directory")
        problem = shorter_budget(run_dir, config, old)
        if problem:
            raise ConfigError(f"{run_dir}: {problem}; a shorter budget needs a new run (another --run directory, "
                              "or --overwrite)")
        if diff:  # the run's own saved config, rewritten only when a resumable key changed
            write_text(saved, text)
        return CheckpointManager.has_checkpoints(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "meta.json", provenance(config))  # the marker first: from here on it is a run
    write_text(saved, text)
    return False


def check_training_data(run_dir: Path, config: Config, *, allow_changed: bool) -> list[str]:
    """Compare the training data with the fingerprint recorded in ``meta.json`` (``data_fingerprint``).
    Changed data is a DataError naming the file, unless ``allow_changed``; then the changes are returned
    (for the log) and the new fingerprint recorded. A run without one (new, or made before fingerprints)
    records the data it starts or resumes on."""
    path = Path(run_dir) / "meta.json"
    meta = read_json(path) or provenance(config)
    recorded, current = meta.get("data_fingerprint") or {}, fingerprints(training_files(config))
    found = changes(recorded, current)
    if found and not allow_changed:
        first = next(iter(found))
        more = f" (and {len(found) - 1} more file(s): {', '.join(list(found)[1:])})" if len(found) > 1 else ""
        raise DataError(f"changed since this run last trained on it ({found[first]}){more}; resuming would "
                        "continue on other data: pass --allow-changed-data to do so anyway, or start a new run "
                        "(another --run directory, or --overwrite)", path=first)
    if current != recorded:
        meta["data_fingerprint"] = {**recorded, **current}
        write_json(path, meta)
    return [f"{p}: {what}" for p, what in found.items()]


def shorter_budget(run_dir: Path, config: Config, old: dict, *, trained: dict | None = None) -> str | None:
    """Why resuming ``run_dir`` (trained under the config dict ``old``) with ``config`` would shorten it
    or tighten its stopping rule, or None. A resume must not: the weights would be saved under a budget
    they have exceeded (a finished run relabelled with settings it did not train under). ``trained``
    ({"step", "epoch"}, e.g. a finished run's summary) stands in when the checkpoints are not there."""
    latest = latest_checkpoint(Path(run_dir) / "checkpoints")
    meta = (read_json(latest / "meta.json") or {}) if latest else (trained or {})
    train = config.train
    step, epoch, patience = meta.get("step"), meta.get("epoch"), old.get("train", {}).get("patience")
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
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    return validate(read_yaml_mapping(path, what="run config"), source=str(path))


def task_class(config: Config) -> type:
    """The task that trains ``config`` (its class: ``metric`` and ``higher_is_better`` without building it)."""
    if isinstance(config, TranslationConfig):
        from sanlab.tasks.translation import TranslationTask

        return TranslationTask
    from sanlab.tasks.tagging import TaggingTask

    return TaggingTask


def make_task(config: Config, run_dir: Path, log: RunLogger):
    return task_class(config)(config, run_dir, log)


def select_checkpoint(run_dir: Path, which: str, config: Config) -> Path:
    """``best``, ``last``, ``averaged`` (written by ``sanlab average``) or a path."""
    run_dir = Path(run_dir)
    if which == "averaged":
        path = run_dir / "averaged"
    elif which in ("best", "last"):
        manager = CheckpointManager(run_dir, keep_best=0, keep_last=0,
                                    higher_is_better=task_class(config).higher_is_better, writer=False)
        found = manager.best(1) if which == "best" else manager.last(1)
        if not found:
            raise ConfigError(f"{run_dir}: no checkpoint to load (train first)")
        path = found[0]
        if not path.exists():  # pruned by a training process since it was listed: the caller may choose again
            raise FileNotFoundError(f"{path} was removed")
    else:
        named = run_dir / "checkpoints" / which  # a step-N name of this run
        path = named if which.startswith("step-") and named.is_dir() else Path(which)
        if not path.is_dir():
            names = checkpoint_names(run_dir)
            steps = f"{names[0]} to {names[-1]}" if len(names) > 2 else ", ".join(names) or "none yet"
            raise ConfigError(f"--checkpoint {which}: no such checkpoint of {run_dir}; give best, last, averaged "
                              f"(after `sanlab average`), a step-N name of this run ({steps}) or a checkpoint "
                              "directory")
    if not (path / "model.safetensors").exists():
        hint = f" (run `sanlab average --run {run_dir} --last N` first)" if which == "averaged" else ""
        raise ConfigError(f"{path}: no model.safetensors in this checkpoint directory{hint}")
    return path


def load_trained(run_dir: Path, *, checkpoint: str = "best", device: str = "cpu"):
    """(config, model, assets) of a trained run, the model on ``device`` (``training.device``: auto, cpu,
    cuda, cuda:N): assets is the subword model (translation) or the tagging vocabulary. Reads no corpus."""
    from sanlab.training.device import resolve_device

    config = load_run_config(run_dir)
    with contextlib.suppress(FileNotFoundError):  # (pruned meanwhile: chosen again below)
        select_checkpoint(run_dir, checkpoint, config)  # a run without it says so, not that its vocabulary is missing
    if isinstance(config, TranslationConfig):
        from sanlab.tasks.translation import load_translation_model as load
    else:
        from sanlab.tasks.tagging import load_tagging_model as load
    model, assets = load(config, run_dir)
    for attempt in range(3):
        try:
            path = select_checkpoint(run_dir, checkpoint, config)
            load_weights(model, path)
            break
        except FileNotFoundError as err:  # a training process pruned it between choosing and reading: choose again
            if attempt == 2 or checkpoint not in ("best", "last"):
                raise ConfigError(f"{err}: the checkpoint disappeared while it was loaded (is a training process "
                                  "pruning this run's checkpoints?); try again") from None
    return config, model.to(resolve_device(device)).eval(), assets


def check_buildable(config: Config) -> None:
    """Build the model on the meta device (no memory, no data, milliseconds) so that an impossible
    combination of settings, e.g. 2D-CSAN with more heads in its area than the layer has, is
    reported before data loading and vocabulary training, as a config error."""
    from sanlab.models.builders import build_seq2seq, build_tagger

    try:
        with torch.device("meta"):
            if isinstance(config, TranslationConfig):
                build_seq2seq(config.model, vocab_size=16, pad_id=0)
            else:
                build_tagger(config.model, vocab_size=16, num_chars=16, num_tags=4)
    except ValueError as err:
        raise ConfigError(f"this model cannot be built: {err}") from None


def train_run(config: Config, run_dir: Path, *, overwrite: bool = False, quiet: bool = False,
              allow_changed_data: bool = False) -> dict:
    """Train (or resume) the run in ``run_dir``. Returns the trainer's summary.

    Resuming on training data that changed since (``check_training_data``) is an error unless
    ``allow_changed_data``. Under torchrun every process calls this; the main one prepares and locks the
    run directory (see ``training.distributed``)."""
    from sanlab.training.device import resolve_device
    from sanlab.training.distributed import from_environment

    check_buildable(config)
    run_dir = Path(run_dir)
    rundir.check_location(run_dir)  # before the lock, which would create the directory's .lock
    existed = run_dir.is_dir()
    with from_environment(resolve_device(config.train.device)) as dist:
        # the lock is taken before the directory is prepared: --overwrite and a resume's config rewrite
        # must never touch a run another process is writing
        with run_lock(run_dir) if dist.is_main else contextlib.nullcontext():
            start = _Start()
            with dist.main_first():
                if dist.is_main:
                    start = _Start(new=overwrite or not rundir.is_run(run_dir),
                                   before=None if not existed else [] if overwrite else rundir.entries(run_dir))
                    start.resuming = prepare_run_dir(run_dir, config, overwrite=overwrite)
                    start.data_changes = check_training_data(run_dir, config, allow_changed=allow_changed_data)
            start.resuming = dist.broadcast(start.resuming if dist.is_main else None)
            return _train_locked(config, run_dir, start=start, quiet=quiet, dist=dist)


@dataclass
class _Start:
    """What preparing the run directory (main process) tells the training that follows."""

    resuming: bool = False
    data_changes: list[str] = field(default_factory=list)  # --allow-changed-data: for the log
    new: bool = False  # a new run, whose failed start is taken back
    before: list[str] | None = None  # the directory's entries before this command (None: it did not exist)


def _train_locked(config: Config, run_dir: Path, *, start: _Start, quiet: bool, dist) -> dict:
    from sanlab.training.device import describe_environment
    from sanlab.training.loop import Trainer
    from sanlab.training.logging import SilentLogger

    if config.train.threads:
        torch.set_num_threads(config.train.threads)
    log = RunLogger(run_dir, progress=config.train.progress, quiet=quiet) if dist.is_main else SilentLogger(run_dir)
    if dist.is_main and dist.enabled and torch.get_num_threads() * dist.world_size > (os.cpu_count() or 1):
        log.info(f"WARNING: {dist.world_size} processes x {torch.get_num_threads()} threads on {os.cpu_count()} "
                 "cores: oversubscribed (train.threads is per process)")
    if dist.is_main:
        log.info(describe_environment(dist.device, precision=config.train.precision, processes=dist.world_size))
    if dist.is_main and dist.enabled:
        backend = "nccl" if dist.device.type == "cuda" else "gloo"
        log.info(f"distributed data parallel: {dist.world_size} processes ({backend}), "
                 f"{config.train.accum_steps * dist.world_size} batches per update")
    for change in start.data_changes:
        log.info(f"WARNING: training data changed since this run last trained on it (--allow-changed-data): {change}")
    with dist.main_first():  # the main process writes the vocabulary / subword model, the others read it
        try:
            task = make_task(config, run_dir, log)
        except SanlabError:  # bad data or settings found at the start: no half-made run is left behind
            if start.new:
                log.close()
                rundir.undo_start(run_dir, before=start.before)
            raise
    if dist.rank > 0:  # same initial weights everywhere (DDP checks), different dropout streams
        torch.manual_seed(config.train.seed * 1_000_003 + dist.rank)
    trainer = Trainer(task=task, config=config.train, run_dir=run_dir, logger=log, dist=dist)
    if start.resuming:
        trainer.resume()
    elif dist.is_main:  # a session killed before its first checkpoint logged updates that this one repeats
        log.truncate_after(0)
    if dist.is_main:
        record_session(run_dir, config, step=trainer.progress.step)
    try:
        return trainer.fit()
    finally:
        log.close()


def evaluate_run(run_dir: Path, *, checkpoint: str = "best", splits: list[str] | None = None,
                 decode_overrides: dict | None = None, device: str = "cpu") -> dict:
    """Score a trained run on its held-out splits; writes hypotheses and ``eval-<checkpoint>.json`` into the run.

    Each split's record names the checkpoint it scored (directory and update), since ``best`` and ``last``
    move when a run is resumed. Splits scored earlier from the same checkpoint stay in the file; records
    of another checkpoint are dropped (with their hypotheses) rather than mixed with the new ones. Records
    written before checkpoints were named cannot be told apart and are kept, files and all: deleting them
    could delete what a comparison grid scored.
    """
    config, model, assets = load_trained(run_dir, checkpoint=checkpoint, device=device)
    scored = scored_checkpoint(run_dir, checkpoint, config)
    if isinstance(config, TranslationConfig):
        from sanlab.tasks.translation import evaluate_translation

        # one hypothesis per sentence is scored, so a run's n_best (for `translate`) must not limit --beam
        decode = config.decode.updated(**{"n_best": 1, **(decode_overrides or {})})
        results = evaluate_translation(model, assets, config, splits=splits, decode=decode, out_dir=Path(run_dir),
                                       tag=checkpoint)
    else:
        from sanlab.tasks.tagging import evaluate_tagging_splits

        if decode_overrides:
            raise ConfigError(f"{run_dir} is a tagging run: decode settings ({', '.join(decode_overrides)}) do not "
                              "apply")
        results = evaluate_tagging_splits(model, assets, config, splits=splits)
    results = {name: {**record, **scored} for name, record in results.items()}
    tag = Path(checkpoint).name
    out = Path(run_dir) / f"eval-{tag}.json"
    earlier = read_json(out) or {}
    kept = {name: r for name, r in earlier.items()
            if isinstance(r, dict) and (same_weights(r, scored) or not any(k in r for k in SCORED_KEYS))}
    for name in set(earlier) - set(kept) - set(results):  # its hypotheses came from weights no longer named so
        (Path(run_dir) / f"hyp-{tag}-{name}.txt").unlink(missing_ok=True)
    write_json(out, {**kept, **results})
    return results


SCORED_KEYS = ("checkpoint", "step", "averaged")  # what identifies the weights an eval record scored


def scored_checkpoint(run_dir: Path, checkpoint: str, config: Config) -> dict:
    """What ``checkpoint`` (best / last / averaged / a path) names now: ``{"checkpoint": <directory, relative
    to the run when inside it>, "step": <update or None>}``, plus ``"averaged"`` (the checkpoints
    averaged) for an average, which has no step of its own."""
    path = select_checkpoint(run_dir, checkpoint, config)
    meta = read_json(path / "meta.json") or {}
    try:
        name = str(path.resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        name = str(path)
    return {"checkpoint": name, "step": meta.get("step"),
            **({"averaged": meta["averaged"]} if "averaged" in meta else {})}


def same_weights(record: dict, scored: dict) -> bool:
    return all(record.get(k) == scored.get(k) for k in SCORED_KEYS)


def average_run(run_dir: Path, *, last: int | None = None, best: int | None = None,
                output: str | None = None) -> Path:
    from sanlab.training.average import write_average

    config = load_run_config(run_dir)
    kept = config.train.keep_last if last else config.train.keep_best
    wanted = last or best
    if wanted > kept:  # older survivors are best checkpoints, not the last N: refuse rather than mix them
        which = "keep_last" if last else "keep_best"
        raise ConfigError(f"{run_dir}: asked for {wanted} checkpoints but the run keeps {kept} ({which}); "
                          f"raise train.{which} before training")
    manager = CheckpointManager(run_dir, keep_best=config.train.keep_best, keep_last=config.train.keep_last,
                                higher_is_better=task_class(config).higher_is_better, writer=False)
    chosen = manager.last(last) if last else manager.best(best)
    if not chosen:
        raise ConfigError(f"{run_dir}: has no checkpoints to average (train it first)")
    if len(chosen) < wanted:  # within keep_last / keep_best: the run has not saved that many yet
        raise ConfigError(f"{run_dir}: asked for {wanted} checkpoints, the run has saved only {len(chosen)} so far "
                          f"(of the {kept} it keeps); average fewer, or train on to save more")
    return write_average(chosen, Path(output) if output else Path(run_dir) / "averaged")


def tag_file(run_dir: Path, *, input_path: str | None, output_path: str | None, checkpoint: str = "best",
             device: str = "cpu") -> None:
    """Tag a CoNLL-U file (``.conllu``/``.conllu.gz``) or plain tokenised text; writes word<TAB>tag lines."""
    from sanlab.data.conllu_io import TaggedSentence, read_conllu
    from sanlab.data.parallel import input_lines
    from sanlab.files import check_output_file, output_stream
    from sanlab.tasks.tagging import tag_sentences

    check_output_file(output_path)
    config, model, vocab = load_trained(run_dir, checkpoint=checkpoint, device=device)
    if not isinstance(config, TaggingConfig):
        raise ConfigError(f"{run_dir} is a {config.task} run; `sanlab tag` needs a tagging run (use `sanlab translate`)")
    if input_path and not Path(input_path).is_file():
        raise DataError("input file not found", path=input_path)
    if input_path and ".conllu" in Path(input_path).name:
        sents = read_conllu(input_path, column=config.data.column, require_tags=False)  # tags, if any, ignored
    else:
        sents = [TaggedSentence(tuple(line.split()), tuple("_" for _ in line.split()))
                 for line in input_lines(input_path) if line.strip()]
    predicted = tag_sentences(model, vocab, sents, max_len=config.model.max_len, max_chars=config.model.max_word_chars)
    with output_stream(output_path) as out:
        for sent, tags in zip(sents, predicted):
            out.writelines(f"{w}\t{t}\n" for w, t in zip(sent.words, tags))
            out.write("\n")
