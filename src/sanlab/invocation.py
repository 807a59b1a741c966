"""The command line this process runs, for provenance (meta.json, table and analysis footers).

``sanlab.cli.main(argv)`` sets it for the length of the call, so a programmatic ``main([...])`` records
its own arguments, not the host process's ``sys.argv``. It lives in the environment (``SANLAB_COMMAND``,
internal) so that the worker processes of ``sanlab compare --jobs`` (spawned, not forked) inherit it; the
torchrun workers of ``sanlab train --nproc N`` inherit it and keep it, since the command to record is the
user's, not the relaunch. Without the CLI (a library call from a script) it is the script's ``sys.argv``.

Also how a command prints the library's warnings (``library_warnings``), in its own process and in the
worker processes of ``sanlab compare --jobs`` alike.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

COMMAND_ENV = "SANLAB_COMMAND"


@contextmanager
def environment_variable(name: str, value: str | None) -> Iterator[None]:
    """``name=value`` in this process's environment (and so in the processes it starts) within the block,
    restored after it; ``value`` None leaves the variable as it is."""
    previous = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def running(argv: Sequence[str]):
    """Within this block, ``command()`` is ``["sanlab", *argv]``, or in a data-parallel worker of a sanlab
    command (``WORLD_SIZE`` set, command inherited), that command."""
    inherited = COMMAND_ENV in os.environ and "WORLD_SIZE" in os.environ
    return environment_variable(COMMAND_ENV, None if inherited else json.dumps(["sanlab", *argv]))


def command() -> list[str]:
    """argv of this process's command: the CLI's (``running``), else ``sys.argv``."""
    try:
        argv = json.loads(os.environ.get(COMMAND_ENV) or "null")
    except json.JSONDecodeError:
        argv = None
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        return argv
    return list(sys.argv)


def command_line(argv: Sequence[str] | None = None) -> str:
    """``argv`` (default: ``command()``) as one shell line; a path to the ``sanlab`` script is shortened
    to ``sanlab``."""
    argv = list(command() if argv is None else argv)
    if not argv:
        return ""
    program = "sanlab" if Path(argv[0]).name == "sanlab" else argv[0]
    return shlex.join([program, *argv[1:]])


class _ConsoleWarnings(logging.Handler):
    """The library's warnings (logged under ``sanlab``) as the command's own: "WARNING: ..." on stderr, unless
    another handler on the record's way (a caller's ``logging.basicConfig``) is known to write it to stderr."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not _shown_on_stderr_by_another(record, self):
                print(f"{record.levelname}: {record.getMessage()}", file=sys.stderr)  # (the sys.stderr of the moment)
        except Exception:
            self.handleError(record)


def _shown_on_stderr_by_another(record: logging.LogRecord, own: logging.Handler) -> bool:
    """Whether a handler other than ``own`` is known to write ``record`` to stderr: one of the handlers
    ``Logger.callHandlers`` hands it to (the record's logger's, then its ancestors' while they propagate) that is a
    plain stream handler on stderr whose level takes it (a caller's handler for errors only leaves a warning to us).
    Decided by type, stream and level only: a handler's filters are never asked, since a stateful one ("log once")
    would spend its pass on the question and then refuse the record; a handler with filters is not known to show
    it, so we print it (a possible duplicate beats a lost warning)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        for handler in logger.handlers:
            if (handler is not own and type(handler) is logging.StreamHandler and not handler.filters
                    and _is_stderr(handler.stream) and record.levelno >= handler.level):
                return True
        logger = logger.parent if logger.propagate else None
    return False


def _is_stderr(stream: object) -> bool:
    """``stream`` is this moment's ``sys.stderr``, or another file object on its descriptor (a handler made with
    ``sys.__stderr__`` while ``sys.stderr`` is a wrapper of descriptor 2)."""
    if stream is sys.stderr:
        return True
    try:
        return stream.fileno() == sys.stderr.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # (no descriptor: a StringIO, a capture, a closed file)
        return False


def print_library_warnings() -> Callable[[], None]:
    """From now on what the library logs at WARNING or above is shown on stderr: printed as "WARNING: ..."
    (without it Python's last resort prints the bare message), unless a handler on the record's way is known to write
    it to stderr (a Python caller's ``logging.basicConfig``: the caller's format, not a second line; any other kind
    of handler on stderr may show it twice, see ``_shown_on_stderr_by_another``). The records
    still propagate, so a caller's handlers (a file log, caplog) get every one. Returns the undo."""
    logger = logging.getLogger("sanlab")
    handler = _ConsoleWarnings()
    logger.addHandler(handler)
    return lambda: logger.removeHandler(handler)


@contextmanager
def library_warnings() -> Iterator[None]:
    """``print_library_warnings`` within the block (a command), undone after it."""
    undo = print_library_warnings()
    try:
        yield
    finally:
        undo()
