"""Trained runs: choosing and loading a checkpoint, ``evaluate``, ``average`` and ``tag``."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import re
from pathlib import Path

from sanlab.config import Config, DecodeConfig
from sanlab.errors import ConfigError
from sanlab.files import dangling_link, read_json, write_json
from sanlab.training.checkpoint import (
    META, STEP_PREFIX, WEIGHTS, CheckpointManager, check_checkpoints_link, check_vocabulary, checkpoint_names,
    is_step_name, load_weights, read_meta, step_name,
)
from sanlab.training.layout import RunLayout
from sanlab.runs.resume import load_run_config, refuse_changed_scored_files
from sanlab.tasks.base import task_for

# a library's warnings go to logging, where a Python user filters or captures them; the CLI prints them
# ("WARNING: ..." on stderr: invocation.library_warnings)
logger = logging.getLogger(__name__)


def select_checkpoint(run_dir: Path, which: str, config: Config) -> Path:
    """``best``, ``last``, ``averaged`` (written by ``sanlab average``) or a path."""
    run_dir, layout = Path(run_dir), RunLayout(run_dir)
    if which == "averaged":
        path = layout.averaged
        dangling = dangling_link(path)
        if dangling:  # (it said "no model.safetensors ... run sanlab average")
            raise ConfigError(f"{path} is {dangling}")
    elif which in ("best", "last"):
        manager = CheckpointManager(run_dir, keep_best=0, keep_last=0,
                                    higher_is_better=task_for(config).best_metric(config)[1], writer=False)
        found = manager.best(1) if which == "best" else manager.last(1)
        if not found:
            raise ConfigError(f"{run_dir}: no checkpoint to load (train first)")
        path = found[0]
        if not path.exists():  # pruned by a training process since it was listed: the caller may choose again
            raise FileNotFoundError(f"{path} was removed")
    else:
        step = re.fullmatch(rf"{STEP_PREFIX}(\d+)", which)  # a step-N name of this run: step-3000 or step-00003000
        named = layout.checkpoint(step_name(int(step.group(1)))) if step else None
        path = named if named is not None and named.is_dir() else Path(which)
        if not path.is_dir():
            check_checkpoints_link(run_dir)  # its step-N are not missing: their disk is (not "none yet")
            names = checkpoint_names(run_dir)
            steps = f"{names[0]} to {names[-1]}" if len(names) > 2 else ", ".join(names) or "none yet"
            raise ConfigError(f"--checkpoint {which}: no such checkpoint of {run_dir}; give best, last, averaged "
                              f"(after `sanlab average`), a step-N name of this run ({steps}) or a checkpoint "
                              "directory")
    if which in ("best", "last") and not path.is_dir():
        raise FileNotFoundError(f"{path} was removed")  # (as above: pruned between the two looks)
    if is_step_name(path.name) and layout.name_in_run(path) == f"{layout.checkpoints.name}/{path.name}":
        # one of the run's own checkpoints (by step-N or by path): its meta.json damaged or deleted is named with
        # what to do, as when resuming; without it, its weights would load unchecked (their checksums are in it)
        read_meta(path)
    if not (path / WEIGHTS).exists():
        hint = f" (run `sanlab average --run {run_dir} --last N` first)" if which == "averaged" else ""
        raise ConfigError(f"{path}: no {WEIGHTS} in this checkpoint directory{hint}")
    return path


def load_trained(run_dir: Path, *, checkpoint: str = "best", device: str = "cpu"):
    """(config, model, assets) of a trained run, the model on ``device`` (``training.device``: auto, cpu,
    cuda, cuda:N, or a torch.device) in eval mode: assets is the subword model (translation) or the tagging
    vocabulary. Reads no corpus, and draws nothing from torch's random streams."""
    config, model, assets, _, _ = load_checkpoint(run_dir, checkpoint=checkpoint, device=device)
    return config, model, assets


def load_checkpoint(run_dir: Path, *, checkpoint: str = "best", device: str = "cpu"):
    """``load_trained``'s (config, model, assets), the checkpoint directory the weights came from and what a
    record says of them (``scored_checkpoint``'s dict), read as they were loaded: ``best`` and ``last`` move while
    a run trains (and a pruned directory takes its meta.json with it), so a record must not look again later."""
    import torch

    from sanlab.training.device import resolve_device

    config = load_run_config(run_dir)
    with contextlib.suppress(FileNotFoundError):  # (pruned meanwhile: chosen again below)
        select_checkpoint(run_dir, checkpoint, config)  # a run without it says so, not that its vocabulary is missing
    # the random initial weights the checkpoint replaces are drawn from a stream of their own: the caller's is not
    # advanced (a notebook's seeded code after loading behaves as without it). Built on the CPU: no CUDA stream.
    with torch.random.fork_rng(devices=[]):
        model, assets = task_for(config).load_model(config, run_dir)
    vocabulary = task_for(config).vocabulary(assets)
    for attempt in range(3):
        try:
            path = select_checkpoint(run_dir, checkpoint, config)
            check_vocabulary(path, vocabulary, run_dir=run_dir)
            load_weights(model, path)
            described = _describe_checkpoint(run_dir, path)
            if checkpoint in ("best", "last") and not (path / META).is_file():
                raise FileNotFoundError(f"{path} was removed")  # pruned just after loading: its step is gone
            break
        except FileNotFoundError as err:  # a training process pruned it between choosing and reading: choose again
            if attempt == 2 or checkpoint not in ("best", "last"):
                raise ConfigError(f"{err}: the checkpoint disappeared while it was loaded (is a training process "
                                  "pruning this run's checkpoints?); try again") from None
    # by the keyword or by its path: the same directory
    averaged = path.resolve() == RunLayout(run_dir).averaged.resolve()
    stale = stale_average(run_dir, path, config) if averaged else ""
    if stale:  # (loading it is still what was asked)
        logger.warning(stale)
    return config, model.to(resolve_device(device)).eval(), assets, path, described


def evaluate_run(run_dir: Path, *, checkpoint: str = "best", splits: list[str] | None = None,
                 decode_overrides: dict | None = None, device: str = "cpu", precision: str = "fp32") -> dict:
    """Score a trained run on its held-out splits; writes hypotheses and ``eval-<checkpoint>.json`` into the run.

    ``precision`` (fp32 or bf16, ``training.device.decoding_precision``) is what the model decodes in; each
    record says it, and a precision other than fp32 writes files of its own (``eval-<checkpoint>-bf16.json``,
    ``hyp-<checkpoint>-bf16-<split>.txt``: ``RunLayout``), so a bf16 evaluation never replaces an fp32 one.

    Each split's record names the checkpoint it scored (directory and update), since ``best`` and ``last``
    move when a run is resumed. Splits scored earlier from the same checkpoint stay in the file; records
    of another checkpoint are dropped (with their hypotheses) rather than mixed with the new ones. Records
    written before checkpoints were named cannot be told apart and are kept, files and all: deleting them
    could delete what a comparison grid scored.
    """
    from sanlab.training.device import (check_decoding_precision, decoding_precision, deterministic_algorithms,
                                        model_device)

    check_decoding_precision(precision)  # before the model is loaded
    config, model, assets, path, scored = load_checkpoint(run_dir, checkpoint=checkpoint, device=device)
    task = task_for(config)
    task.require_precision(precision, run_dir)
    refuse_changed_scored_files(run_dir, config)
    _refuse_a_borrowed_name(run_dir, checkpoint, path)
    if re.fullmatch(rf"{STEP_PREFIX}\d+", checkpoint):  # step-4 and step-00000004: one record, the directory's name
        checkpoint = path.name
    layout = RunLayout(run_dir)
    out = layout.eval_record(checkpoint, precision)
    earlier = read_json(out) or {}
    kept = {name: r for name, r in earlier.items()
            if isinstance(r, dict) and (same_weights(r, scored) or not any(k in r for k in SCORED_KEYS))}
    # what a kept record that other settings replace scored, read before decoding rewrites its file, to count the
    # lines that differ (records made with the same settings are not compared: nothing is read for them)
    settings = task.decode_settings(config, decode_overrides)
    scored_before = {name: _hypotheses_scored(r, layout.hypotheses(checkpoint, name, precision))
                     for name, r in kept.items()
                     if (not splits or name in splits) and _settings_changed(r.get("decode"), settings)}
    # (tasks that decode only in fp32 take no precision argument: their interface predates it)
    extra = {} if precision == "fp32" else {"precision": decoding_precision(precision, model_device(model))}
    with deterministic_algorithms(config.train.deterministic, model_device(model)):  # as the run trained
        results = task.evaluate(model, assets, config, run_dir=Path(run_dir), checkpoint=checkpoint, splits=splits,
                                decode_overrides=decode_overrides, **extra)
    results = {name: {**record, **scored, "precision": precision} for name, record in results.items()}
    for name in set(earlier) - set(kept) - set(results):  # its hypotheses came from weights no longer named so
        layout.hypotheses(checkpoint, name, precision).unlink(missing_ok=True)
    for name, record in results.items():
        _warn_if_replaced(kept.get(name), record, split=name, record_file=out,
                          hypotheses=layout.hypotheses(checkpoint, name, precision), metric=task.eval_metric,
                          scored_before=scored_before.get(name))
    write_json(out, {**kept, **results})
    return results


def _hypotheses_scored(record: dict, path: Path) -> list[str] | None:
    """The lines of the hypotheses file ``record`` scored, or None: not a translation record, no file, or a file
    that no longer matches the record's digest (rewritten by an evaluation that failed before its record)."""
    if not isinstance(record.get("decode"), dict) or not path.is_file():
        return None
    data = path.read_bytes()
    digest = record.get("hypotheses_sha256")  # (records written before it was kept: the file as it is)
    if digest is not None and digest != hashlib.sha256(data).hexdigest():
        return None
    text = data.decode("utf-8", errors="replace")  # as tasks.translation.read_hypotheses: "\n" alone ends a line
    return text.removesuffix("\n").split("\n") if text else []


def _settings_changed(before: object, after: object) -> bool:
    """Whether two records' decode settings differ (keys added since at the value older records meant left out);
    False unless both are settings (a tagging record has none)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return False
    return DecodeConfig.as_recorded(before) != DecodeConfig.as_recorded(after)


def _differing_lines(earlier: dict, record: dict, hypotheses: Path,
                     scored_before: list[str] | None) -> tuple[int, int | None] | None:
    """How many hypotheses differ between what ``earlier`` scored (``scored_before``: read before they were
    rewritten, None if not known) and what ``record`` scored (in ``hypotheses`` now), and of how many; None: not
    known. Two records with their hypotheses' digests are told the same by them, without reading the new file back."""
    if scored_before is None:
        return None
    digests = earlier.get("hypotheses_sha256"), record.get("hypotheses_sha256")
    if None not in digests and digests[0] == digests[1]:
        return 0, None
    after = _hypotheses_scored(record, hypotheses)
    if after is None:
        return None
    return sum(a != b for a, b in itertools.zip_longest(scored_before, after)), len(after)


def _warn_if_replaced(earlier: dict | None, record: dict, *, split: str, record_file: Path, hypotheses: Path,
                      metric: str, scored_before: list[str] | None) -> None:
    """A run keeps one record per split of a checkpoint: one made with other decode settings is replaced (its
    hypotheses file too), and said so, with its score, rather than lost without a word. ``scored_before``: the
    hypotheses the earlier record scored (None: not known); when the new ones are the same (only
    ``batch_sentences`` changed, say) nothing is lost, and an INFO line says so instead; when they differ, how many."""
    if earlier is None or not _settings_changed(earlier.get("decode"), record.get("decode")):
        return
    before, after = DecodeConfig.as_recorded(earlier["decode"]), DecodeConfig.as_recorded(record["decode"])
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    was = ", ".join(f"{k.replace('_', ' ')} {before.get(k, '(unset)')}" for k in changed)
    now = ", ".join(f"{k.replace('_', ' ')} {after.get(k, '(unset)')}" for k in changed)
    compared = _differing_lines(earlier, record, hypotheses, scored_before)
    if compared is not None and compared[0] == 0:
        logger.info(f"{record_file}: the record of {split!r} made with {was} is replaced by one with {now}, with the "
                    f"same hypotheses ({hypotheses.name}, line for line)")
        return
    differ = "" if compared is None else f": {compared[0]} of {compared[1]} hypotheses differ"
    logger.warning(f"{record_file}: the record of {split!r} made with {was}{_score(earlier, metric)} is replaced by "
                   f"one with {now}{_score(record, metric)}{differ}; {hypotheses.name} is rewritten too (one record "
                   "per split and checkpoint)")


def _score(record: dict, metric: str) -> str:
    score = record.get(metric)
    return f" ({metric} = {score:.2f})" if isinstance(score, (int, float)) else ""


SCORED_KEYS = ("checkpoint", "step", "averaged")  # what identifies the weights an eval record scored


def scored_checkpoint(run_dir: Path, checkpoint: str, config: Config) -> dict:
    """What ``checkpoint`` (best / last / averaged / a path) names now: ``{"checkpoint": <directory, relative
    to the run when inside it>, "step": <update or None>}``, plus ``"averaged"`` (the checkpoints
    averaged) for an average, which has no step of its own."""
    return _describe_checkpoint(run_dir, select_checkpoint(run_dir, checkpoint, config))


def _describe_checkpoint(run_dir: Path, path: Path) -> dict:
    meta = read_json(path / META) or {}
    name = RunLayout(run_dir).name_in_run(path) or str(path)
    return {"checkpoint": name, "step": meta.get("step"),
            **({"averaged": meta["averaged"]} if "averaged" in meta else {})}


def same_weights(record: dict, scored: dict) -> bool:
    return all(record.get(k) == scored.get(k) for k in SCORED_KEYS)


def average_run(run_dir: Path, *, last: int | None = None, best: int | None = None,
                output: str | None = None) -> Path:
    """Average the ``last`` N or the ``best`` N checkpoints of a run (exactly one of them, N >= 1) into ``output``
    (default: the run's ``averaged/``, which ``checkpoint="averaged"`` loads); returns the directory written."""
    from sanlab.training.average import write_average

    if (last is None) == (best is None):  # (`sanlab average`'s parser asks for one; a Python caller may not)
        raise ConfigError(f"{run_dir}: average_run takes one of last=N or best=N (the last or the N best "
                          f"checkpoints), got last={last!r}, best={best!r}")
    given = last if last is not None else best
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise ConfigError(f"{run_dir}: the number of checkpoints to average must be a whole number >= 1, "
                          f"got {given!r}")
    config = load_run_config(run_dir)
    kept = config.train.keep_last if last else config.train.keep_best
    wanted = last or best
    if wanted > kept:  # older survivors are best checkpoints, not the last N: refuse rather than mix them
        which = "keep_last" if last else "keep_best"
        raise ConfigError(f"{run_dir}: asked for {wanted} checkpoints but the run keeps {kept} ({which}); "
                          f"raise train.{which} before training")
    manager = CheckpointManager(run_dir, keep_best=config.train.keep_best, keep_last=config.train.keep_last,
                                higher_is_better=task_for(config).best_metric(config)[1], writer=False)
    chosen = manager.last(last) if last else manager.best(best)
    if not chosen:
        raise ConfigError(f"{run_dir}: has no checkpoints to average (train it first)")
    if len(chosen) < wanted:  # within keep_last / keep_best: the run has not saved that many yet
        raise ConfigError(f"{run_dir}: asked for {wanted} checkpoints, the run has saved only {len(chosen)} so far "
                          f"(of the {kept} it keeps); average fewer, or train on to save more")
    target = Path(output) if output else RunLayout(run_dir).averaged
    if output and _names_a_runs_checkpoint(target) and target.resolve() != RunLayout(run_dir).averaged.resolve():
        # an evaluation names its records after the checkpoint's directory: `evaluate --checkpoint X/best` would
        # write eval-best.json and replace the run's own best records
        raise ConfigError(f"{output}: --output may not be named {target.name!r}, the name of a run's own "
                          "checkpoint (its evaluations would replace that checkpoint's records): choose another name")
    _refuse_output_in_a_runs_own_directory(run_dir, target)
    return write_average(chosen, target, selection=f"last {last}" if last else f"best {best}")


# the directories a run keeps for its own files, and what each holds (--overwrite and `average` accept nothing else)
_RUNS_OWN_DIRECTORIES = {RunLayout.checkpoints.name: "where training keeps its own checkpoints",
                         RunLayout.averaged.name: "where `sanlab average` keeps the run's average",
                         RunLayout.tensorboard.name: "where training keeps its TensorBoard events"}


def _refuse_output_in_a_runs_own_directory(run_dir: Path, output: Path) -> None:
    """``average --output`` inside a directory that this run, or another run the path leads into, keeps for its
    own files (``checkpoints/``, ``averaged/``, ``tensorboard/``), or named as one of a run's files: that run's
    ``--overwrite`` and ``average`` would then refuse a directory holding what they did not write. (Training
    reads only the step-N directories of ``checkpoints/``; an average named so is refused above, by its name.)
    The run's own ``averaged/`` is the default. An existing directory itself is refused by ``write_average``:
    not an averaged checkpoint."""
    from sanlab.training.rundir import is_known, is_run

    real, root = Path(os.path.realpath(output)), Path(os.path.realpath(run_dir))
    if real == root / RunLayout.averaged.name:
        return
    for owner in real.parents:  # (this run, or another one the output was misdirected into)
        if owner != root and not is_run(owner):
            continue
        first = real.relative_to(owner).parts[0]
        if not is_known(first):
            continue
        depth = len(real.relative_to(owner).parts)
        spelled = Path(output).parents[depth - 1] if len(Path(output).parts) > depth else None
        shown = spelled if spelled is not None and Path(os.path.realpath(spelled)) == owner else owner
        where = (f"inside {shown / first}, {_RUNS_OWN_DIRECTORIES.get(first, 'a name the run keeps for its files')}"
                 if depth > 1 else f"is {first}, a name the run keeps for its files")
        raise ConfigError(f"--output {output}: {where} (of the run {shown}); write the average elsewhere (by "
                          f"default, {RunLayout(run_dir).averaged}; or a new directory outside every run's "
                          f"{'/, '.join(_RUNS_OWN_DIRECTORIES)}/)")


def stale_average(run_dir: Path, averaged: Path, config: Config) -> str:
    """Why the average ``averaged`` of ``run_dir`` no longer is what its selection names (the run trained on
    and saved other last or best checkpoints since), or "" (also for an average that recorded no selection)."""
    meta = read_json(averaged / META) or {}
    how = str(meta.get("selection") or "").split()
    if len(how) != 2 or how[0] not in ("last", "best") or not how[1].isdigit():
        return ""
    manager = CheckpointManager(run_dir, keep_best=0, keep_last=0,
                                higher_is_better=task_for(config).best_metric(config)[1], writer=False)
    n = int(how[1])
    try:
        now = [p.name for p in (manager.last(n) if how[0] == "last" else manager.best(n))]
    except ConfigError:  # a damaged checkpoint of the run: the average does not need it, only this check does
        return ""
    if now == meta.get("averaged"):
        return ""
    return (f"{averaged} averages {', '.join(meta.get('averaged', []))} (the {' '.join(how)} when it was written); "
            f"the run's {' '.join(how)} are now {', '.join(now)}: run `sanlab average` again for those")


def _refuse_a_borrowed_name(run_dir: Path, checkpoint: str, path: Path) -> None:
    """A checkpoint directory named like one of the run's own (``X/best``) that is not that checkpoint would write
    its records over that checkpoint's (eval-best.json, hyp-best-*.txt) and delete them as another checkpoint's:
    one from outside the run, and one of the run's by another name (``X/best`` linked to a non-best ``step-N``).
    ``path``: the directory ``checkpoint`` named when it was loaded, as named (``RunLayout.name_in_run``: a run's
    ``step-N`` linked to another disk is the run's). The keywords best, last and averaged name the run's own."""
    if checkpoint in ("best", "last", "averaged") or not _names_a_runs_checkpoint(path):
        return
    in_run = RunLayout(run_dir).name_in_run(path)
    if in_run is not None and in_run == _own_name(path.name):
        return
    where = f"{run_dir}'s {in_run}" if in_run is not None else f"a directory outside {run_dir}"
    raise ConfigError(f"--checkpoint {checkpoint}: {where}, named like one of its own checkpoints ({path.name}): "
                      "its evaluation would replace that checkpoint's records; give it another name first, or give "
                      "best, last, averaged or the checkpoint's own step-N")


def _own_name(name: str) -> str | None:
    """Where a checkpoint named ``name`` lies in its run (``checkpoints/step-N``, ``averaged``); None for a name only
    a keyword gives (best, last) or an evaluation's (``-bf16``), never a directory of the run's."""
    if re.fullmatch(rf"{STEP_PREFIX}\d+", name):
        return f"{RunLayout.checkpoints.name}/{name}"
    return name if name == RunLayout.averaged.name else None


def _names_a_runs_checkpoint(path: Path) -> bool:
    """Whether an evaluation of ``path`` would take the record names of a run's own checkpoint (RunLayout names
    them after the directory, ``-bf16`` added in bf16)."""
    return re.fullmatch(rf"(best|last|averaged|{STEP_PREFIX}\d+)(-bf16)?", Path(path).name) is not None


def tag_file(run_dir: Path, *, input_path: str | None, output_path: str | None, checkpoint: str = "best",
             device: str = "cpu", precision: str = "fp32") -> None:
    """Tag a CoNLL-U file (named ``.conllu``/``.conllu.gz``, or any input, standard input too, whose first
    word line has CoNLL-U's ten tab-separated columns) or plain tokenised text. CoNLL-U comes back as CoNLL-U,
    the run's tag column (``data.column``) filled in and every other line and column as it was; plain text as
    word<TAB>tag lines, one block per input line. ``precision``: fp32 or bf16 (the tagger's forward under
    autocast)."""
    from sanlab.data.conllu_io import looks_like_conllu, plain_words, read_conllu, with_tags
    from sanlab.data.parallel import check_input_file, input_lines
    from sanlab.files import check_output_file, output_stream
    from sanlab.tasks.tagging import tag_words
    from sanlab.training.device import (check_decoding_precision, decoding_precision, deterministic_algorithms,
                                        model_device)
    from sanlab.training.rundir import check_not_a_run_file

    check_output_file(output_path, inputs=(input_path,))
    check_not_a_run_file(output_path, run_dir)
    check_input_file(input_path)
    check_decoding_precision(precision)  # before the model is loaded
    config, model, vocab = load_trained(run_dir, checkpoint=checkpoint, device=device)
    task_for(config).require("tag", run_dir)
    task_for(config).require_precision(precision, run_dir)
    lines = input_lines(input_path)
    conllu = (bool(input_path) and ".conllu" in Path(input_path).name) or looks_like_conllu(lines)
    if conllu:  # tags, if any, replaced
        blocks = [s.words for s in read_conllu(input_path or "<stdin>", column=config.data.column,
                                                require_tags=False, lines=lines)]
    else:  # one block per input line, an empty one for a blank line, so that block n is line n
        refuse_tagged_output(lines, input_path or "<stdin>")
        blocks = [plain_words(line) for line in lines]
    with deterministic_algorithms(config.train.deterministic, model_device(model)):  # as the run trained
        predicted = tag_words(model, vocab, blocks, max_len=config.model.max_len,
                              max_chars=config.model.max_word_chars,
                              precision=decoding_precision(precision, model_device(model)))
    with output_stream(output_path) as out:
        if conllu:
            out.writelines(with_tags(lines, [tags for tags in predicted if tags], column=config.data.column))
            return
        for words, tags in zip(blocks, predicted):
            out.writelines(f"{w}\t{t}\n" for w, t in zip(words, tags))
            out.write("\n")


def refuse_tagged_output(lines: list[str], source: str) -> None:
    """A DataError where ``lines`` look like tagged output (``sanlab tag``'s own, or a two-column gold file): every
    non-blank line a word, one tab and a tag, and blank lines between the blocks. As plain text each of its lines
    would be tagged as a sentence of two words, the tag one of them. Tokenised text with a tab between words is
    taken for it only where every sentence is two words long and a blank line follows one."""
    from sanlab.data.conllu_io import plain_words
    from sanlab.errors import DataError

    filled = [k for k, line in enumerate(lines) if line.strip()]
    two_columns = all(len(plain_words(lines[k])) == 2 and lines[k].count("\t") == 1 for k in filled)
    if filled and two_columns and any(not line.strip() for line in lines[filled[0]:]):
        raise DataError("a word<TAB>tag on every line, sentences separated by blank lines: this is tagged output "
                        "(as `sanlab tag` writes it), not text to tag; give one sentence per line, its words "
                        "separated by spaces, or CoNLL-U", path=source, line=filled[0] + 1)
