"""Reading line-aligned parallel text (plain or gzip) and filtering pairs by length.

Every problem in an input file is reported as a `DataError` that names the file and,
where it makes sense, the 1-based line number, so the CLI can print it as is.
"""

from __future__ import annotations

import gzip
import io
import itertools
import logging
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from sanlab.errors import DataError

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]


# Where the recipes in configs/ read their data: outside the repository, so a fresh clone lacks it.
SHARED_DATA = Path("..", "shared", "data")


def require_file(path: PathLike) -> None:
    """A DataError naming ``path`` unless it is a regular file (a relative path says where it was looked for; one
    into the recipes' ``../shared/data`` says where that data comes from, the first error a fresh clone meets)."""
    path = Path(path)
    if not path.exists():
        where = "" if path.is_absolute() else f" (relative to the working directory: {path.absolute()})"
        if path.parts[:len(SHARED_DATA.parts)] == SHARED_DATA.parts:
            # (no --set advice here: on a grid's committed cells other data paths would make every cell a conflict;
            # the README section says when a recipe may read a copy elsewhere)
            where += ("; the recipes read their data from ../shared/data, which is not part of the repository: "
                      "README.md, \"Real data\", says which files go there (run the commands from the repository "
                      "root)")
        raise DataError(f"file not found{where}", path=str(path))
    if not path.is_file():
        raise DataError("not a regular file", path=str(path))


def _open_binary(path: Path) -> BinaryIO:
    require_file(path)
    try:
        # Decide by suffix, as the files are named; a wrong suffix fails on read, with the path.
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as exc:
        raise DataError(f"cannot open: {exc.strerror or exc}", path=str(path)) from exc


# the first bytes of files a user may give instead of UTF-8 text (gzip is told apart above: sanlab reads it)
_OTHER_FORMATS = ((b"\xff\xfe", "UTF-16 (little-endian, with a byte-order mark): convert it to UTF-8, e.g. "
                                  "`iconv -f UTF-16 -t UTF-8`"),
                  (b"\xfe\xff", "UTF-16 (big-endian, with a byte-order mark): convert it to UTF-8, e.g. "
                                  "`iconv -f UTF-16 -t UTF-8`"),
                  (b"BZh", "bzip2-compressed: decompress it (bunzip2), or recompress it with gzip and name it .gz"),
                  (b"\xfd7zXZ\x00", "xz-compressed: decompress it (unxz), or recompress it with gzip and name it .gz"),
                  (b"(\xb5/\xfd", "zstd-compressed: decompress it (unzstd), or recompress it with gzip and name it "
                                   ".gz"))


def _other_format(first: bytes) -> str:
    """A hint for a first line that is not UTF-8: the encoding or compression its first bytes show, or nothing."""
    return next((f"; it is {what}" for magic, what in _OTHER_FORMATS if first.startswith(magic)), "")


def _iter_lines(handle: BinaryIO, path: Path) -> Iterator[str]:
    lineno = 0
    with handle:
        try:
            for lineno, raw in enumerate(handle, start=1):
                # Decode line by line (not through a text wrapper) so an error knows its line.
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    gzipped = lineno == 1 and raw.startswith(b"\x1f\x8b")
                    hint = "; it is gzip-compressed: name it .gz" if gzipped else ""
                    if lineno == 1 and not gzipped:  # what else a first line's bytes say the file is
                        hint = _other_format(raw)
                    if gzipped and path.suffix == ".gz":  # already read through gzip: the content is gzip again
                        hint = "; it is compressed twice (gzip inside gzip): decompress it once"
                    elif gzipped and str(path) == "<stdin>":  # (input_lines) no name to change
                        hint = "; it is gzip-compressed: decompress it (zcat) or give the file as --input"
                    raise DataError(
                        f"not valid UTF-8 (byte {exc.start + 1} of the line){hint}", path=str(path), line=lineno
                    ) from exc
                if lineno == 1 and text.startswith("\ufeff"):
                    text = text[1:]
                if "\x00" in text:  # UTF-16 text without a BOM reads as valid UTF-8 with a NUL every other byte
                    raise DataError(f"NUL byte at character {text.index(chr(0)) + 1} of the line (UTF-16 text, or a "
                                    "zero-filled block?); sanlab reads UTF-8", path=str(path), line=lineno)
                line = text.removesuffix("\n").removesuffix("\r")
                if lineno == 1 and not raw.endswith(b"\n") and "\r" in line:  # the whole file, and it holds \r
                    raise DataError("the file has no \\n line ends but carriage returns: it ends its lines with a "
                                    "lone \\r (old Mac style) and would read as one line; convert them to \\n",
                                    path=str(path), line=1)
                yield line
        except (OSError, EOFError, zlib.error) as exc:
            # gzip raises these for a corrupt or truncated stream.
            problem = f"cannot read (corrupt or truncated compressed file?): {exc}"
            raise DataError(problem, path=str(path), line=lineno + 1) from exc


def open_text(path: PathLike) -> Iterator[str]:
    """Iterate the lines of a UTF-8 text file, plain or gzip (`.gz`), without their line ending.

    The file is opened immediately, so a missing file raises here rather than at the first
    `next()`. A byte sequence that is not UTF-8 raises `DataError` naming the file and line.
    A UTF-8 byte-order mark at the start of the file is dropped; nothing else is changed. A file with
    carriage returns but no "\n" at all (old Mac line ends: it would read as one line) is a `DataError`.
    """
    path = Path(path)
    return _iter_lines(_open_binary(path), path)


def check_input_file(path: PathLike | None) -> None:
    """Fail before any work unless ``path`` is a file to read (None: standard input)."""
    if path is None:
        return
    if Path(path).is_dir():
        raise DataError("is a directory; give an input file (or none, or -, for standard input)", path=str(path))
    if not Path(path).exists():
        raise DataError("input file not found", path=str(path))
    if not (Path(path).is_file() or _is_stream(path)):
        raise DataError("not a regular file, a pipe or a character device", path=str(path))


def _is_stream(path: PathLike) -> bool:
    """A pipe or a character device (``<(command)``, ``/dev/stdin``): readable once, as an input is read."""
    mode = os.stat(path).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def input_lines(path: PathLike | None) -> list[str]:
    """The lines of an input file (as ``open_text``) or of standard input when ``path`` is None.

    Lines end at "\n" only (and a "\r" before it): ``str.splitlines`` would also split a sentence at
    U+2028, U+0085 and the like, and one input line must stay one output line.
    """
    if path is not None and not Path(path).is_file() and Path(path).exists() and _is_stream(path):
        return list(_iter_lines(open(path, "rb"), Path(path)))  # (open_text takes regular files only)
    if path is not None:
        return list(open_text(path))
    # Bytes, decoded line by line as for files: the text layer would turn bad bytes into surrogates (or fail
    # without a line number, depending on the locale)
    return list(_iter_lines(io.BytesIO(sys.stdin.buffer.read()), Path("<stdin>")))


def _is_blank(line: str) -> bool:
    return not line.strip()


def _check_counts(n_src: int, n_tgt: int, src_path: Path, tgt_path: Path) -> None:
    if n_src == n_tgt:
        return
    shorter, longer = (src_path, tgt_path) if n_src < n_tgt else (tgt_path, src_path)
    first_unpaired = min(n_src, n_tgt) + 1
    raise DataError(
        f"line counts differ: {src_path} has {n_src} lines, {tgt_path} has {n_tgt}; "
        f"line {first_unpaired} of {longer} has no partner in {shorter}",
        path=str(src_path),
    )


def read_parallel(src_path: PathLike, tgt_path: PathLike, *, skip_empty: bool = False, keep_empty: bool = False,
                  log: Callable[[str], None] | None = None) -> list[tuple[str, str]]:
    """Read two line-aligned files into `(source, target)` pairs.

    Raises `DataError` for a missing or empty file, differing line counts (naming both files,
    both counts and the first line without a partner) and a blank line on either side.
    With `skip_empty=True` pairs with a blank side are dropped instead, and their number goes to
    ``log`` (the run's log; the module logger if None). With `keep_empty=True` they are kept as they
    are: scoring a test set needs every one of its lines.
    """
    if skip_empty and keep_empty:
        raise ValueError("skip_empty and keep_empty exclude each other")
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    src, tgt = list(open_text(src_path)), list(open_text(tgt_path))
    for path, lines in ((src_path, src), (tgt_path, tgt)):
        if not lines:
            raise DataError("file is empty", path=str(path))
    _check_counts(len(src), len(tgt), src_path, tgt_path)

    pairs: list[tuple[str, str]] = []
    skipped = 0
    for lineno, (s, t) in enumerate(zip(src, tgt), start=1):
        if (_is_blank(s) or _is_blank(t)) and not keep_empty:
            if not skip_empty:
                blank_path = src_path if _is_blank(s) else tgt_path
                raise DataError("empty line (set data.skip_empty: true to drop such pairs from training and validation)",
                                path=str(blank_path), line=lineno)
            skipped += 1
            continue
        pairs.append((s, t))
    if skipped:
        (log or logger.info)(f"skipped {skipped} of {len(src)} pairs with an empty side in {src_path} / {tgt_path}")
    if not pairs:
        raise DataError(f"no non-empty pairs (paired with {tgt_path})", path=str(src_path))
    return pairs


def iter_parallel(src_path: PathLike, tgt_path: PathLike, *, skip_empty: bool = False,
                  log: Callable[[str], None] | None = None, counts: dict | None = None) -> Iterator[tuple[str, str]]:
    """``read_parallel``'s pairs one at a time, for corpora too large to hold: the same errors (a missing
    or empty file, a blank line without ``skip_empty``, differing line counts), each found when reading
    reaches it, so a count mismatch is reported at the end of the shorter file. ``counts``, when given, gets
    ``lines`` (pairs in the files) and ``skipped_empty`` once the files are read."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    src, tgt = open_text(src_path), open_text(tgt_path)
    n = skipped = 0
    for n, (s, t) in enumerate(itertools.zip_longest(src, tgt), start=1):
        if s is None or t is None:  # one file ended: count the rest of the other for the message
            if n == 1:  # as read_parallel: an empty file is named as that, not as a count mismatch
                raise DataError("file is empty", path=str(src_path if s is None else tgt_path))
            rest = n + sum(1 for _ in (src if t is None else tgt))
            _check_counts(rest if t is None else n - 1, n - 1 if t is None else rest, src_path, tgt_path)
        if _is_blank(s) or _is_blank(t):
            if not skip_empty:
                raise DataError("empty line (set data.skip_empty: true to drop such pairs from training and validation)",
                                path=str(src_path if _is_blank(s) else tgt_path), line=n)
            skipped += 1
            continue
        yield s, t
    if n == 0:
        raise DataError("file is empty", path=str(src_path))
    if counts is not None:
        counts.update(lines=n, skipped_empty=skipped)
    if skipped:
        (log or logger.info)(f"skipped {skipped} of {n} pairs with an empty side in {src_path} / {tgt_path}")
    if skipped == n:
        raise DataError(f"no non-empty pairs (paired with {tgt_path})", path=str(src_path))


def length_filter(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    min_len: int = 1,
    max_len: int,
    max_ratio: float | None = None,
) -> list[int]:
    """Indices of the tokenised pairs to keep.

    A pair is kept when both sides have between `min_len` and `max_len` tokens (inclusive) and,
    if `max_ratio` is given, the longer side is at most `max_ratio` times the shorter one.
    """
    if min_len < 0 or max_len < min_len:
        raise ValueError(f"need 0 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if max_ratio is not None and max_ratio < 1:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio}")
    kept = []
    for i, (src, tgt) in enumerate(pairs):
        short, long_ = sorted((len(src), len(tgt)))
        if short < min_len or long_ > max_len:
            continue
        # short == 0 only when min_len == 0; two empty sides have ratio 1.
        if max_ratio is not None and long_ > max_ratio * short:
            continue
        kept.append(i)
    return kept
