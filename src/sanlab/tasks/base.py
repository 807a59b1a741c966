"""The ``Task`` interface: everything the run, evaluation and comparison machinery asks of a kind of task.

A task is registered by the name in its config's ``task:`` (``sanlab.config.TASKS``: sanlab's translation and
tagging, and the entry point group ``sanlab.tasks`` of installed packages); its config class names its
implementation, a ``Task`` subclass. ``task_for(config)`` gives the task of a config. Nothing outside a
task's own module asks which task a config is: ``runs/``, ``experiments/`` and the CLI call these methods.
``docs/tasks.md`` ("Adding a task") walks through a third task.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar

from sanlab.errors import ConfigError
from sanlab.registry import load_reference


class Task:
    """One kind of task. Subclasses set the class attributes and implement the methods that raise here."""

    name: ClassVar[str]
    metric: ClassVar[str]                  # the validation metric that picks the best checkpoint by default
    higher_is_better: ClassVar[bool] = True
    eval_metric: ClassVar[str]             # the primary score of an evaluation record (``eval-*.json``)
    # comparison tables: (column, key in the evaluation record) of each score, the first the primary one;
    # optional ones are columns only where some cell has a value
    metrics: ClassVar[tuple[tuple[str, str], ...]]
    optional_metrics: ClassVar[tuple[str, ...]] = ()
    significance_test: ClassVar[str] = "paired bootstrap over sentences"  # named in the table's legend
    legend: ClassVar[tuple[str, ...]] = ()  # the task's own lines in a table's legend
    # what the task can do beyond train / evaluate / average / compare: ``translate``, ``tag``, ``prepare``,
    # ``bleu-analysis`` (the analyses of hypotheses), ``params``; ``own_command`` applies a run to new input
    commands: ClassVar[frozenset[str]] = frozenset()
    own_command: ClassVar[str | None] = None
    synthetic_splits: ClassVar[tuple[str, ...]] = ("train", "dev", "test")
    decodes: ClassVar[bool] = False        # whether ``decode.*`` settings apply to its evaluation
    # what ``--precision`` its evaluation and own command run in (training.device.DECODE_PRECISIONS); a task
    # that lists more than fp32 takes ``precision=`` (a ``training.device.Precision``) in ``evaluate`` when
    # one other than fp32 is asked for, and applies it to its model's forward
    precisions: ClassVar[tuple[str, ...]] = ("fp32",)

    def supports(self, command: str) -> bool:
        return command in self.commands

    def require(self, command: str, where: object, *, what: str = "run", instead: str = "",
                spelt: str | None = None) -> None:
        """An error unless the task has ``command`` (``sanlab translate`` on a tagging run), naming the tasks
        that have it; ``instead``: what to do for this task (default: its own command, when ``command`` is
        another task's own command); ``spelt``: how the user typed it where that is not ``sanlab <command>``
        (``rescore`` is ``sanlab compare --rescore``), so the error names a command that exists."""
        if self.supports(command):
            return
        from sanlab.config import TASKS

        tasks = [task_named(n) for n in TASKS.references()]
        able = " or ".join(t.name for t in tasks if t.supports(command)) or "another"
        if not instead and self.own_command and any(t.own_command == command for t in tasks):
            instead = f"use `sanlab {self.own_command}`"
        raise ConfigError(f"{where} is a {self.name} {what}; `{spelt or f'sanlab {command}'}` needs a {able} {what}"
                          + (f" ({instead})" if instead else ""))

    def require_precision(self, precision: str, where: object) -> None:
        """An error unless the task's evaluation and own command can run in ``precision`` (``--precision``)."""
        if precision not in self.precisions:
            raise ConfigError(f"{where} is a {self.name} run; it decodes in {' or '.join(self.precisions)}, "
                              f"not {precision}")

    def best_metric(self, config) -> tuple[str, bool]:
        """(name, higher is better) of the validation metric that picks ``config``'s best checkpoints and that its
        early stopping counts: ``train.best_metric`` where set (one of its config class's ``best_metrics``), else
        the task's own ``metric``."""
        chosen = config.train.best_metric
        if chosen is None:
            return self.metric, self.higher_is_better
        return chosen, type(config).best_metrics[chosen]

    # ----------------------------------------------------------------- training
    def trainer(self, config, run_dir: Path, log, *, main: bool = True):
        """The training side (``training.loop.TrainTask``): data, model, loss, validation. ``main``: False in a
        distributed run's other processes, which read the files the main process wrote into ``run_dir`` when it
        started (``shared_files``) and write none. (A task without files of its own there may leave ``main``
        out of its signature: ``runs.build.make_task`` passes it only to a trainer that takes it.)"""
        raise NotImplementedError

    def shared_files(self, config, run_dir: Path) -> list[Path]:
        """The files the main process writes into ``run_dir`` when training starts (vocabularies) and the other
        processes of a distributed run read: before they read them, ``runs.train`` compares each process's copy
        with the main one's by sha256 (``training.shared_files``). None by default."""
        return []

    def check_buildable(self, config) -> None:
        """Build the model on the meta device: a ValueError for an impossible combination of settings."""

    def training_files(self, config) -> list[str]:
        """The files a run learns from or selects its checkpoints on (fingerprinted, ``runs.resume``)."""
        raise NotImplementedError

    def data_files(self, config) -> list[tuple[str, str]]:
        """(key, path) of every data file a config reads."""
        raise NotImplementedError

    def scored_against(self, config) -> list[str]:
        """Training files an evaluation's scores depend on (beyond the run's own files and the split scored):
        ``sanlab evaluate`` refuses one changed since the run trained on it. None by default."""
        return []

    # ----------------------------------------------------------------- trained runs
    def load_model(self, config, run_dir: Path) -> tuple[Any, Any]:
        """(model with untrained weights, assets such as vocabularies) of a run, without reading a corpus."""
        raise NotImplementedError

    def vocabulary(self, assets) -> str | None:
        """The digest of ``assets`` that its training task keeps in checkpoints as ``vocabulary``, so that weights
        of another vocabulary are refused (``checkpoint.check_vocabulary``); None: not checked."""
        return None

    def decode_settings(self, config, decode_overrides: dict | None) -> dict | None:
        """The settings ``evaluate`` with ``decode_overrides`` decodes with, as its records keep them (``decode``),
        known before decoding; None for a task that records none."""
        return None

    def evaluate(self, model, assets, config, *, run_dir: Path, checkpoint: str, splits: list[str] | None,
                 decode_overrides: dict | None) -> dict:
        """Scores of each held-out split (``sanlab evaluate``), writing what it scored into the run (by
        ``RunLayout``, its names carrying the precision). A task whose ``precisions`` go beyond fp32 also
        takes ``precision`` (a ``training.device.Precision``; fp32 when not given)."""
        raise NotImplementedError

    def summary(self, record: dict) -> str:
        """What ``sanlab evaluate`` prints of a split's record (default: its numbers)."""
        return "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step")

    def splits(self, config) -> list[str]:
        """The held-out splits a run can be scored on; the first test split is ``default_split``."""
        raise NotImplementedError

    def default_split(self, config) -> str:
        raise NotImplementedError

    def split_files(self, config, split: str) -> list[Path]:
        """The data files a split is scored on (recorded by digest with a comparison cell's evaluation)."""
        raise NotImplementedError

    # ----------------------------------------------------------------- comparison grids
    def eval_key(self, config) -> dict:
        """What an evaluation depends on besides the weights, checkpoint and split."""
        return {}

    def evaluate_cell(self, cell: CellRun) -> tuple[dict, str, dict]:
        """(scores, name of the per-sentence evidence file written into the run, extra record keys)."""
        raise NotImplementedError

    def read_evidence(self, path: Path) -> tuple[list, str | None]:
        """(per-sentence evidence, digest of what it was scored against, or None: ``references`` says)."""
        raise NotImplementedError

    def references(self, config, split: str) -> list[str] | None:
        """What the evidence of a split is scored against, when the evidence does not hold it."""
        return None

    def reference_file(self, config, split: str) -> str | None:
        return None

    def paired_test(self, baseline: list, system: list, references: list[str] | None, *, n_samples: int,
                    seed: int):
        """The significance test of one system against the baseline on the same test set."""
        raise NotImplementedError

    def seeds_test(self, baseline: list[list], system: list[list], references: list[str] | None, *,
                   n_samples: int, seed: int):
        """The two-level (seeds and sentences) bootstrap of two rows of several seeds each."""
        raise NotImplementedError

    def table_notes(self, results: dict, *, split: str | None) -> str | None:
        """A sentence under a comparison table (tagging: the sizes of the word groups), or None."""
        return None

    def attention_trace(self, model, assets, config, *, sentence: str, side: str, layer: int, target: str | None):
        """One layer's attention trace on ``sentence`` (``sanlab analyze attention``): a ``tasks.traces.LayerTrace``."""
        raise ConfigError(f"`sanlab analyze attention` has no trace for {self.name} runs")

    # ----------------------------------------------------------------- synthetic data
    def write_synthetic(self, data_dir: Path, *, seed: int, sizes: dict[str, int]) -> None:
        raise NotImplementedError(f"the {self.name} task has no synthetic corpus")

    def synthetic_data(self, data_dir: Path) -> dict:
        """The ``data:`` section pointing a config at the synthetic corpus in ``data_dir``."""
        raise NotImplementedError(f"the {self.name} task has no synthetic corpus")


@dataclass(frozen=True)
class CellRun:
    """A comparison cell to score (``Task.evaluate_cell``): its run, config, split and checkpoint choice, with
    ``runs.evaluate_run`` and ``runs.load_trained`` bound to them (``evaluate(splits=..., decode_overrides=...)``,
    ``load()`` -> (config, model, assets))."""

    run_dir: Path
    config: Any
    split: str
    checkpoint: str
    evaluate: Callable[..., dict]
    load: Callable[[], tuple]


@functools.lru_cache(maxsize=None)
def _implementation(reference: str) -> Task:
    try:
        cls = load_reference(reference)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"task implementation {reference}: cannot load it: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task implementation {reference}: not a sanlab.tasks.Task subclass")
    return cls()


def task_for(config) -> Task:
    """The task of a run config (its config class names the implementation)."""
    if not hasattr(type(config), "implementation"):  # (a dict as a YAML file holds it, from a notebook)
        raise TypeError(f"expected a validated sanlab config, got a {type(config).__name__}: make one with "
                        "sanlab.config.load_config(path, overrides) or validate(raw, source=...)")
    return _implementation(type(config).implementation)


def task_named(name: str) -> Task:
    """The task registered under ``name`` (e.g. a grid's ``synthetic.task``)."""
    from sanlab.config import TASKS

    return _implementation(TASKS.entry(name).config.implementation)
