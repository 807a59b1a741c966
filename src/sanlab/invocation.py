"""The command line this process runs, for provenance (meta.json, table and analysis footers).

``sanlab.cli.main(argv)`` sets it for the length of the call, so a programmatic ``main([...])`` records
its own arguments, not the host process's ``sys.argv``. It lives in the environment (``SANLAB_COMMAND``,
internal) so that the worker processes of ``sanlab compare --jobs`` (spawned, not forked) inherit it; the
torchrun workers of ``sanlab train --nproc N`` inherit it and keep it, since the command to record is the
user's, not the relaunch. Without the CLI (a library call from a script) it is the script's ``sys.argv``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator, Sequence
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
