"""User-facing errors. Each names what was wrong and where, so the CLI can print it as is."""

from __future__ import annotations

from collections.abc import Iterable


class SanlabError(Exception):
    """Base class for errors caused by user input (files, configs, arguments)."""


class ConfigError(SanlabError):
    """An invalid configuration: unknown key, wrong type, impossible combination."""


class DataError(SanlabError):
    """A problem in an input file. The message names the file and, where known, the line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.problem, self.path, self.line = message, path, line


class TrainingError(SanlabError):
    """Training cannot go on (e.g. a NaN loss); nothing of the failed step was saved."""


class DecodingError(SanlabError):
    """Decoding cannot go on (e.g. the device's memory ran out); nothing was written. For memory: ``where`` (the
    batch) and ``account`` (torch's words about the memory), so that a caller decoding for another purpose
    (validation during training) can say it with advice of its own."""

    def __init__(self, message: str, *, where: str | None = None, account: str | None = None):
        super().__init__(message)
        self.where, self.account = where, account


def case_hint(given: str, names: Iterable[str]) -> str:
    """``did you mean 'bleu'? (metric names are case-sensitive)`` where ``given`` is one of ``names`` but for case,
    else "": said, never taken, so that what a config stores or a table names keeps the one spelling."""
    meant = [repr(n) for n in names if n != given and n.casefold() == given.casefold()]
    return f"did you mean {' or '.join(meant)}? (metric names are case-sensitive)" if meant else ""
