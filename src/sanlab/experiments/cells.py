"""One cell of a comparison grid: train it, evaluate it, and read back what it produced.

Training is ``runs.train_run`` (which resumes a run directory by itself); when it returns, the
cell writes ``done.json`` (summary, parameter count, threads, the resolved config). Evaluation
writes ``compare-eval.json`` plus the per-sentence evidence the significance test needs: the
hypothesis file of ``runs.evaluate_run`` for translation, and ``tags-<checkpoint>-<split>.jsonl.gz``
(words, gold and predicted tags per sentence; gzip because grids commit it) for tagging.
"""

from __future__ import annotations

import functools
import os
import platform
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from sanlab.data.subword import SubwordModel
from sanlab.errors import ConfigError, SanlabError
from sanlab.experiments.grid import synthetic_task
from sanlab.experiments.grid_schema import Cell, EvalSpec, Grid
from sanlab.experiments.grid_state import (
    DONE_FILE, EVAL_FILE, FAILED_FILE, STALE_GROUPS, CellState, cell_state, config_dict, data_digests, eval_key,
    evidence_intact, file_digest, latest_step, read_done, scores_digest, split_files,
)
from sanlab.files import read_json, write_json
from sanlab.invocation import print_library_warnings
from sanlab.models.builders import count_parameters
from sanlab.runs import (ALLOW_CHANGED_DATA_ENV, GRID_JOBS_ENV, average_run, evaluate_run, git_revision,
                         load_run_config, load_trained, refuse_changed_scored_files, run_lock, train_run)
from sanlab.tasks.base import CellRun, task_for
from sanlab.tasks.tagging_task import read_tagged  # noqa: F401  (re-exported)
from sanlab.training.launch import die_with_parent
from sanlab.training.layout import RunLayout
from sanlab.training.logging import read_metrics
from sanlab.training.rundir import RunBusy
from sanlab.training.stop_after import StopAfter



def check_synthetic(grid: Grid) -> bool:
    """True if the grid's synthetic corpus is in ``<runs_dir>/data``; an error if another one is there
    (its cells were trained on other data: --dry-run and --table-only check this too)."""
    spec = grid.spec.synthetic
    data = grid.runs_dir / "data"
    stamp = data / "synthetic.json"
    if spec is None or not stamp.exists():
        return False
    if read_json(stamp) != spec.model_dump():
        raise ConfigError(f"{grid.path}: {data} holds a synthetic corpus made with {read_json(stamp)}, "
                          f"the grid now asks for {spec.model_dump()}; delete {data} or choose another runs_dir")
    return True


def prepare_synthetic(grid: Grid) -> None:
    """Write the grid's synthetic corpus into ``<runs_dir>/data`` unless it is already there. It is generated
    aside first: a file already there that differs from the grid's own (a user's ``train.src``, with
    ``runs_dir: .``) is an error, never written over; the same file (a start killed before ``synthetic.json``)
    is fine."""
    import filecmp
    import tempfile

    spec = grid.spec.synthetic
    if spec is None or check_synthetic(grid):
        return
    data = grid.runs_dir / "data"
    stamp, wanted = data / "synthetic.json", spec.model_dump()
    task = synthetic_task(spec, origin=grid.path)
    data.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data, prefix=".synthetic-", suffix=".tmp") as tmp:
        fresh = Path(tmp)
        task.write_synthetic(fresh, seed=spec.seed, sizes={s: spec.sizes[s] for s in task.synthetic_splits})
        for f in sorted(fresh.iterdir()):  # every file checked before any is moved in
            if (data / f.name).exists() and not filecmp.cmp(data / f.name, f, shallow=False):
                raise ConfigError(f"{grid.path}: {data / f.name}: exists and is not the grid's synthetic corpus; "
                                  "refusing to replace it: move it away, or choose another runs_dir")
        for f in fresh.iterdir():
            os.replace(f, data / f.name)
    write_json(stamp, wanted)


# ----------------------------------------------------------------------------- training
def run_parameters(run_dir: Path) -> int:
    """Trainable parameters of a run's model (built from its vocabularies, weights not loaded)."""
    config = load_run_config(run_dir)
    model, _ = task_for(config).load_model(config, run_dir)
    return count_parameters(model)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine() -> str:
    return (f"{platform.system()} {platform.machine()}, {cores()} cores, torch {torch.__version__}, "
            f"python {platform.python_version()}")


def vocabulary_digest(run_dir: Path) -> str | None:
    """``SubwordModel.digest`` of the run's subword model (source+target when they are two), or None for a run
    without one (tagging)."""
    layout = RunLayout(run_dir)
    for joint in (True, False):
        models = layout.subword_models(joint=joint)
        if all(m.is_file() for m in models):
            return "+".join(SubwordModel.load(m).digest() for m in models)
    return None


@dataclass(frozen=True)
class Vocabulary:
    """Which subword vocabulary a translation cell trained with: the SentencePiece version that trained it (from
    ``meta.json``) and, for cells finished since it is recorded, its digest (``done.json``). The same settings
    give the same vocabulary only under the same version, so cells of other versions differ even where no
    digest was recorded."""

    sentencepiece: str | None
    digest: str | None = None

    def differs(self, other: Vocabulary) -> bool:
        if self.digest and other.digest:
            return self.digest != other.digest
        return self.sentencepiece != other.sentencepiece

    def __str__(self) -> str:
        return f"sentencepiece {self.sentencepiece or '?'}" + (f", vocabulary {self.digest}" if self.digest else "")


def cell_vocabulary(run_dir: Path, done: dict) -> Vocabulary | None:
    """The cell's ``Vocabulary``, or None where it has no subword model (a task without one)."""
    if not ((done.get("config") or {}).get("data") or {}).get("subword"):
        return None
    try:
        meta = read_json(RunLayout(run_dir).meta) or {}
    except ConfigError:  # provenance only: a damaged file must not stop the table
        meta = {}
    return Vocabulary((meta.get("versions") or {}).get("sentencepiece"), done.get("vocabulary"))


class FinishedMeanwhile(ConfigError):
    """A cell another ``sanlab compare`` finished between this one's look at it and its lock."""


def train_cell(cell: Cell, *, quiet: bool, jobs: int = 1, spec: EvalSpec | None = None,
               stop_after: StopAfter | None = None) -> dict:
    """Train (or resume) the cell; ``done.json`` records how: its speed is comparable only with cells
    trained as many side by side (``jobs``), with as many threads, on the same machine. With the grid's ``spec``,
    a cell that is no longer pending or training once its lock is taken (another ``sanlab compare`` on the grid
    finished it meanwhile) is a ``FinishedMeanwhile``, and nothing of it is touched: never trained twice. A cell
    that ``stop_after`` cut has no ``done.json``: the returned dict then says only where it ``stopped``."""
    done = {}

    def still_to_train() -> None:  # holding the run's lock
        state = cell_state(cell, spec) if spec is not None else None
        if state is not None and state.status not in ("pending", "training"):
            raise FinishedMeanwhile(f"{cell.run_dir}: {state.describe()} by another process meanwhile; not trained "
                                    "again")

    def record(summary: dict) -> None:  # still holding the run's lock: never finished without done.json
        done.update(summary=summary, finished_at=time.time(), params=run_parameters(cell.run_dir),
                    threads=torch.get_num_threads(), jobs=jobs, machine=machine(), config=config_dict(cell.config),
                    vocabulary=vocabulary_digest(cell.run_dir))
        write_json(cell.layout.done, done)

    summary = train_run(cell.config, cell.run_dir, quiet=quiet,
                        allow_changed_data=os.environ.get(ALLOW_CHANGED_DATA_ENV) == "1", on_finished=record,
                        before_start=still_to_train, stop_after=stop_after)
    if summary.get("stopped_after") is not None:
        return {"stopped": f"stopped at {summary['stopped_at']} by --stop-after {summary['stopped_after']}; resumable"}
    return done


def speed_conditions(run_dir: Path, done: dict) -> str:
    """``"2 jobs x 1 thread"``: how many cells trained side by side, with how many torch threads each, followed
    by the device, precision, compilation and deterministic algorithms where they are not the CPU, fp32, eager
    and off (``"1 job x 1 thread, cuda (NVIDIA H100), bf16, compiled"``); ``"mixed (...)"`` when the run's training
    sessions (``meta.json``) differ, since its speed is an average over all of them. Sessions recorded before
    ``jobs`` was take it from their command line; before device and precision were, the CPU and the
    precision the run finished with."""
    try:
        meta = read_json(RunLayout(run_dir).meta) or {}
    except ConfigError:  # provenance only: a damaged file must not stop the table
        return "unknown (meta.json unreadable)"
    train = (done.get("config") or {}).get("train") or {}
    named = str(train.get("device", "cpu"))  # "auto" stays the CPU: no GPU run predates these records
    defaults = {"device": named if named.startswith("cuda") else "cpu",
                "precision": train.get("precision", "bf16" if train.get("bf16") else "fp32"),
                "compile": train.get("compile", False),
                "deterministic": False}  # recorded by every session since the key exists: none before it was
    sessions = meta.get("sessions") or []
    last_session = {**defaults, **{k: sessions[-1][k] for k in defaults if sessions and k in sessions[-1]}}
    last = (done.get("jobs", _jobs_in(meta.get("command"))), done.get("threads", "?"), _where(last_session))
    if not sessions:  # runs created before sessions were recorded: the first command and the last session
        # (their meta.json "threads" was read before train.threads applied, so the last session's stand in)
        seen = [(_jobs_in(meta.get("command")), *last[1:]) if meta.get("command") else last, last]
    else:
        seen = [(s.get("jobs", _jobs_in(s.get("command"))), s.get("threads", "?"), _where({**defaults, **s}))
                for s in sessions[:-1]] + [last]
        if sessions[0].get("from_step"):  # created before sessions were recorded: its first command counts too
            seen.insert(0, (_jobs_in(meta.get("command")), sessions[0].get("threads", "?"), _where(defaults)))
    distinct = list(dict.fromkeys(seen))
    text = [f"{j} job{'s' if j != 1 else ''} x {t} thread{'s' if t != 1 else ''}{where}" for j, t, where in distinct]
    return text[0] if len(text) == 1 else f"mixed ({'; '.join(text)})"


def _where(session: dict) -> str:
    """``", cuda (NVIDIA H100), bf16, compiled"``: a session's device, precision, compilation and deterministic
    algorithms, each only where it is not the CPU default (so CPU fp32 eager conditions read as they always have)."""
    extra = [session["device"]] if session["device"] != "cpu" else []
    extra += [session["precision"]] if session["precision"] != "fp32" else []
    extra += ["compiled"] if session["compile"] else []
    extra += ["deterministic"] if session["deterministic"] else []
    return "".join(f", {x}" for x in extra)


def _jobs_in(argv: list[str] | None) -> int:
    """The ``--jobs`` of a recorded command line (1 without it: one cell at a time)."""
    argv = argv or []
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--jobs"]
    values += [a.split("=", 1)[1] for a in argv if a.startswith("--jobs=")]
    return int(values[-1]) if values and values[-1].isdigit() else 1


# ----------------------------------------------------------------------------- evaluation
def evaluate_cell(cell: Cell, spec: EvalSpec) -> dict:
    """Score the cell on its split with the grid's checkpoint choice; keep per-sentence evidence."""
    done = read_done(cell)
    if spec.average_last:
        average_run(cell.run_dir, last=spec.average_last)
    scores, evidence, extra = score_cell(cell, checkpoint=spec.checkpoint)
    return _write_record(cell, spec, done=done, scores=scores, evidence=evidence, extra=extra)


def score_cell(cell: Cell, *, checkpoint: str) -> tuple[dict, str, dict]:
    """(scores, per-sentence evidence file, extra record keys) of the cell's split: its task scores it
    (``Task.evaluate_cell``), on the device it trained on."""
    device = cell.config.train.device
    run = CellRun(cell.run_dir, cell.config, cell.split, checkpoint,
                  evaluate=functools.partial(evaluate_run, cell.run_dir, checkpoint=checkpoint, device=device),
                  load=functools.partial(load_trained, cell.run_dir, checkpoint=checkpoint, device=device))
    return cell.kind.evaluate_cell(run)


def _write_record(cell: Cell, spec: EvalSpec, *, done: dict, scores: dict, evidence: str, extra: dict) -> dict:
    record = {"key": eval_key(cell, spec), "trained_at": done["finished_at"], "evaluated_at": time.time(),
              "scores": scores, **extra, "evidence": evidence,
              "evidence_sha256": file_digest(cell.run_dir / evidence), "data_sha256": data_digests(cell),
              # provenance only, not in the key: which code scored it (meta.json says which code trained it)
              "git_revision": git_revision()}
    record["scores_sha256"] = scores_digest(record)
    write_json(cell.layout.compare_eval, record)
    return record


def rescore_tagging_cell(cell: Cell, spec: EvalSpec) -> tuple[dict, dict]:
    """Score an evaluated tagging cell again from its predictions file (``tags-*.jsonl.gz``), without the
    model: the word groups of ``evaluation.tagging`` from the training data, the vocabulary from the run's
    ``tagger-vocab.json`` or, where the directory does not keep it (committed cells), built again from the
    config as training built it. Returns (old scores, new scores); rewrites ``compare-eval.json``.

    Refuses (ConfigError) a cell whose predictions are not the ones its record scored, were made with
    another checkpoint or split than the grid asks for, or on other sentences than the split's file now
    holds, and one whose rebuilt vocabulary does not give the OOV count recorded under the old definition;
    (DataError) one whose training data changed since it trained (the word groups and the vocabulary come from
    it).
    """
    from sanlab.data.conllu_io import read_conllu
    from sanlab.evaluation.tagging import tagging_accuracy
    from sanlab.tasks.tagging import run_vocab, training_word_tags

    run = cell.run_dir
    done, record = read_done(cell), read_json(cell.layout.compare_eval)
    cell.kind.require("rescore", run, what="cell", spelt="sanlab compare --rescore")
    if not done or not record:
        raise ConfigError(f"{run}: not evaluated yet ({DONE_FILE} or {EVAL_FILE} missing): nothing to re-score; "
                          "run the grid to train and score it")
    key, old_key = eval_key(cell, spec), dict(record.get("key") or {})
    if {**old_key, "word_groups": key["word_groups"]} != key or record.get("trained_at") != done["finished_at"]:
        raise ConfigError(f"{run}: {EVAL_FILE} scored another checkpoint or split ({old_key}) or an earlier "
                          f"training than the grid asks for ({key}): evaluate it with the model instead")
    if not evidence_intact(run, record):
        raise ConfigError(f"{run}: {record.get('evidence')} is missing or not the file {EVAL_FILE} scored "
                          "(sha256 differs): its predictions cannot be trusted")
    words, gold, pred = read_tagged(run / record["evidence"])
    config, d = cell.config, cell.config.data
    sents = read_conllu(d.test if cell.split == "test" else d.dev, column=d.column)
    if [list(s.words) for s in sents] != words or [list(s.tags) for s in sents] != gold:
        raise ConfigError(f"{run}: {record['evidence']} holds other sentences than {split_files(cell)[0]} "
                          "(words or gold tags differ): the test file changed since the cell was scored")
    # every fingerprinted training file, as a resume checks them: the word groups come from data.train, a
    # vocabulary built again (no tagger-vocab.json) from train (and dev and test under vocab_from_all_splits)
    refuse_changed_scored_files(cell.run_dir, config, files=task_for(config).training_files(config))
    # only a cell the grid counts as its own: one trained with other settings (a conflict, or a --set that
    # changes what it trained on) would be scored with another config's word groups and written into the cell
    state = cell_state(cell, spec)
    if not (state.status == "evaluated" or (state.status == "trained" and state.detail.startswith(STALE_GROUPS))):
        raise ConfigError(f"{run}: {state.describe()}: only a cell this grid evaluated is scored again; "
                          "nothing written")
    vocab = run_vocab(config, run)
    old = record["scores"]
    if "word_groups" not in old_key and "n_oov" in old:  # the old OOV: words outside the vocabulary
        outside = sum(not vocab.in_vocab(w) for sentence in words for w in sentence)
        if outside != old["n_oov"]:
            raise ConfigError(f"{run}: the vocabulary built again from the config leaves {outside} test tokens "
                              f"out, but {EVAL_FILE} counted {old['n_oov']} OOV tokens with the one training "
                              "built: it is not the run's vocabulary")
    scores = tagging_accuracy(gold=gold, pred=pred, words=words, in_vocab=vocab.in_vocab,
                              train_word_tags=training_word_tags(config))
    if not _same(scores.all, old.get("all")):
        raise ConfigError(f"{run}: All accuracy from {record['evidence']} is {scores.all}, {EVAL_FILE} says "
                          f"{old.get('all')}")
    new = scores.record()
    if old_key == key and new == old:  # nothing to change: the record (and when it was first re-scored) stays
        return old, new
    # ``previous``: the scores the cell had before its first re-scoring, which a later one keeps
    first = (record.get("rescored") or {}).get("previous", old)
    _write_record(cell, spec, done=done, scores=new, evidence=record["evidence"],
                  extra={"signature": record.get("signature"), "rescored": {"at": time.time(), "previous": first}})
    return old, new


def _same(a: float | None, b: float | None) -> bool:
    return a is None and b is None or (a is not None and b is not None and abs(a - b) < 1e-9)


# ----------------------------------------------------------------------------- one cell, start to end
@dataclass(frozen=True)
class CellOutcome:
    cell: Cell
    trained: bool          # trained (or resumed) in this invocation
    evaluated: bool        # evaluated in this invocation
    seconds: float
    error: str | None = None
    # --stop-after's limit left it resumable: where it stopped, or what it was not brought to (the cell's whole
    # status in words: ``running.outcome_line`` shows it alone)
    stopped: str | None = None


def run_cell(cell: Cell, spec: EvalSpec, *, quiet: bool, jobs: int = 1,
             stop_after: StopAfter | None = None) -> CellOutcome:
    """Bring one cell to ``evaluated``: train or resume it if needed, then evaluate it if needed.

    Errors are returned, not raised, so one failing cell does not stop the rest of the grid. ``stop_after``
    (``sanlab compare --stop-after``): a cell is not begun, trained on or evaluated once the limit has passed, and
    its training stops at it (``train_run``); it is then left resumable, ``CellOutcome.stopped`` says where.
    """
    start, trained, evaluated = time.monotonic(), False, False
    try:
        state = cell_state(cell, spec)
        if state.status == "conflict":  # said whatever the limit: it is not "not begun", it cannot begin
            return refused(cell, state, time.monotonic() - start)
        if stop_after is not None and stop_after.reached():
            return CellOutcome(cell, False, False, 0.0, stopped=_left_by(state, stop_after))
        if state.status == "trained" and state.detail.startswith(STALE_GROUPS) and state.step is not None and \
                latest_step(cell.run_dir) is None:  # committed: no model to score it with, its predictions will do
            return CellOutcome(cell, False, False, time.monotonic() - start, f"ConfigError: {cell.run_dir}: "
                               f"{state.detail} (its checkpoints are not here)")
        if state.status in ("pending", "training"):
            try:
                done = train_cell(cell, quiet=quiet, jobs=jobs, spec=spec, stop_after=stop_after)
                trained = True
            except FinishedMeanwhile:  # the other invocation finished it, and scores it: nothing to do here
                return CellOutcome(cell, False, False, time.monotonic() - start)
            if "stopped" in done:  # cut by the limit, resumable: neither failed nor finished
                cell.layout.failed.unlink(missing_ok=True)
                return CellOutcome(cell, True, False, time.monotonic() - start, stopped=done["stopped"])
        if stop_after is not None and stop_after.reached() and (trained or state.status == "trained"):
            return CellOutcome(cell, trained, False, time.monotonic() - start,  # scored by the next invocation
                               stopped=f"{TRAINED_NOT_EVALUATED}: past --stop-after {stop_after.text}")
        if trained or state.status == "trained":
            with run_lock(cell.run_dir):  # another `sanlab compare` on the grid may reach the same cell
                if cell_state(cell, spec).status == "trained":  # it may have scored it meanwhile
                    evaluate_cell(cell, spec)
                    evaluated = True
    except KeyboardInterrupt:
        raise
    except RunBusy as err:  # another process trains or scores it: reported, but its failed.json is not ours to write
        return CellOutcome(cell, trained, evaluated, time.monotonic() - start, f"ConfigError: {err}")
    except Exception as err:  # noqa: BLE001  (reported per cell; the grid goes on)
        # the user's errors (config, data, a NaN loss) say what and where; a bug gets its traceback
        detail = "" if isinstance(err, SanlabError) else "\n" + traceback.format_exc(limit=3)
        outcome = CellOutcome(cell, trained, evaluated, time.monotonic() - start, f"{type(err).__name__}: {err}{detail}")
        record_failure(outcome)
        return outcome
    cell.layout.failed.unlink(missing_ok=True)
    return CellOutcome(cell, trained, evaluated, time.monotonic() - start)


TRAINED_NOT_EVALUATED = "trained, not evaluated"


def refused(cell: Cell, state: CellState, seconds: float = 0.0) -> CellOutcome:
    """The outcome of a cell in ``conflict``: a refusal, not a failure of the cell (nothing is written into it)."""
    return CellOutcome(cell, False, False, seconds,
                       f"ConfigError: {cell.run_dir}: {state.detail}" + (f"; {state.advice}" if state.advice else ""))


def _left_by(state: CellState, stop_after: StopAfter) -> str:
    """What a cell in ``state`` reached once the limit has passed is left as, in words: a trained one is not "not
    begun"."""
    what = {"trained": TRAINED_NOT_EVALUATED, "training": "not resumed"}.get(state.status, "not begun")
    return f"{what}: past --stop-after {stop_after.text}"


def record_failure(outcome: CellOutcome) -> None:
    """Keep a failed cell's error in its run directory (``failed.json``), so the table, which may be
    printed later with ``--table-only`` and is committed, says which cells failed and why."""
    outcome.cell.run_dir.mkdir(parents=True, exist_ok=True)  # a cell may fail before its run directory exists
    write_json(outcome.cell.layout.failed, {"error": outcome.error, "at": time.time()})


def read_failure(cell: Cell) -> str | None:
    """The first line of the error a cell last failed with, or None."""
    try:
        record = read_json(cell.layout.failed)
    except ConfigError as err:  # a damaged record must not stop the listing or the table
        return f"(unreadable {FAILED_FILE}: {err})"
    return (record.get("error") or "unknown error").splitlines()[0] if record else None


def init_worker(threads: int, jobs: int, parent: int) -> None:
    """Initializer of a ``--jobs`` worker process: its share of the machine's cores, and how many cells
    train side by side (recorded with each training session, see ``runs.record_session``); ``parent`` is
    the grid process's pid. Ctrl-C reaches the whole process group: the grid process alone answers it, and ends
    its workers (``running._stop_pool``), so none is caught by it mid-way through saving a checkpoint."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked while it started (``running._run_pool``): ignored from here on
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent)
    print_library_warnings()  # as the grid process's own lines (spawned: cli.main's handler is not here)
    torch.set_num_threads(threads)
    os.environ[GRID_JOBS_ENV] = str(jobs)


def run_cell_job(job: tuple[Cell, EvalSpec, bool, int, StopAfter | None]) -> CellOutcome:
    cell, spec, quiet, jobs, stop_after = job
    return run_cell(cell, spec, quiet=quiet, jobs=jobs, stop_after=stop_after)


# ----------------------------------------------------------------------------- reading results
@dataclass(frozen=True)
class CellResult:
    """What the table needs from one cell; ``scores`` and ``evidence`` are empty until it is evaluated.

    ``evidence`` is per sentence: hypotheses (translation) or per-token correctness (tagging).
    """

    variant: str
    seed: int
    params: int | None = None
    speed: dict[str, float] | None = None       # steps_per_s, tokens_per_s (last "speed" record)
    conditions: str | None = None               # how the speed was measured (``speed_conditions``)
    machine: str | None = None                  # where it was trained (recorded since done.json has it)
    vocabulary: Vocabulary | None = None        # its subword vocabulary (``cell_vocabulary``), translation only
    scores: dict[str, float | None] = field(default_factory=dict)  # keys of METRICS
    signature: str | None = None                # sacreBLEU's BLEU signature (translation)
    chrf_signature: str | None = None           # and chrF's (recorded since 2026-11-23)
    evidence: list | None = None
    scored_against: str | None = None           # digest of the gold side (tagging) or the reference file


def last_speed(run_dir: Path) -> dict[str, float] | None:
    """The run's last "speed" record: updates and target tokens per second of update time, whole run."""
    records = [r for r in read_metrics(run_dir) if r.get("split") == "speed"]
    return {k: records[-1][k] for k in ("steps_per_s", "tokens_per_s")} if records else None


def read_evidence(run_dir: Path, record: dict, task) -> tuple[list, str | None]:
    """(per-sentence evidence, digest of what it was scored against). Translation: the hypotheses (the
    references are checked by the caller); tagging: per-token correctness, and a digest of the words
    and gold tags, so that two cells scored on different test files are never paired."""
    return task.read_evidence(Path(run_dir) / record["evidence"])


def read_result(cell: Cell, spec: EvalSpec) -> CellResult | None:
    """The cell's result if it finished training (scores only if evaluated as the grid asks)."""
    state = cell_state(cell, spec)
    if state.status not in ("trained", "evaluated"):
        return None
    done = read_done(cell)
    try:
        speed = last_speed(cell.run_dir)
        conditions = speed_conditions(cell.run_dir, done)
    except ConfigError as err:  # a damaged metrics.jsonl line: the speed is lost (the table says why), not the scores
        speed, conditions = None, f"unknown (metrics.jsonl unreadable: {err})"
    result = CellResult(cell.variant, cell.seed, params=done.get("params"), speed=speed, conditions=conditions,
                        machine=done.get("machine"), vocabulary=cell_vocabulary(cell.run_dir, done))
    if state.status != "evaluated":
        return result
    record = read_json(cell.layout.compare_eval)
    evidence, scored_against = read_evidence(cell.run_dir, record, cell.kind)
    if scored_against is None:  # translation: the references it was scored against
        scored_against = reference_file(cell)
    return replace(result, scores=record["scores"], signature=record.get("signature"),
                   chrf_signature=record.get("chrf_signature"), evidence=evidence, scored_against=scored_against)


def reference_file(cell: Cell) -> str | None:
    """The target file of the cell's split (translation), which its hypotheses were scored against."""
    return cell.kind.reference_file(cell.config, cell.split)


def read_references(cell: Cell) -> list[str] | None:
    """What the cell's split is scored against when its evidence does not hold it (translation: the references)."""
    return cell.kind.references(cell.config, cell.split)
