"""Where prepared data lives, how an entry is named, and how it is built once and then reused.

The cache is machine state, not part of an experiment: ``$SANLAB_CACHE_DIR``, else
``$XDG_CACHE_HOME/sanlab`` (``~/.cache/sanlab``). It lies outside every run directory, so
``--overwrite`` never deletes it, and runs, resumed runs, grid cells and DDP processes on one machine
share it. An entry's name is a hash of everything its content depends on (``entry_key``); what a run
needs that is not there is built into a temporary directory and renamed into place, under a lock, so
concurrent runs build it once and a killed build leaves nothing that is read later.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from sanlab.errors import DataError

ENV = "SANLAB_CACHE_DIR"
# what writing into the cache's file system fails with (the disk, not the data): said as the cache's, by its path;
# a refusal only where it names a file in the cache (a worker pool's semaphore can be refused too)
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
_REFUSED = {errno.EACCES, errno.EPERM}


def cache_root() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sanlab"


def entry_key(what: dict) -> str:
    """A short stable name for the JSON-serialisable description of an entry's inputs."""
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]


def unwritable(problem: str, where: Path) -> DataError:
    """The error for a cache directory that cannot take what is written into it (full, read-only, not ours)."""
    return DataError(f"cannot write to the data cache: {problem} (set {ENV} to use another cache directory)",
                     path=str(where))


@contextlib.contextmanager
def locked(handle: IO) -> Iterator[None]:
    """An exclusive ``flock`` on the open file ``handle`` for the block; the kernel drops it when the process dies."""
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(final: Path, *, check: Callable[[Path], object], build: Callable[[Path], None],
               log: Callable[[str], None]) -> object:
    """``check(final)`` if it passes, else ``build`` a fresh temporary directory, rename it to ``final``
    and return ``check(final)``, all under a lock on ``final``'s ``.lock`` file. ``check`` raises DataError for an
    entry it does not trust (a corrupt or incomplete one is moved aside and rebuilt, saying so)."""
    lock = final.with_name(final.name + ".lock")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        handle = open(lock, "a")
    except OSError as err:
        if err.errno not in _FULL | _REFUSED:
            raise
        return _read_only(final, check=check, err=err)
    with handle, locked(handle):
        if final.exists():
            try:
                return check(final)
            except DataError as problem:
                log(f"cached data not usable, rebuilding it: {problem}")
                shutil.rmtree(final)
        for stale in final.parent.glob(f".{final.name}.*.tmp"):  # a killed build's; nobody else holds the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            build(tmp)
            os.replace(tmp, final)
        except OSError as err:
            in_cache = isinstance(err.filename, str) and Path(os.path.abspath(err.filename)).is_relative_to(
                os.path.abspath(final.parent))
            if not (err.errno in _FULL or err.errno in _REFUSED and in_cache):
                raise
            raise unwritable(err.strerror or str(err), final.parent) from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return check(final)


def _read_only(final: Path, *, check: Callable[[Path], object], err: OSError) -> object:
    """``build_once`` in a cache this process cannot write (a shared copy made read-only, say): its entry is used
    as it is where it passes ``check``, without the lock (nobody here can change it); else the cache's error."""
    if not final.exists():
        raise unwritable(err.strerror or str(err), final.parent) from None
    try:
        return check(final)
    except DataError as problem:
        raise unwritable(f"{err.strerror or err}, and its entry is not usable ({problem.problem})",
                         final.parent) from None
