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

Here: reading a grid file into a ``Grid`` and resolving the config of each cell. The schema is
``grid_schema``, the state of a cell on disk ``grid_state``; the names tests and scripts import from here
are re-exported.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ValidationError

from sanlab.config import TASKS, Config, annotation_at, chain_task, named_entries, validate
from sanlab.config_yaml import (
    Named,
    apply_override,
    assigned_keys,
    base_file,
    key_line,
    key_origin,
    load_chain,
    merge_chain,
    read_yaml_mapping,
    set_key,
    sets_key,
)
from sanlab.errors import ConfigError
from sanlab.experiments.grid_schema import (  # noqa: F401  (Cell, EvalSpec, Grid re-exported)
    Cell,
    DatasetsFile,
    DatasetSpec,
    EvalSpec,
    Grid,
    GridSpec,
    Overrides,
    SyntheticSpec,
    VariantSpec,
    slug,
)
from sanlab.experiments.grid_state import cell_state, config_dict  # noqa: F401  (re-exported for tests)
from sanlab.registry import did_you_mean, rule_words
from sanlab.runs import check_buildable
from sanlab.tasks.base import Task, task_for, task_named


def _read_spec(path: Path) -> GridSpec:
    raw = read_yaml_mapping(path, what="grid file")
    try:
        return GridSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}: invalid grid\n" + "\n".join(_describe(e, raw, path, GridSpec)
                                                               for e in err.errors())) from None


def _describe(error: dict, raw: dict, path: Path, schema: type) -> str:
    """One validation error: where (the variant or dataset by name, the file's line), what, and for an unknown
    key the keys spelt like it that the schema takes there."""
    loc = list(error["loc"])
    where = ".".join(str(x) for x in loc) or "<root>"
    if len(loc) >= 2 and loc[0] in ("variants", "datasets") and isinstance(loc[1], int):
        entry = (raw.get(loc[0]) or [None] * (loc[1] + 1))[loc[1]]
        name = entry.get("name") if isinstance(entry, dict) else None
        kind = "variant" if loc[0] == "variants" else "dataset"
        label = f"{kind} {name!r}" if isinstance(name, str) else f"the {kind} without a name"
        where = f"{label} ({loc[0]}[{loc[1]}])" + ("." + ".".join(map(str, loc[2:])) if loc[2:] else "")
    msg = rule_words(error)  # a rule's own words, as config errors give them
    if error["type"] == "extra_forbidden":
        msg = "unknown key" + did_you_mean(str(loc[-1]), _known_keys(schema, loc[:-1]))
    line = key_line(path, ".".join(map(str, loc)))
    return f"  {where}: {msg}" + (f" (line {line})" if line is not None else "")


def _known_keys(schema: type, loc: list) -> list[str]:
    """The keys the grid schema takes in the mapping at ``loc`` (for suggesting one in place of an unknown key)."""
    kind: object = schema
    for part in loc:
        kind = annotation_at(kind, part)
    return sorted(kind.model_fields) if isinstance(kind, type) and issubclass(kind, BaseModel) else []


def read_datasets_file(path: Path) -> list[DatasetSpec]:
    """The entries of a ``--datasets`` file (``datasets: [{name, overrides, note, paper}, ...]``), validated
    as the grid's own; errors name the file, the entry and its line."""
    raw = read_yaml_mapping(path, what="datasets file")
    try:
        return DatasetsFile.model_validate(raw).datasets
    except ValidationError as err:
        raise ConfigError(f"{path}: invalid datasets file (a mapping with one key, datasets: a list of {{name, "
                          "overrides, note, paper})\n" + "\n".join(_describe(e, raw, path, DatasetsFile)
                                                                     for e in err.errors())) from None


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


def _apply(raw: dict, overrides: Overrides, *, origin: str, named: Named | None = None) -> None:
    """``key=value`` strings, or a mapping whose keys may be dotted (``model.encoder.layers: 2``); ``named``: a
    null removes a named entry (``config.named_entries``)."""
    if isinstance(overrides, list):
        for assignment in overrides:
            try:
                apply_override(raw, assignment, named=named)
            except ConfigError as err:
                raise ConfigError(f"{origin}: {err}") from None
        return
    for key, value in overrides.items():
        try:
            set_key(raw, str(key), value, merge=True, named=named)
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
    chain = load_chain(base_file(path, spec.base))  # kept: an invalid key is traced to the file that sets it
    base = merge_chain(chain, named=named_entries(chain_task(chain)))
    cells = []
    for dataset in spec.datasets or [None]:
        for variant in spec.variants:
            for seed in variant.seeds or spec.seeds:
                cells.append(_plan_cell(spec, base, path=path, root=root, dataset=dataset, variant=variant,
                                        seed=seed, cli=list(overrides), datasets_from=datasets_from, chain=chain))
    return Grid(path=path, spec=spec, runs_dir=root, cells=tuple(cells), cli_overrides=tuple(overrides),
                datasets_file=datasets_from)


def _sets(overrides: Overrides, key: str) -> bool:
    """Whether ``overrides`` (``k=v`` strings or a mapping of dotted keys) set ``key`` (``sets_key``)."""
    return sets_key(assigned_keys(overrides), key)


def _key_source(key: str, chain: list, layers: list[tuple[Overrides, str]]) -> str | None:
    """Where a cell's value of ``key`` came from, for a config error: the last override layer that sets it,
    else the recipe file of the base chain that does, with its line."""
    for overrides, where in reversed(layers):
        if _sets(overrides, key):
            return where
    found = key_origin(chain, key)
    if found is None:
        return None
    line = key_line(found, key)
    return f"set in {found}" + (f", line {line}" if line is not None else "")


def _plan_cell(spec: GridSpec, base: dict, *, path: Path, root: Path, dataset: DatasetSpec | None,
               variant: VariantSpec, seed: int, cli: list[str], datasets_from: Path | None = None,
               chain: list | None = None) -> Cell:
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
    for overrides, what in ((spec.set, "set:"), (cli, "--set")):
        alone: dict = {}  # what these overrides set, on their own
        _apply(alone, overrides, origin=f"{origin} ({what})")
        if "seed" in (alone.get("train") if isinstance(alone.get("train"), dict) else {}):
            # the cell's seed comes last and would replace it without a word
            raise ConfigError(f"{origin}: {what} train.seed: each cell's seed comes from the grid's seeds (or a "
                              "variant's), and --seed chooses among them; set them there")
    layers = [(dataset.overrides if dataset else [], "dataset"), (variant.overrides, "overrides"),
              (spec.set, "set"), (cli, "--set"), ([f"train.seed={seed}"], "seed")]
    for overrides, what in layers:
        _apply(raw, overrides, origin=f"{own} (overrides)" if own and what == "dataset" else f"{origin} ({what})",
               named=named_entries(raw.get("task")))
    described = {"dataset": f"from the overrides of dataset {dataset.name!r}" if dataset else "",
                 "overrides": f"from the overrides of variant {variant.name!r}", "set": "from the grid's set:",
                 "--set": "from --set", "seed": "from the cell's seed"}
    named = [(overrides, described[what]) for overrides, what in layers]
    config = validate(raw, source=f"{own} (base {spec.base}, variant {variant.name!r})" if own else
                      f"{origin} (base {spec.base})", origin=lambda key: _key_source(key, chain or [], named))
    check_buildable(config, source=f"{own or origin} (base {spec.base})")  # a cell that cannot train fails now
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
