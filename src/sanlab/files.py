"""Files written whole or not at all.

Every file sanlab writes for later reading (configs, evaluation records, hypotheses, tables) goes
to a temporary name beside its destination, is flushed to disk and renamed over it: a crash, a
full disk or a second process reading at the same moment sees the old file or the new one, never
half of one. (Checkpoint directories are renamed the same way, in ``training.checkpoint``.)
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO


def fsync(path: Path) -> None:
    """Flush a file or a directory entry list to disk (directories: POSIX only)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. directories on Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replacing_path(path: Path | str) -> Iterator[Path]:
    """A new temporary file beside ``path`` for a writer that wants a file name (``replacing`` opens it as a
    stream); it replaces ``path`` when the block ends without an error; on an error the destination is
    untouched and the temporary file removed.

    A symlink is followed (its target is replaced, the link stays). The temporary file has a unique name,
    so two processes writing the same file never share one.
    """
    path = Path(os.path.realpath(path))
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, _mode_for(path))  # mkstemp makes it 0600
        fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync(path.parent)


@contextmanager
def replacing(path: Path | str, *, compress: bool = False) -> Iterator[IO[str]]:
    """A text stream (UTF-8; gzip if ``compress``) whose content replaces ``path`` as ``replacing_path`` says.
    Gzip output carries no name or time in its header, so the same text gives the same bytes (committed
    evidence files)."""
    with replacing_path(path) as tmp, open(tmp, "wb") as raw:
        if compress:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed, \
                    io.TextIOWrapper(packed, encoding="utf-8") as stream:
                yield stream
        else:
            with io.TextIOWrapper(raw, encoding="utf-8") as stream:
                yield stream


def read_json(path: Path | str, *, remedy: str = "delete it to redo what wrote it") -> dict | None:
    """The JSON object in ``path`` (a file sanlab wrote), None if there is no such file; a damaged file is
    a ConfigError naming it and what to do (``remedy``)."""
    from sanlab.errors import ConfigError

    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:  # also when another process removed it just now
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid JSON ({err}); {remedy}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def replace_directory(tmp: Path, final: Path) -> None:
    """Move the finished directory ``tmp`` (flushed here) to ``final``. An older ``final`` is renamed aside
    first and deleted after, so ``final`` is never a mix of the two; only for the instant between the two
    renames is it absent (a crash there leaves the old one as ``.<name>.XXXX.old``). The aside name is a
    new one each time: ``final`` may be anywhere (``sanlab average --output``), and a fixed name could be
    someone's directory. A ``final`` that is a symbolic link (a checkpoint linked in from another disk) is
    set aside as a link and removed as one, never what it points to. A rename that fails leaves ``final`` as
    it was: the old one (or the link) is put back and the aside directory removed (``tmp`` stays, for the
    caller to remove)."""
    for f in (*tmp.iterdir(), tmp):
        fsync(f)
    old = _set_aside(final)
    try:
        os.replace(tmp, final)
    except OSError:
        if old is not None:
            with suppress(OSError):  # (if this fails too, the old one stays as .<name>.XXXX.old)
                os.replace(old, final)  # the old one back where it was
        raise
    fsync(final.parent)
    if old is not None and old.is_symlink():
        old.unlink()
    elif old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _set_aside(final: Path) -> Path | None:
    """Rename ``final`` to a new ``.<name>.XXXX.old`` beside it and return that; None where there is none."""
    if final.is_symlink():  # renamed itself, to a name that is not there (a link cannot replace the empty directory)
        old = final.with_name(f".{final.name}.{secrets.token_hex(4)}.old")
        while os.path.lexists(old):
            old = final.with_name(f".{final.name}.{secrets.token_hex(4)}.old")
        os.rename(final, old)
        return old
    if not final.exists():
        return None
    old = _new_beside(final, ".old")
    try:
        os.replace(final, old)  # (onto the empty directory mkdtemp made: allowed for directories)
    except OSError:
        os.rmdir(old)  # still the empty one mkdtemp made
        raise
    return old


def staging_directory(final: Path) -> Path:
    """A new, empty directory beside ``final`` to write its replacement in (``replace_directory``): a name
    of its own, so that nothing already there is emptied or written into. Its permissions are a new directory's
    under the umask (mkdtemp makes it 0700, which it would keep as ``final``)."""
    staging = _new_beside(final, ".tmp")
    os.chmod(staging, 0o777 & ~_umask())
    return staging


def _new_beside(final: Path, suffix: str) -> Path:
    """A new empty directory ``.<name>.XXXX<suffix>`` beside ``final`` (a temporary name, ``RunLayout.TEMPORARY``)."""
    return Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=suffix))


def _mode_for(path: Path) -> int:
    """The permissions of a file that replaces ``path``: the replaced file's, else what ``open`` would give a
    new file under this process's umask (read back by setting it: there is no other way)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return new_file_mode()


def new_file_mode() -> int:
    """What ``open`` gives a new file under this process's umask: for files a library writes with other
    permissions (safetensors writes 0600 whatever the umask)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """This process's umask: read from /proc where Linux has it (setting it to read it back is process-wide,
    and a thread creating a file meanwhile would get 0)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


def check_output_file(path: Path | str | None, *, flag: str = "--output",
                      inputs: tuple[Path | str | None, ...] = ()) -> None:
    """Fail before any work if ``path`` cannot be written as a file (None: standard output), or is one of the
    command's ``inputs`` (read whole first, it would be replaced by the output: lost)."""
    from sanlab.errors import ConfigError

    if path is None:
        return
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    parent = Path(path).parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: the directory {parent} does not exist")
    regular = os.path.isfile(path)  # (a terminal or /dev/null is written in place, never replaced)
    for source in inputs:
        if source is not None and regular and os.path.exists(source) and os.path.samefile(path, source):
            raise ConfigError(f"{flag} {path}: is the input file {source}, which the output would replace; "
                              "write the output to another file")


def check_report_file(path: Path | str | None, *, script: str, flag: str = "--output") -> None:
    """Refuse a report's output file that exists, is not empty and does not name ``script`` (every report of a
    bench or script carries the command line that made it): a typo must not replace a results or source file
    by a report. A later run's report replaces an earlier one; a terminal or a pipe is written in place."""
    from sanlab.errors import ConfigError

    if path is None or not os.path.isfile(path) or not os.path.getsize(path):
        return
    try:
        ours = script in Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise ConfigError(f"{flag} {path}: the file exists and is no report of {script} (it does not name the "
                          "script); not overwritten. Remove it or choose another file")


@contextmanager
def output_stream(path: Path | str | None) -> Iterator[IO[str]]:
    """``replacing(path)``, or standard output (flushed at the end) when ``path`` is None: a command's
    output file is complete or absent, never the first half of a run that failed. A name ending in ``.gz`` is
    written gzip-compressed, as such a name is read."""
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):  # /dev/null, a FIFO, /dev/fd/N
        with open(path, "w", encoding="utf-8") as stream:
            yield stream
        return
    with replacing(path, compress=Path(path).name.endswith(".gz")) as stream:
        yield stream


def write_text(path: Path | str, text: str) -> None:
    with replacing(path) as f:
        f.write(text)


def write_json(path: Path | str, data, *, indent: int | None = 2) -> None:
    write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def dangling_link(path: Path) -> str | None:
    """What is wrong with ``path`` if it is a symbolic link to nothing (a disk not mounted), in words that follow
    "<path> is ": "a symbolic link to T, which does not exist (mount the disk it is on, or remove the link)", naming
    the missing end of a chain of links, or a loop of links as one; None for anything else."""
    if not (os.path.islink(path) and not os.path.exists(path)):
        return None
    target = os.readlink(path)
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:  # (exists() is False for a loop too)
            return f"a symbolic link to {target}, and its links go round in a loop: point it at a directory"
    hop = os.path.join(os.path.dirname(path), target)
    where = f"{target} (a link on to {os.path.realpath(path)})" if os.path.islink(hop) else target
    return f"a symbolic link to {where}, which does not exist (mount the disk it is on, or remove the link)"
