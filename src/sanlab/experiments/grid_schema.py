"""The schema of a comparison grid file (``GridSpec`` and its variant, dataset, eval and synthetic entries; a
``--datasets`` file) and the planned grid it becomes: ``Grid``, its ``Cell`` s (one run directory each) and the
``slug`` that names their directories. ``sanlab.experiments.grid`` reads a grid file into these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sanlab.config import Config
from sanlab.tasks.base import Task, task_for
from sanlab.training.layout import RunLayout

Overrides = list[str] | dict[str, Any]


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

