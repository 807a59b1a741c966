"""Comparison grids: variants x seeds (x datasets) of one base recipe, planned as run cells.

A grid file (YAML; see ``docs/compare.md``)::

    base: ../multi30k-en-de-transformer.yaml     # a recipe, relative to the grid file
    seeds: [1]
    variants:                                    # ordered; the first (or `baseline: true`) is the baseline
      - {name: vanilla, seeds: [1, 2, 3], paper: {BLEU: 27.31}}
      - name: 1D-CSAN
        overrides: ["model.encoder.attention.parts=[{type: window, size: 11, layers: [0, 1]}]"]
    eval: {checkpoint: best, split: test_2016_flickr}
    set: [train.max_steps=2000]                  # applied to every cell

Each cell (dataset, variant, seed) is one run directory
``<runs_dir>[/<dataset-slug>]/<variant-slug>/seed-<s>``. A cell's config is resolved in this
order: base recipe -> synthetic data paths -> dataset overrides -> variant overrides -> grid
``set`` -> command-line ``--set`` -> ``train.seed=<s>``. ``set`` and ``--set`` come after the
variant on purpose: they are the experimenter's budget knobs and must hold for every row alike.
Paths inside recipes (data, ``runs_dir``) are relative to the working directory, as for
``sanlab train``; only ``base`` is relative to the grid file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sanlab.config import TASKS, Config, validate
from sanlab.config_yaml import apply_override, load_raw, read_yaml_mapping, set_key
from sanlab.errors import ConfigError
from sanlab.files import read_json
from sanlab.runs import RESUMABLE_KEYS, config_differences, shorter_budget
from sanlab.tasks.base import Task, task_for, task_named
from sanlab.training.checkpoint import META, latest_checkpoint
from sanlab.training.layout import RunLayout

Overrides = list[str] | dict[str, Any]
DONE_FILE = RunLayout.done.name          # written when train_run returns: the cell finished training
EVAL_FILE = RunLayout.compare_eval.name  # written when the cell was evaluated the way the grid asks
FAILED_FILE = RunLayout.failed.name      # the last error of a cell that failed; removed when it is evaluated
# Keys that do not change what was trained: a finished cell stays finished when only these change.
NOT_TRAINING_KEYS = ("decode.", "train.progress", "train.threads", "train.log_every")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class VariantSpec(_Strict):
    name: str
    overrides: Overrides = []
    note: str | None = None
    baseline: bool = False
    seeds: list[int] | None = None              # default: the grid's seeds
    paper: dict[str, float | str] = {}          # published numbers, printed in "paper ..." columns


class DatasetSpec(_Strict):
    name: str
    overrides: Overrides = []
    note: str | None = None
    paper: dict[str, dict[str, float | str]] = {}  # variant name -> column -> published number


class EvalSpec(_Strict):
    checkpoint: Literal["best", "averaged", "last"] = "best"
    average_last: int | None = Field(None, ge=1)   # average the last N checkpoints first (checkpoint: averaged)
    split: str | None = None                       # default: the first test split (translation) / test (tagging)
    bootstrap_samples: int = Field(1000, ge=1)
    bootstrap_seed: int = Field(12345, ge=1)


class SyntheticSpec(_Strict):
    """Generate a synthetic corpus into ``<runs_dir>/data`` and point every cell at it."""

    task: str                                   # a registered task (sanlab.config.TASKS)
    seed: int = 1
    sizes: dict[str, int]


class GridSpec(_Strict):
    base: str
    title: str | None = None
    seeds: list[int] = Field(min_length=1)
    variants: list[VariantSpec] = Field(min_length=1)
    datasets: list[DatasetSpec] = []
    runs_dir: str | None = None                    # default: runs/compare/<grid file stem>
    eval: EvalSpec = EvalSpec()
    set: Overrides = []
    synthetic: SyntheticSpec | None = None
    reference: str | None = None                   # where the paper columns come from
    notes: list[str] | str = []


class DatasetsFile(_Strict):
    """A ``--datasets`` file: the grid's ``datasets:`` key and nothing else; its entries replace the grid's."""

    datasets: list[DatasetSpec] = Field(min_length=1)


@dataclass(frozen=True)
class Cell:
    dataset: str | None
    variant: str
    seed: int
    run_dir: Path
    config: Config
    split: str

    @property
    def kind(self) -> Task:
        """The cell's task (``tasks.base.Task``)."""
        return task_for(self.config)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    @property
    def label(self) -> str:
        return " / ".join(x for x in (self.dataset, self.variant, f"seed {self.seed}") if x is not None)


@dataclass(frozen=True)
class Grid:
    path: Path
    spec: GridSpec
    runs_dir: Path
    cells: tuple[Cell, ...]
    cli_overrides: tuple[str, ...] = ()
    datasets_file: Path | None = None          # ``--datasets``: where the datasets came from instead of the grid

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def task(self) -> str:
        return self.cells[0].config.task

    @property
    def kind(self) -> Task:
        """The grid's task (``tasks.base.Task``): its metrics, significance test and evidence."""
        return self.cells[0].kind

    @property
    def baseline(self) -> str:
        marked = [v.name for v in self.spec.variants if v.baseline]
        return marked[0] if marked else self.spec.variants[0].name

    @property
    def datasets(self) -> list[str | None]:
        return [d.name for d in self.spec.datasets] or [None]

    def variant(self, name: str) -> VariantSpec:
        return next(v for v in self.spec.variants if v.name == name)

    def seeds_of(self, variant: str) -> list[int]:
        return self.variant(variant).seeds or self.spec.seeds

    def cells_of(self, *, dataset: str | None, variant: str) -> list[Cell]:
        return [c for c in self.cells if c.dataset == dataset and c.variant == variant]

    def paper(self, *, dataset: str | None, variant: str) -> dict[str, float | str]:
        numbers = dict(self.variant(variant).paper)
        if dataset is not None:
            numbers.update(next(d for d in self.spec.datasets if d.name == dataset).paper.get(variant, {}))
        return numbers

    def notes(self) -> list[str]:
        notes = self.spec.notes
        return [notes] if isinstance(notes, str) else list(notes)


def slug(name: str) -> str:
    """A directory name for a variant or dataset: ``2D-CSAN`` -> ``2d-csan``, ``SAN+PE[add]`` -> ``san-pe-add``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "x"


# ----------------------------------------------------------------------------- loading
def _read_spec(path: Path) -> GridSpec:
    raw = read_yaml_mapping(path, what="grid file")
    try:
        return GridSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}: invalid grid\n" + "\n".join(_describe(e, raw) for e in err.errors())) from None


def _describe(error: dict, raw: dict) -> str:
    """One validation error, naming the variant or dataset it belongs to."""
    loc = list(error["loc"])
    where = ".".join(str(x) for x in loc) or "<root>"
    if len(loc) >= 2 and loc[0] in ("variants", "datasets") and isinstance(loc[1], int):
        entry = (raw.get(loc[0]) or [None] * (loc[1] + 1))[loc[1]]
        name = entry.get("name") if isinstance(entry, dict) else None
        kind = "variant" if loc[0] == "variants" else "dataset"
        where = f"{kind} {name!r} ({loc[0]}[{loc[1]}])" + ("." + ".".join(map(str, loc[2:])) if loc[2:] else "")
    msg = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    return f"  {where}: {msg}"


def read_datasets_file(path: Path) -> list[DatasetSpec]:
    """The entries of a ``--datasets`` file (``datasets: [{name, overrides, note, paper}, ...]``), validated
    as the grid's own; errors name the file and the entry."""
    raw = read_yaml_mapping(path, what="datasets file")
    try:
        return DatasetsFile.model_validate(raw).datasets
    except ValidationError as err:
        raise ConfigError(f"{path}: invalid datasets file (a mapping with one key, datasets: a list of {{name, "
                          "overrides, note, paper}})\n" + "\n".join(_describe(e, raw) for e in err.errors())) from None


def _check_spec(spec: GridSpec, path: Path, *, datasets_from: Path | None = None) -> None:
    """Consistency of a grid; errors about its datasets name ``datasets_from`` when they came from there."""
    def fail(message: str, where: Path = path):
        raise ConfigError(f"{where}: {message}")

    for kind, names, where in (("variant", [v.name for v in spec.variants], path),
                               ("dataset", [d.name for d in spec.datasets], datasets_from or path)):
        slugs = [slug(n) for n in names]
        dup = sorted({n for n, s in zip(names, slugs) if slugs.count(s) > 1})
        if dup:
            fail(f"{kind} names {dup} collide (same directory name); rename them", where)
    if sum(v.baseline for v in spec.variants) > 1:
        fail(f"more than one variant is marked baseline: {[v.name for v in spec.variants if v.baseline]}")
    for v in spec.variants:
        seeds = v.seeds if v.seeds is not None else spec.seeds
        if not seeds or len(set(seeds)) != len(seeds):
            fail(f"variant {v.name!r}: seeds must be a non-empty list without repeats, got {seeds}")
    if len(set(spec.seeds)) != len(spec.seeds):
        fail(f"seeds must not repeat, got {spec.seeds}")
    known = {v.name for v in spec.variants}
    for d in spec.datasets:
        unknown = sorted(set(d.paper) - known)
        if unknown:
            fail(f"dataset {d.name!r}: paper numbers for unknown variant(s) {unknown}; variants: {sorted(known)}",
                 datasets_from or path)
    ev = spec.eval
    if (ev.checkpoint == "averaged") != (ev.average_last is not None):
        fail(f"eval: checkpoint 'averaged' goes with average_last: N (got checkpoint {ev.checkpoint!r}, "
             f"average_last {ev.average_last})")


def _apply(raw: dict, overrides: Overrides, *, origin: str) -> None:
    """``key=value`` strings, or a mapping whose keys may be dotted (``model.encoder.layers: 2``)."""
    if isinstance(overrides, list):
        for assignment in overrides:
            try:
                apply_override(raw, assignment)
            except ConfigError as err:
                raise ConfigError(f"{origin}: {err}") from None
        return
    for key, value in overrides.items():
        try:
            set_key(raw, str(key), value, merge=True)
        except ConfigError as err:
            raise ConfigError(f"{origin}: {err}") from None


def synthetic_task(spec: SyntheticSpec, *, origin: Path) -> Task:
    """The task whose synthetic corpus a grid asks for (``synthetic.task``)."""
    if spec.task not in TASKS.references():
        raise ConfigError(f"{origin}: synthetic.task {spec.task!r} is not a task; known: {', '.join(TASKS.names())}")
    return task_named(spec.task)


def default_split(config: Config) -> str:
    return task_for(config).default_split(config)


def _check_split(config: Config, split: str, *, origin: str) -> None:
    known = task_for(config).splits(config)
    if split not in known:
        raise ConfigError(f"{origin}: eval split {split!r} is not in this run's data; it has: {', '.join(known)}")


def load_grid(path: str | Path, *, overrides: list[str] = (), runs_dir: str | Path | None = None,
              datasets_file: str | Path | None = None) -> Grid:
    """Read and check a grid file; resolve and validate the config of every cell.

    ``overrides`` are command-line ``--set`` assignments for every cell; ``runs_dir`` replaces
    the grid's. ``datasets_file`` (``--datasets``) replaces the grid's datasets with its own; their
    cells then go to ``runs/compare/<grid>-<file>`` unless ``runs_dir`` says otherwise, never into the
    grid's (committed) runs_dir, and every data file they name must exist. Errors name the grid file
    (or the datasets file) and the variant and dataset concerned.
    """
    path = Path(path)
    spec = _read_spec(path)
    datasets_from = Path(datasets_file) if datasets_file is not None else None
    if datasets_from is not None:
        spec = spec.model_copy(update={"datasets": read_datasets_file(datasets_from)})
        runs_dir = runs_dir or Path("runs") / "compare" / f"{path.stem}-{datasets_from.stem}"
    _check_spec(spec, path, datasets_from=datasets_from)
    if spec.synthetic is not None:
        missing = [s for s in synthetic_task(spec.synthetic, origin=path).synthetic_splits
                   if s not in spec.synthetic.sizes]
        if missing:
            raise ConfigError(f"{path}: synthetic.sizes needs the splits {missing}")
    root = Path(runs_dir or spec.runs_dir or Path("runs") / "compare" / path.stem)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: is a file, not a directory for the grid's cells (runs_dir / --runs-dir)")
    base = load_raw(path.parent / spec.base)
    cells = []
    for dataset in spec.datasets or [None]:
        for variant in spec.variants:
            for seed in variant.seeds or spec.seeds:
                cells.append(_plan_cell(spec, base, path=path, root=root, dataset=dataset, variant=variant,
                                        seed=seed, cli=list(overrides), datasets_from=datasets_from))
    return Grid(path=path, spec=spec, runs_dir=root, cells=tuple(cells), cli_overrides=tuple(overrides),
                datasets_file=datasets_from)


def _plan_cell(spec: GridSpec, base: dict, *, path: Path, root: Path, dataset: DatasetSpec | None,
               variant: VariantSpec, seed: int, cli: list[str], datasets_from: Path | None = None) -> Cell:
    where = f"variant {variant.name!r}" + (f" on dataset {dataset.name!r}" if dataset else "")
    origin = f"{path}: {where}"
    raw = json.loads(json.dumps(base))  # a deep copy
    if spec.synthetic is not None:  # replaces the recipe's data files, test sets included (not merged into them)
        if isinstance(raw.get("data"), dict):
            raw["data"].pop("test", None)
        _apply(raw, synthetic_task(spec.synthetic, origin=path).synthetic_data(root / "data"), origin=origin)
    own = f"{datasets_from}: dataset {dataset.name!r}" if datasets_from is not None and dataset else None
    if own and not _sets_data(dataset.overrides):
        raise ConfigError(f"{own}: its overrides set no data.* key, so it would train and test on the recipe's "
                          f"data ({spec.base}); set data.train, data.dev and data.test (or their translation "
                          "counterparts) there")
    for overrides, what in ((dataset.overrides if dataset else [], "dataset"), (variant.overrides, "overrides"),
                            (spec.set, "set"), (cli, "--set"), ([f"train.seed={seed}"], "seed")):
        _apply(raw, overrides, origin=f"{own} (overrides)" if own and what == "dataset" else f"{origin} ({what})")
    config = validate(raw, source=f"{own} (base {spec.base}, variant {variant.name!r})" if own else
                      f"{origin} (base {spec.base})")
    if own:
        _check_data_files(config, origin=own)
    split = spec.eval.split or default_split(config)
    _check_split(config, split, origin=origin)
    if spec.eval.average_last and spec.eval.average_last > config.train.keep_last:  # found only after training
        raise ConfigError(f"{origin}: eval.average_last {spec.eval.average_last} > train.keep_last "
                          f"{config.train.keep_last}; the run would not keep the checkpoints to average: raise "
                          "train.keep_last (in set:)")
    run_dir = root / (slug(dataset.name) if dataset else "") / slug(variant.name) / f"seed-{seed}"
    return Cell(dataset=dataset.name if dataset else None, variant=variant.name, seed=seed, run_dir=run_dir,
                config=config, split=split)


def _sets_data(overrides: Overrides) -> bool:
    """Whether overrides (``key=value`` strings or a mapping, dotted keys allowed) set a ``data`` key."""
    keys = [a.split("=", 1)[0] for a in overrides] if isinstance(overrides, list) else [str(k) for k in overrides]
    return any(k.strip() == "data" or k.strip().startswith("data.") for k in keys)


def _check_data_files(config: Config, *, origin: str) -> None:
    """A ``--datasets`` entry's data files exist (a typo would otherwise surface when its cell trains)."""
    for key, name in task_for(config).data_files(config):
        if not Path(name).is_file():
            raise ConfigError(f"{origin}: {key} {name}: no such file (data paths are relative to the working "
                              f"directory, {Path.cwd()})")


# ----------------------------------------------------------------------------- cell state
@dataclass(frozen=True)
class CellState:
    status: Literal["pending", "training", "trained", "evaluated", "conflict"]
    step: int | None = None
    detail: str = ""

    def describe(self) -> str:
        text = {"training": f"training step {self.step}", "trained": f"trained (step {self.step})",
                "evaluated": f"evaluated (step {self.step})"}.get(self.status, self.status)
        return text + (f" — {self.detail}" if self.detail else "")




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
    """A saved config re-validated, so keys added to the schema since then compare as their defaults."""
    return config_dict(validate(raw, source=str(source)))


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
    step, done = latest_step(run), read_json(layout.done)
    if step is None and done:  # a finished cell committed without its checkpoints (results/compare)
        step = done["summary"]["step"]
    changes = training_changes(done, cell) if done else []
    if done and not changes and step > done["summary"]["step"]:  # e.g. `sanlab train` with a larger budget; a
        # budget the grid itself raised (changes) resumes past done.json and is judged by config.yaml below
        return CellState("conflict", step, f"trained on after the grid finished it (checkpoints reach step {step}, "
                                           f"{DONE_FILE} says {done['summary']['step']}): not the grid's cell any more")
    if done and not changes:
        record = read_json(layout.compare_eval)
        if record and record.get("key") == eval_key(cell, spec) and record.get("trained_at") == done["finished_at"]:
            changed = [p for p, digest in (record.get("data_sha256") or {}).items()
                       if data_digests(cell).get(p, digest) != digest]  # records before digests are trusted
            if changed:
                return CellState("trained", step, f"{', '.join(changed)} changed since the cell was scored")
            if evidence_intact(run, record):
                return CellState("evaluated", step)
            return CellState("trained", step, f"{record.get('evidence')} or the recorded scores changed (or the "
                                              "file is missing) since it was scored")
        if record and record.get("trained_at") == done["finished_at"] and _stale_groups(record, eval_key(cell, spec)):
            return CellState("trained", step, "scored with the OOV/ambiguous definitions before 2026-11-25: "
                                              "`sanlab compare GRID --rescore` scores it again from its predictions")
        return CellState("trained", step)
    saved = _normalised(read_yaml_mapping(layout.config, what="run config"), source=layout.config)
    blocking = [k for k in config_differences(saved, config_dict(cell.config)) if not k.startswith(RESUMABLE_KEYS)]
    if blocking:
        return CellState("conflict", step, f"the directory holds a run with other values of: {', '.join(blocking)}")
    shorter = shorter_budget(run, cell.config, saved, trained=done["summary"] if done else None)
    if shorter:
        return CellState("conflict", step, shorter)
    detail = f"continues: {', '.join(changes)} changed" if changes else ""
    return CellState("training" if step is not None else "pending", step, detail)
