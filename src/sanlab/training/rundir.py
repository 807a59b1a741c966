"""Which directories are sanlab runs, what sanlab may delete in them, and the lock of one run directory.

A run directory is one sanlab made: its ``meta.json`` carries ``RUN_MARKER`` from the moment the run is
created. Runs made before the marker existed (``config.yaml`` beside a ``meta.json`` with sanlab's
provenance keys, e.g. the committed cells under ``results/compare/``) count as runs too, so they resume
and evaluate as before. ``--overwrite`` deletes only files sanlab writes (``KNOWN_NAMES``,
``KNOWN_PATTERNS``, and inside ``checkpoints/``, ``averaged/`` and ``tensorboard/`` only what training,
``average`` and TensorBoard put there): a directory holding anything else is refused with the list of what
it holds, and so are the current directory, the directories above it and any directory with a ``.git``.
A symbolic link is deleted, never what it points to, but for ``checkpoints/`` linked to a directory of the run's
elsewhere: emptied there, as pruning does, the link kept (docs/training.md, "Symbolic links").
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.files import dangling_link, read_json
from sanlab.training.average import foreign_in_average
from sanlab.training.checkpoint import CHECKSUMMED, LATEST, META, check_checkpoints_link, is_step_name
from sanlab.training.layout import RunLayout

RUN_MARKER = "sanlab_run"  # meta.json key: the run directory's format version, written when sanlab creates it
RUN_FORMAT = 1
LOCK_FILE = RunLayout.lock.name

# Everything sanlab itself writes into a run directory (training, `evaluate`, `average` and `compare`): the
# fixed names, and the patterns of evaluation records, hypotheses, compare's tagging evidence and temporary files
KNOWN_NAMES = RunLayout.known_names()
KNOWN_PATTERNS = RunLayout.known_patterns()


def is_known(name: str) -> bool:
    return name in KNOWN_NAMES or any(fnmatch.fnmatchcase(name, p) for p in KNOWN_PATTERNS)


def _is_temporary(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in RunLayout.TEMPORARY)


def foreign_entries(run_dir: Path) -> list[str]:
    """What ``--overwrite`` would delete in ``run_dir`` that sanlab did not write, relative to it: names it does
    not write, and what sanlab's own directories hold besides its files (a user's notes in ``averaged/``, a
    copy ``checkpoints/step-00001000.bak``): they are deleted whole, so a known name is not enough."""
    run_dir, layout = Path(run_dir), RunLayout(run_dir)
    foreign = [n for n in entries(run_dir) if not is_known(n)]
    inside = ((layout.checkpoints, _foreign_in_checkpoints), (layout.averaged, foreign_in_average),
              (layout.tensorboard, _foreign_in_tensorboard))
    for directory, unknown in inside:
        # a link is deleted, not what it points to; but checkpoints/ linked elsewhere is emptied there (``empty_run``)
        if directory.is_dir() and (not directory.is_symlink() or directory == layout.checkpoints):
            foreign += [f"{directory.name}/{name}" for name in unknown(directory)]
    return sorted(foreign)


def _foreign_in_checkpoints(directory: Path) -> list[str]:
    """Besides ``step-N`` directories holding a checkpoint's files, ``latest.json`` and temporary names."""
    foreign = []
    for entry in sorted(directory.iterdir()):
        if is_step_name(entry.name) and entry.is_symlink():
            continue  # removed as a link, as pruning does: what it points to is left alone
        if is_step_name(entry.name) and entry.is_dir():
            foreign += [f"{entry.name}/{n}" for n in sorted(os.listdir(entry)) if n not in (*CHECKSUMMED, META)]
        elif entry.name != LATEST and not _is_temporary(entry.name):
            foreign.append(entry.name)
    return foreign


def _foreign_in_tensorboard(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not fnmatch.fnmatchcase(n, RunLayout.TENSORBOARD_EVENTS))


def entries(run_dir: Path) -> list[str]:
    """Names in ``run_dir`` (none if it does not exist), the lock left out: it is held while preparing."""
    run_dir = Path(run_dir)
    return sorted(e.name for e in run_dir.iterdir() if e.name != LOCK_FILE) if run_dir.is_dir() else []


def is_run(run_dir: Path) -> bool:
    """Whether sanlab made ``run_dir``: a marked ``meta.json``, or an older run's config and provenance."""
    try:
        meta = read_json(RunLayout(run_dir).meta)
    except ConfigError:  # a damaged meta.json proves nothing
        return False
    if meta is None:
        return False
    legacy = {"seed", "versions"} <= meta.keys() and RunLayout(run_dir).config.is_file()
    return RUN_MARKER in meta or legacy


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:8])
    return shown + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def check_location(run_dir: Path) -> None:
    """Refuse a run directory that is the current directory or above it, or a repository: a run's files
    would mix with the project's, and ``--overwrite`` would delete the project."""
    run_dir = Path(run_dir)
    dangling = dangling_link(run_dir)
    if dangling:  # (making it failed with a bare "File exists")
        raise ConfigError(f"--run {run_dir}: is {dangling}")
    where, here = run_dir.resolve(), Path.cwd().resolve()
    if where == here or where in here.parents:
        which = "the current directory" if where == here else f"a directory above the current one ({here})"
        raise ConfigError(f"--run {run_dir}: is {which}; a run needs a directory of its own, e.g. --run runs/NAME")
    if (where / ".git").exists():
        raise ConfigError(f"--run {run_dir}: holds .git (a repository); a run needs a directory of its own, "
                          "e.g. --run runs/NAME")


def check_new_run(run_dir: Path) -> None:
    """A new run goes into a new or empty directory, or one holding only what sanlab wrote (e.g. the log of
    a start that failed); never among a user's files. A ``config.yaml`` without a run's ``meta.json`` is a
    user's file too (a recipe), and must not be rewritten with the resolved config. So is a symbolic link,
    whatever its name: sanlab makes none, and training would write (or prune) through it, outside the run; but for
    ``checkpoints`` linked to an empty directory (a bigger disk): the run's checkpoints go there, by the user's
    choice."""
    checkpoints = RunLayout(run_dir).checkpoints
    unknown = [n for n in entries(run_dir) if not is_known(n) or n in RunLayout.provenance_names()
               or ((Path(run_dir) / n).is_symlink() and not (n == checkpoints.name and is_empty_directory(checkpoints)))]
    meta = RunLayout(run_dir).meta
    if meta.name in unknown:  # a run whose meta.json was damaged: say that, not "not a run directory"
        read_json(meta, remedy=f"sanlab cannot tell whether {run_dir} is its run (meta.json says so): restore the "
                               "file, or choose another --run directory")
    if unknown:
        raise ConfigError(f"{run_dir}: not a sanlab run directory and not empty (holds {_listed(unknown)}); "
                          "choose a new or empty --run directory")


def empty_run(run_dir: Path) -> None:
    """``--overwrite``: delete what sanlab wrote in ``run_dir``, after checking that it wrote all of it."""
    names = entries(run_dir)
    check_overwritable(run_dir)
    # config.yaml and meta.json last: interrupted, the directory is still a run that --overwrite will empty
    for name in sorted(names, key=lambda n: n in RunLayout.provenance_names()):
        path = Path(run_dir) / name
        if path == RunLayout(run_dir).checkpoints and path.is_symlink() and path.is_dir():
            for entry in path.iterdir():  # linked to a directory of its own elsewhere: emptied there, the link kept
                _delete(entry)
        else:
            _delete(path)


def is_empty_directory(path: Path) -> bool:
    """A directory (or a link to one) that holds nothing."""
    return path.is_dir() and next(path.iterdir(), None) is None


def check_overwritable(run_dir: Path) -> None:
    """That ``--overwrite`` may empty ``run_dir``: absent, empty, or a run holding only what sanlab wrote (so a
    command that will overwrite several runs can check them all before it writes anything)."""
    names = entries(run_dir)
    if not names:
        return
    check_checkpoints_link(run_dir)  # emptied, the link would go and the checkpoints be written into the run
    if not is_run(run_dir):
        raise ConfigError(f"{run_dir}: not a sanlab run directory (no meta.json of a run), refusing to delete what "
                          f"it holds ({_listed(names)}); --overwrite only replaces run directories: choose another "
                          "--run directory")
    unknown = foreign_entries(run_dir)
    if unknown:
        raise ConfigError(f"{run_dir}: holds files sanlab did not write ({_listed(unknown)}); --overwrite deletes "
                          "only a run's own files: move them away first, or choose another --run directory")


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def undo_start(run_dir: Path, *, before: list[str] | None) -> None:
    """Remove what a run's failed start added (config, meta, log, vocabularies): the directory is left as it
    was (``before``: its entries then; None: it did not exist, and goes again), not half made."""
    run_dir = Path(run_dir)
    added = [n for n in entries(run_dir) if n not in (before or []) and is_known(n)]
    for name in added:
        _delete(run_dir / name)
    if before is None and not entries(run_dir):
        RunLayout(run_dir).lock.unlink(missing_ok=True)  # ours: the directory did not exist before this command
        try:
            os.rmdir(run_dir)
        except OSError:  # something appeared meanwhile: leave it
            pass


class RunBusy(ConfigError):
    """The run directory's lock is held by another process (``run_lock``): nothing of the run was touched."""


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """One process at a time trains or evaluates a run directory (a second one would interleave checkpoints,
    logs or evaluation files); a second one gets a RunBusy (a ConfigError) naming the holder's pid.

    The lock is the operating system's (``flock`` on ``DIR/.lock``, Linux/BSD/macOS), held as long as the block runs:
    the kernel releases it when the process ends, however it ends, so a crashed run leaves no stale lock
    and nothing has to guess from a pid whether its holder is alive. The file stays (deleting it would let
    a third process lock a new file while the second still holds the old one); it names the last holder.
    """
    import fcntl

    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: is a file, not a run directory; choose another --run")
    blocking = next((p for p in run_dir.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:  # mkdir would fail with NotADirectoryError
        raise ConfigError(f"{run_dir}: {blocking} is a file, not a directory; choose another --run")
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(RunLayout(run_dir).lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunBusy(f"{run_dir} is being trained or evaluated by another process (pid {holder}); wait for "
                      "it or stop it first") from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # releases the lock


def check_not_a_run_file(path: Path | str | None, run_dir: Path, *, flag: str = "--output") -> None:
    """Refuse an output file that is one of the run's own (``tagger-vocab.json``, ``hyp-best-test.txt``, a file
    in ``checkpoints/``), or one of any other run's that holds it: a command writing there would replace what
    that run reads back. Other names inside a run directory are the user's to choose."""
    if path is None:
        return
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(run_dir))
    for owner in real.parents:  # (the run decoding, or another run the output was misdirected into)
        if owner != root and not is_run(owner):
            continue
        first = real.relative_to(owner).parts[0]
        if is_known(first) or first == LOCK_FILE:
            shown = run_dir if owner == root else owner
            raise ConfigError(f"{flag} {path}: {first} is the run's own ({shown}), which the output would replace; "
                              "write the output to another file")
