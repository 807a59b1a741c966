"""What the ``sanlab analyze`` entry points read from run directories, and how they write: labels that
tell runs apart, a run's config (validated or raw), the hypotheses ``sanlab evaluate`` wrote with their
sources and references (checked to be of the weights the checkpoint names now), a run's score (best
validation record or ``eval-<checkpoint>.json``), bootstrap options, and the ``<out>.md/.csv/.png`` triple.
Heavy modules are imported inside the functions, as in ``analyze``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sanlab.config import DecodeConfig
from sanlab.errors import ConfigError, DataError, case_hint
from sanlab.files import read_json, replacing_path, write_text
from sanlab.training.layout import RunLayout

PathLike = str | Path


def run_labels(run_dirs: Sequence[PathLike]) -> list[str]:
    """Shortest path suffixes that tell the runs apart (``runs/csan2d``, ``runs/base`` -> csan2d, base);
    a comparison cell (``<variant>/seed-N``) always keeps its variant."""
    parts = [Path(r).resolve().parts for r in run_dirs]
    least = [2 if re.fullmatch(r"seed-\d+", p[-1]) else 1 for p in parts]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        labels = ["/".join(p[-max(depth, k):]) for p, k in zip(parts, least)]
        if len(set(labels)) == len(labels):
            return labels
    return [str(r) for r in run_dirs]


def checked(fn: Callable, *args, context: str, **kwargs) -> Any:
    """Call an analysis function; its input errors (KeyError / IndexError / ValueError) become
    ``ConfigError``s that say which run or option they came from."""
    try:
        return fn(*args, **kwargs)
    except (KeyError, IndexError, ValueError) as err:
        message = err.args[0] if err.args else repr(err)
        raise ConfigError(f"{context}: {message}") from None


def load_config_of(run_dir: PathLike):
    """The run's validated config (defaults filled in; properties such as a window's ``window_size``)."""
    from sanlab.runs import load_run_config

    return load_run_config(Path(run_dir))


def raw_config(run_dir: PathLike) -> dict:
    path = RunLayout(run_dir).config
    if not path.exists():
        raise ConfigError(f"{run_dir}: not a run directory (no {path.name})")
    from sanlab.config_yaml import read_yaml_mapping

    return read_yaml_mapping(path, what="run config")


def write_outputs(out: PathLike, *, title: str, table, notes: str, plot: Callable[[Path], Path],
                  csv_table=None) -> dict[str, Path]:
    """``<out>.md``, ``<out>.csv`` and ``<out>.png`` (``out`` is a prefix: ``results/gap`` -> results/gap.md).
    ``csv_table``: the CSV's own table when the Markdown one is laid out for reading (default: ``table``)."""
    paths = {ext: Path(f"{out}.{ext}") for ext in ("md", "csv", "png")}
    paths["md"].parent.mkdir(parents=True, exist_ok=True)
    md = f"# {title}\n\n{table.markdown()}\n{notes.strip()}\n"
    csv = (table if csv_table is None else csv_table).csv()
    with replacing_path(paths["png"]) as png:  # then the figure: one that fails to draw leaves all three as they were
        plot(png)
    write_text(paths["md"], md)
    write_text(paths["csv"], csv)
    return paths


def _translation_config(run_dir: PathLike):
    """The config of a run whose task writes hypotheses to analyse (``Task.supports("bleu-analysis")``)."""
    from sanlab.runs import load_run_config
    from sanlab.tasks.base import task_for

    config = load_run_config(Path(run_dir))
    task_for(config).require("bleu-analysis", run_dir, spelt="sanlab analyze ngram-gap / length-buckets / pairwise")
    return config


def held_out_split(config, split: str | None, *, run_dir: PathLike | None = None) -> tuple[str, Any]:
    """(name, ParallelFiles) of a held-out split: ``split``, else the first ``data.test`` split, else valid.
    ``run_dir``: the run whose config this is, named by the error for a split it lacks."""
    files = {**dict(config.data.test), "valid": config.data.valid}
    name = split or next(iter(config.data.test), "valid")
    if name not in files:
        whose = f"{RunLayout(run_dir).config} has" if run_dir is not None else "the runs have"
        raise ConfigError(f"unknown split {name!r}; {whose}: {', '.join(files)}")
    return name, files[name]


# the settings that change which hypothesis a run writes: runs compared must share them
SEARCH_SETTINGS = ("beam", "length_penalty", "length_penalty_style", "max_len_a", "max_len_b")


def load_hypotheses(run_dir: PathLike, *, checkpoint: str, split: str, expected: int,
                    references: PathLike) -> tuple[list[str], dict | None]:
    """The hypotheses ``sanlab evaluate`` wrote for (checkpoint, split), checked against the ``expected``
    references (the file ``references``, named with the hypotheses when the counts differ), and the search
    settings its record says they were decoded with (None where it does not say)."""
    path = RunLayout(run_dir).hypotheses(checkpoint, split)
    if not path.exists():
        raise ConfigError(f"{path} not found: decode first with "
                          f"`sanlab evaluate --run {run_dir} --checkpoint {checkpoint} --split {split}`")
    from sanlab.tasks.translation import hypotheses_digest, read_hypotheses

    record = RunLayout(run_dir).eval_record(checkpoint)  # written with the hypotheses
    results = read_json(record) or {}
    if isinstance(results.get(split), dict):
        check_current(record, results, split, run_dir=run_dir, checkpoint=checkpoint)
    hyps = read_hypotheses(path)
    digest = results.get(split, {}).get("hypotheses_sha256") if isinstance(results.get(split), dict) else None
    if digest is not None and digest != hypotheses_digest(hyps):
        raise ConfigError(f"{path} is not the file {record.name} scored (an evaluation that failed part way "
                          f"replaced it?): run `sanlab evaluate --run {run_dir} --checkpoint {checkpoint} --split "
                          f"{split}` again")
    if len(hyps) != expected:
        raise DataError(f"{len(hyps)} hypotheses for the {expected} references of {references} (is it the same test "
                        "set?)", path=str(path))
    decode = results.get(split, {}).get("decode") if isinstance(results.get(split), dict) else None
    return hyps, (search_settings(decode) if isinstance(decode, dict) else None)


def search_settings(decode: dict) -> dict:
    """``SEARCH_SETTINGS`` of a record's ``decode``; a key added since records began (the length penalty's style)
    only where it is not the value records from before it were decoded with (``DecodeConfig.as_recorded``)."""
    return DecodeConfig.as_recorded({k: decode.get(k) for k in SEARCH_SETTINGS})


def _one_search(labels: Sequence[str], searches: Sequence[dict | None], split: str) -> None:
    """Every run's hypotheses come from the same search (beam, length penalty, length limits): a difference
    between runs decoded otherwise is partly the decoding's, and the tests would credit it to the model."""
    known = {label: s for label, s in zip(labels, searches) if s is not None}
    if len({json.dumps(s, sort_keys=True) for s in known.values()}) <= 1:
        return
    listed = "; ".join(f"{label}: " + ", ".join(f"{k} {v}" for k, v in s.items()) for label, s in known.items())
    raise ConfigError(f"the runs' {split} hypotheses were decoded with different search settings ({listed}); "
                      "decode them alike first (`sanlab evaluate --run RUN --split SPLIT --beam N ...`)")


def translation_inputs(run_dirs: Sequence[PathLike], *, split: str | None, checkpoint: str,
                       sources: PathLike | None = None, references: PathLike | None = None,
                       need_sources: bool = True) -> dict:
    """Sources (unless not ``need_sources``), references (from the first run's config, or the given files)
    and each run's hypotheses."""
    from sanlab.data.parallel import open_text, read_parallel

    configs = [_translation_config(r) for r in run_dirs]
    name, files = held_out_split(configs[0], split, run_dir=run_dirs[0])
    if not references:
        _one_test_set(run_dirs, [held_out_split(c, name, run_dir=r)[1].tgt for c, r in zip(configs, run_dirs)],
                      name)
    pairs = []  # every line, as scored: the split's sources with its references where the sources are needed
    if need_sources and not sources:
        pairs = read_parallel(files.src, files.tgt, keep_empty=True)
    if references or not pairs:
        refs = list(open_text(references or files.tgt))
    else:
        refs = [t for _, t in pairs]
    if not refs:  # (sacreBLEU cannot score an empty corpus; every analysis needs sentences)
        raise DataError("no reference sentences (the file is empty)", path=str(references or files.tgt))
    src = (list(open_text(sources)) if sources else [s for s, _ in pairs]) if need_sources else None
    if src is not None and len(src) != len(refs):  # (either file may be the wrong one: both are named)
        raise DataError(f"{len(src)} sources but {len(refs)} references in {references or files.tgt}",
                        path=str(sources or files.src))
    labels = run_labels(run_dirs)
    loaded = [load_hypotheses(r, checkpoint=checkpoint, split=name, expected=len(refs),
                              references=references or files.tgt) for r in run_dirs]
    _one_search(labels, [search for _, search in loaded], name)
    hyps = {label: h for label, (h, _) in zip(labels, loaded)}
    return {"split": name, "sources": src, "references": refs, "hypotheses": hyps}


def _one_test_set(run_dirs: Sequence[PathLike], targets: list[str], split: str) -> None:
    """Every run's ``split`` is scored against the first run's references (the same file, or the same bytes):
    hypotheses of another test set with as many lines would otherwise be scored and tested against these."""
    import hashlib

    def digest(path: str) -> str:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()

    first = targets[0]
    for run_dir, target in zip(run_dirs[1:], targets[1:]):
        if Path(target).resolve() != Path(first).resolve() and digest(target) != digest(first):
            raise ConfigError(f"{run_dir}: its {split!r} references are {target}, {run_dirs[0]}'s are {first}: "
                              "other test sets cannot be compared sentence by sentence; analyse runs of one test "
                              "set, or give --references FILE to score them all against one")


def one_split_data(run_dirs: Sequence[PathLike], split: str | None) -> None:
    """Every run was scored on the first run's data of ``split`` (None: its validation split, ``valid`` or ``dev``):
    the same files, or the same bytes. Scores of other test sets set side by side (a sweep's line and its means)
    would read as an effect of the swept value. A split a config does not name, or a file not here under another
    name, cannot be checked and is left alone."""
    import hashlib

    from sanlab.tasks.base import task_for

    def data(run: PathLike) -> tuple[str | None, list[Path] | None]:
        config = load_config_of(run)
        task = task_for(config)
        name = split or next((s for s in ("valid", "dev") if s in task.splits(config)), None)
        return name, task.split_files(config, name) if name in task.splits(config) else None

    def same(a: Path, b: Path) -> bool:
        if a.resolve() == b.resolve() or not (a.is_file() and b.is_file()):
            return True
        return a.stat().st_size == b.stat().st_size and \
            hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()

    first = data(run_dirs[0])[1]
    for run in run_dirs[1:]:
        own_name, files = data(run)
        if first is None or files is None:
            continue
        differ = [f"{b} where {run_dirs[0]} has {a}" for a, b in zip(first, files) if not same(a, b)]
        if differ:
            raise ConfigError(f"{run}: its {own_name!r} data are not the first run's ({'; '.join(differ)}): scores "
                              "of other sentences cannot be set side by side; analyse runs scored on one data set")


def bootstrap_options(samples: int | None, seed: int | None) -> tuple[int, int]:
    """(resamples, seed) of a paired bootstrap, by default 1000 and 12345 as in ``sanlab compare``."""
    samples = 1000 if samples is None else samples
    seed = 12345 if seed is None else seed
    if samples < 1 or seed < 1:  # sacreBLEU would take seed 0 as "unseeded"
        raise ConfigError(f"--bootstrap-samples and --bootstrap-seed must be >= 1, got {samples} and {seed}")
    return samples, seed


def baselines_first(baselines: Sequence[PathLike], runs: Sequence[PathLike]) -> list[Path]:
    """The baseline runs, then the other runs, each run once (a run may be named in both lists)."""
    return distinct_runs([*baselines, *runs])


def distinct_runs(runs: Sequence[PathLike]) -> list[Path]:
    """The runs in order, each once however it was spelled (``a``, ``a/``, ``./a``): a run named twice would
    count twice in a mean over seeds."""
    ordered: dict[Path, Path] = {}
    for run in runs:
        ordered.setdefault(Path(run).resolve(), Path(run))
    return list(ordered.values())


def default_metric(run_dir: PathLike, *, score_from: str = "valid") -> str:
    """In validation records, the metric that picks the run's best checkpoint (``train.best_metric``, else the
    task's: bleu, accuracy); in ``eval-*.json``, the task's primary score (bleu, all)."""
    from sanlab.config import TASKS  # the raw config's task: the metrics file is read whatever the rest holds
    from sanlab.tasks.base import task_named

    raw = raw_config(run_dir)
    train = raw.get("train") if isinstance(raw.get("train"), dict) else {}
    if score_from == "valid" and isinstance(train.get("best_metric"), str):
        return train["best_metric"]
    name = raw.get("task")
    if name not in TASKS.references():
        raise ConfigError(f"{RunLayout(run_dir).config}: task {name!r} is not a known task "
                          f"({', '.join(TASKS.names())}); give --metric")
    task = task_named(name)
    return task.metric if score_from == "valid" else task.eval_metric


def shared_metric(run_dirs: Sequence[PathLike], *, score_from: str = "valid") -> str:
    """The metric every run is scored by without --metric: each run's own (``default_metric``), which must be one
    for all of them (the first run's would score the others by a metric that did not pick their best, and the
    table would depend on the order the runs are named in)."""
    metrics = {str(run): default_metric(run, score_from=score_from) for run in run_dirs}
    if len(set(metrics.values())) > 1:
        listed = "; ".join(f"{run}: {metric}" for run, metric in metrics.items())
        raise ConfigError(f"the runs are scored by different metrics ({listed}): give --metric to score every run "
                          "by one of them")
    return next(iter(metrics.values()))


def metric_direction(run_dir: PathLike, metric: str) -> bool | None:
    """Whether higher ``metric`` is better in the run's validation, as its task's config class declares it
    (``best_metrics``), else, for the task's own ``metric``, as the task does (``higher_is_better``: a plug-in's
    may be in no table); None for any other metric, or a task not registered here."""
    from sanlab.config import TASKS
    from sanlab.tasks.base import task_named

    name = raw_config(run_dir).get("task")
    if name not in TASKS.references():
        return None
    declared = TASKS.entry(name).config.best_metrics.get(metric)
    if declared is None and metric == task_named(name).metric:
        return task_named(name).higher_is_better
    return declared


def run_score(run_dir: PathLike, *, metric: str | None, score_from: str, split: str | None,
              checkpoint: str) -> tuple[float, str]:
    """(score, where it came from) of a run: its best validation record, or ``eval-<checkpoint>.json``."""
    from sanlab.evaluation import analysis_curves
    from sanlab.training.logging import read_metrics

    metric = metric or default_metric(run_dir, score_from=score_from)
    if score_from == "valid":
        step, score = checked(analysis_curves.best_validation, read_metrics(Path(run_dir)), metric=metric,
                              higher_is_better=metric_direction(run_dir, metric),
                              context=str(RunLayout(run_dir).metrics))
        return score, f"valid {metric}, step {step}"
    if score_from != "eval":
        raise ConfigError(f"score_from must be 'valid' or 'eval', got {score_from!r}")
    path, results = eval_records(run_dir, checkpoint)
    name = split or next(iter(results))
    record = results.get(name)
    if not isinstance(record, dict) or isinstance(record.get(metric), bool) \
            or not isinstance(record.get(metric), (int, float)):
        numeric = [k for k, v in record.items() if isinstance(v, (int, float))] if isinstance(record, dict) else []
        hint = case_hint(metric, numeric)
        raise ConfigError(f"{path}: no {metric!r} for split {name!r} (splits: {', '.join(results)}; "
                          f"metrics: {', '.join(numeric) or 'none'}){'; ' if hint else ''}{hint}")
    check_current(path, results, name, run_dir=run_dir, checkpoint=checkpoint)
    return float(record[metric]), f"{path.name} {name} {metric}"


def eval_records(run_dir: PathLike, checkpoint: str) -> tuple[Path, dict]:
    """``eval-<checkpoint>.json`` of a run and its records by split: an error naming the file (and the command
    that writes it) where it is missing, damaged or holds no split."""
    layout = RunLayout(run_dir)
    path = layout.eval_record(checkpoint)
    again = f"run `sanlab evaluate --run {run_dir} --checkpoint {checkpoint}`"
    results = read_json(path, remedy=f"{again} again")
    if results is None and layout.compare_eval.is_file():
        return _compare_cell_records(layout.compare_eval, checkpoint)
    if results is None:
        raise ConfigError(f"{path} not found: {again} first")
    if not results:
        raise ConfigError(f"{path}: no split scored in it; {again}")
    return path, results


def _compare_cell_records(path: Path, checkpoint: str) -> tuple[Path, dict]:
    """A comparison cell's score (``compare-eval.json``, its grid's checkpoint and split) as ``eval_records``
    gives an ``eval-<checkpoint>.json``'s: committed cells keep it, not their checkpoints, so ``evaluate`` cannot
    write the other file there."""
    record = read_json(path) or {}
    key = record.get("key") or {}
    if key.get("checkpoint") != checkpoint or key.get("average_last") or not isinstance(record.get("scores"), dict):
        raise ConfigError(f"{path} scored checkpoint {key.get('checkpoint')!r}"
                          + (f" (averaged over the last {key['average_last']})" if key.get("average_last") else "")
                          + f", not {checkpoint!r}, and there is no eval-{checkpoint}.json beside it: pass "
                          f"--checkpoint {key.get('checkpoint')}, or `sanlab evaluate` the run where its checkpoints are")
    return path, {key.get("split") or "test": record["scores"]}


def default_eval_split(run_dir: PathLike, checkpoint: str) -> str:
    """The split ``--from eval`` scores when ``--split`` is not given: the first in the first run's
    ``eval-<checkpoint>.json``, taken for every run (each file's own first split is the one evaluated first,
    which may differ between runs)."""
    return next(iter(eval_records(run_dir, checkpoint)[1]))


def check_current(path: Path, results: dict, name: str, *, run_dir: PathLike, checkpoint: str) -> None:
    """The ``name`` record of ``path`` (eval-<checkpoint>.json) scored the weights that ``checkpoint`` names
    now; otherwise (the run trained on, or was averaged again) its scores and hypotheses are stale."""
    named = [k for k, r in results.items() if isinstance(r, dict) and "checkpoint" in r]
    if named and "checkpoint" not in results[name]:  # kept by `evaluate` beside newer records: maybe stale
        raise ConfigError(f"{path}: the {name!r} record is from before records named their checkpoint, while "
                          f"{', '.join(named)} name theirs, so it may come from other weights: run `sanlab evaluate "
                          f"--run {run_dir} --checkpoint {checkpoint} --split {name}` again")
    if "checkpoint" in results[name]:  # files from before the record named its checkpoint are taken as they are
        from sanlab.runs import load_run_config, same_weights, scored_checkpoint

        recorded = results[name]
        now = scored_checkpoint(Path(run_dir), checkpoint, load_run_config(run_dir))
        if not same_weights(recorded, now):
            raise ConfigError(f"{path} scored {recorded['checkpoint']} (step {recorded.get('step')}), but the run's "
                              f"{checkpoint!r} checkpoint is now {now['checkpoint']} (step {now['step']}): run "
                              f"`sanlab evaluate --run {run_dir} --checkpoint {checkpoint} --split {name}` again")
