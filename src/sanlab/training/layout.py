"""The layout of a run directory: the one place that names its files (``docs/training.md``, "The run directory").

Every module asks a ``RunLayout`` for a path instead of spelling a file name; ``training/rundir.py`` derives
from it what ``--overwrite`` may delete (``KNOWN_NAMES``, ``KNOWN_PATTERNS``). The files inside one checkpoint
directory (``model.safetensors``, ``state.pt``, ``meta.json``) are named in ``training/checkpoint.py``.

The names are those sanlab has always written, so run directories made by earlier versions (e.g. the
committed cells under ``results/compare/`` and ``tests/fixtures/rundir-v1``) resume and evaluate unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SUBWORD_SIDES = ("joint", "src", "tgt")  # one joint sentencepiece model, or a source and a target one


class _Named:
    """A file of the run directory with a fixed name: ``config = _Named("config.yaml")`` gives
    ``RunLayout(d).config == d / "config.yaml"``, and ``RunLayout.config.name == "config.yaml"``."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, layout: RunLayout | None, owner: type | None = None):
        return self if layout is None else layout.root / self.name


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory ``root``."""

    root: Path

    # ---------------------------------------------------------------- written by training
    config = _Named("config.yaml")          # the resolved config
    meta = _Named("meta.json")              # provenance, the run marker, the data fingerprint, the sessions
    metrics = _Named("metrics.jsonl")       # train, validation and speed records
    train_log = _Named("train.log")         # the console lines
    launch_log = _Named("launch.log")       # `train --nproc`: each failed launch's tracebacks, torchrun's account
    tensorboard = _Named("tensorboard")     # TensorBoard's event files (a directory)
    TENSORBOARD_EVENTS = "events.out.tfevents.*"  # how torch's SummaryWriter names them (its only files there)
    checkpoints = _Named("checkpoints")     # step-N/ checkpoints and latest.json (training/checkpoint.py)
    lock = _Named(".lock")                  # the run lock (training/rundir.py)
    tagger_vocab = _Named("tagger-vocab.json")  # a tagging run's words, characters and tags
    SUBWORD = "subword"                     # subword.model / .vocab, or subword-src.* and subword-tgt.*
    SUBWORD_SUFFIXES = (".vocab", ".model")  # in the order they are copied: the model marks them complete
    # ---------------------------------------------------------------- written by average, evaluate, compare
    averaged = _Named("averaged")           # `sanlab average`'s checkpoint directory
    done = _Named("done.json")              # `sanlab compare`: the cell finished training
    compare_eval = _Named("compare-eval.json")  # `sanlab compare`: the cell evaluated as its grid asks
    failed = _Named("failed.json")          # `sanlab compare`: the last error of a cell
    EVAL_RECORD = "eval-{checkpoint}.json"            # `sanlab evaluate`: the scores of each split
    HYPOTHESES = "hyp-{checkpoint}-{split}.txt"       # `sanlab evaluate` (translation): what was scored
    # `sanlab evaluate --precision bf16` writes beside the fp32 files, never over them: its checkpoint part
    # carries the precision (eval-best-bf16.json, hyp-best-bf16-test.txt); fp32 keeps the names above
    TAG_PREDICTIONS = "tags-{checkpoint}-{split}.jsonl.gz"  # `sanlab compare` (tagging): the evidence
    # temporary names of files and directories being written or replaced (files.replacing, the sentencepiece
    # staging, files.replace_directory)
    TEMPORARY = (".*.tmp", ".*.tmp.*", ".*.old")

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    # ---------------------------------------------------------------- checkpoints and subwords
    def checkpoint(self, name: str) -> Path:
        """A checkpoint of the run by its directory name (``step-00001000``)."""
        return self.checkpoints / name

    def name_in_run(self, path: str | Path) -> str | None:
        """``path`` relative to the run directory (``checkpoints/step-00001000``), or None for one outside it.
        ``checkpoints/`` may be a link to a directory of the run's elsewhere (another disk, docs/training.md): what
        lies there is the run's too, and named as in the run, not by where it lies. Likewise a ``step-N`` directly in
        it, or ``averaged``, that is a link to a directory elsewhere (moved to another disk and linked back) is named
        by the link. Any other path is named by what it resolves to (a link from outside to one of the run's is that
        one; a link in the run to a directory outside is outside)."""
        given = Path(path).absolute()
        if given.name not in ("", ".", ".."):
            as_given = given.parent.resolve() / given.name
            if as_given.parent == self.checkpoints.resolve() and re.fullmatch(r"step-\d+", given.name):
                return f"{self.checkpoints.name}/{given.name}"
            if as_given == self.root.resolve() / self.averaged.name:
                return self.averaged.name
        where = given.resolve()
        for root, inside in ((self.checkpoints.resolve(), Path(self.checkpoints.name)), (self.root.resolve(), Path())):
            if where == root or root in where.parents:
                return str(inside / where.relative_to(root))
        return None

    def subword_model(self, side: str = "joint") -> Path:
        """The sentencepiece model of ``side`` (``joint``, ``src`` or ``tgt``); its ``.vocab`` lies beside it."""
        return self.root / f"{_subword_stem(side)}.model"

    def subword_models(self, *, joint: bool) -> list[Path]:
        """The run's sentencepiece model(s): the joint one, or the source and the target one."""
        return [self.subword_model(side) for side in _sides(joint)]

    def subword_files(self, *, joint: bool) -> list[Path]:
        """Every subword file of the run, ``.vocab`` before ``.model`` of each (the model marks them complete)."""
        return [self.root / f"{_subword_stem(side)}{suffix}" for side in _sides(joint)
                for suffix in self.SUBWORD_SUFFIXES]

    def subword_stem(self, side: str) -> Path:
        """Where sentencepiece writes ``side``'s model: the path without ``.model`` / ``.vocab``."""
        return self.root / _subword_stem(side)

    # ---------------------------------------------------------------- evaluation
    def eval_record(self, checkpoint: str | Path, precision: str = "fp32") -> Path:
        """``sanlab evaluate``'s record of ``checkpoint`` (best, last, averaged, step-N or a directory) decoded
        in ``precision`` (fp32: ``eval-best.json``; bf16: ``eval-best-bf16.json``)."""
        return self.root / self.EVAL_RECORD.format(checkpoint=_evaluated(checkpoint, precision))

    def hypotheses(self, checkpoint: str | Path, split: str, precision: str = "fp32") -> Path:
        """The hypotheses ``sanlab evaluate`` scored (fp32: ``hyp-best-test.txt``; bf16: ``hyp-best-bf16-test.txt``)."""
        return self.root / self.HYPOTHESES.format(checkpoint=_evaluated(checkpoint, precision), split=split)

    def tag_predictions(self, checkpoint: str | Path, split: str) -> Path:
        return self.root / self.TAG_PREDICTIONS.format(checkpoint=Path(checkpoint).name, split=split)

    # ---------------------------------------------------------------- what sanlab writes
    @classmethod
    def named(cls) -> dict[str, str]:
        """attribute -> file name of every fixed name (``config`` -> ``config.yaml``)."""
        return {k: v.name for k, v in vars(cls).items() if isinstance(v, _Named)}

    @classmethod
    def known_names(cls) -> frozenset[str]:
        """Every fixed name sanlab writes into a run directory: training, ``evaluate``, ``average``, ``compare``."""
        subwords = {f"{_subword_stem(side)}{suffix}" for side in SUBWORD_SIDES for suffix in cls.SUBWORD_SUFFIXES}
        return frozenset({*cls.named().values(), *subwords})

    @classmethod
    def known_patterns(cls) -> tuple[str, ...]:
        """Shell patterns of the names sanlab writes that depend on a checkpoint or split, and temporary ones."""
        return (*(_wildcard(t) for t in (cls.EVAL_RECORD, cls.HYPOTHESES, cls.TAG_PREDICTIONS)), *cls.TEMPORARY)

    @classmethod
    def provenance_names(cls) -> tuple[str, str]:
        """The two files that make a directory a run (and that a user's recipe could be mistaken for)."""
        return cls.config.name, cls.meta.name


def _sides(joint: bool) -> list[str]:
    return ["joint"] if joint else ["src", "tgt"]


def _subword_stem(side: str) -> str:
    if side not in SUBWORD_SIDES:
        raise ValueError(f"subword side {side!r}: one of {SUBWORD_SIDES}")
    return RunLayout.SUBWORD if side == "joint" else f"{RunLayout.SUBWORD}-{side}"


def _evaluated(checkpoint: str | Path, precision: str) -> str:
    """The checkpoint part of an evaluation's file names: the checkpoint's name, with ``-<precision>`` unless
    fp32 (the names evaluations have always had)."""
    name = Path(checkpoint).name
    return name if precision == "fp32" else f"{name}-{precision}"


def _wildcard(template: str) -> str:
    """``hyp-{checkpoint}-{split}.txt`` -> ``hyp-*.txt``: what comes before the first field and after the last."""
    return template[:template.index("{")] + "*" + template[template.rindex("}") + 1:]
