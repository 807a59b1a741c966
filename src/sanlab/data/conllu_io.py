"""Reading and writing part-of-speech data in CoNLL-U (plain or gzip).

Only syntactic words count: multiword-token lines (IDs like `3-4`, whose parts follow as
their own lines) and empty nodes (IDs like `5.1`) are skipped, as the UD tagging task does.
The `conllu` package parses each sentence; this module first checks every line itself, because
a malformed line must be reported with its file and exact line number, which `conllu` does not
know. Named `conllu_io` so that it does not shadow the `conllu` package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import conllu
from conllu.exceptions import ParseException
from conllu.parser import DEFAULT_FIELDS, parse_id_value

from sanlab.data.parallel import open_text
from sanlab.errors import DataError

TagColumn = Literal["upos", "xpos"]
_N_COLUMNS = 10
_STANDARD_COLUMNS = ["ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC"]
_TAG_INDEX = {"upos": 3, "xpos": 4}


def _raw(columns: list[str], i: int) -> str:
    return columns[i]


# We only need ID, FORM and a tag column: conllu stops after the fields it is given and we keep
# XPOS as the raw string, which halves the reading time (the 10-column check is ours).
_FIELDS = DEFAULT_FIELDS[:5]
_FIELD_PARSERS = {"xpos": _raw}


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence of words and their tags (same length)."""

    words: tuple[str, ...]
    tags: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.words) != len(self.tags):
            raise ValueError(f"{len(self.words)} words but {len(self.tags)} tags")

    def __len__(self) -> int:
        return len(self.words)


Block = list[tuple[int, str]]  # (1-based line number, line) of one sentence


def _blocks(lines: Iterable[str]) -> Iterator[Block]:
    block: Block = []
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            block.append((lineno, line))
        elif block:
            yield block
            block = []
    if block:
        yield block


def _parse_id(text: str) -> int | tuple | None:
    if text.isascii() and text.isdigit() and text[0] != "0":  # the common case, without a regex ("²".isdigit())
        return int(text)
    try:
        return parse_id_value(text)
    except ParseException:
        return None


def _check_token_line(line: str, *, tag_index: int, expected_id: int, path: str, lineno: int,
                      require_tags: bool = True) -> int | None:
    """Validate one token line; return its integer ID, or None for a multiword token / empty node."""

    def fail(problem: str) -> DataError:
        return DataError(problem, path=path, line=lineno)

    columns = line.split("\t")
    if len(columns) != _N_COLUMNS:
        cr = (" (the line holds carriage returns: some of the file's lines end with a lone \\r, old Mac style; "
              "convert them to \\n)") if "\r" in line else ""
        raise fail(f"expected {_N_COLUMNS} tab-separated columns, found {len(columns)}{cr}")
    if any("  " in column for column in columns[:5]):
        # The conllu parser also splits columns on two spaces, so such a field would shift the tag columns;
        # later columns (HEAD .. MISC, where UD allows spaces) can only shift each other, and are not read.
        raise fail("a field contains two consecutive spaces, which CoNLL-U readers take as a column break")
    names = ("ID", "FORM", "LEMMA", "UPOS", "XPOS")
    padded = [name for name, column in zip(names, columns) if column != column.strip()]
    if padded:  # "NOUN " would be a tag class of its own, "a " a word of its own (the UD validator refuses both)
        raise fail(f"leading or trailing whitespace in {', '.join(padded)}: {[c for c in columns[:5]]}")
    token_id = _parse_id(columns[0])
    if token_id is None:
        raise fail(f"invalid token ID {columns[0]!r} (expected 1, 2, ... or a range 3-4 or an empty node 5.1)")
    if not columns[1]:
        raise fail("empty FORM column")
    if not isinstance(token_id, int):
        return None
    if token_id != expected_id:
        raise fail(f"token ID {token_id} out of sequence (expected {expected_id})")
    tag = columns[tag_index]
    if require_tags and tag in ("", "_"):
        name = "UPOS" if tag_index == 3 else "XPOS"
        raise fail(f"missing {name} tag ({tag!r}) for word {columns[1]!r} (column {tag_index + 1})")
    return token_id


def _check_range(text: str, *, expected_id: int, path: Path, lineno: int) -> tuple[int, int] | None:
    """A multiword token's range ``3-4`` (None for an empty node ``5.1``): it comes right before its first
    word and spans at least two words."""
    if "-" not in text:
        return None
    first, last = (int(x) for x in text.split("-"))
    if first != expected_id or last <= first:
        raise DataError(f"multiword token {text} must come right before word {first} and span words {first} to "
                        f"a later one (the next word is {expected_id})", path=str(path), line=lineno)
    return last, lineno


def _check_block(block: Block, *, path: Path, tag_index: int, require_tags: bool = True) -> None:
    expected_id, ranges = 1, []
    for lineno, line in block:
        if line.startswith("# global.columns") and line.split("=", 1)[-1].split() != _STANDARD_COLUMNS:
            raise DataError(f"CoNLL-U Plus columns ({line.strip()}) are not supported: only the 10 CoNLL-U columns "
                            f"{' '.join(_STANDARD_COLUMNS)}", path=str(path), line=lineno)
        if line.startswith("#"):
            continue
        token_id = _check_token_line(
            line, tag_index=tag_index, expected_id=expected_id, path=str(path), lineno=lineno,
            require_tags=require_tags,
        )
        if token_id is not None:
            expected_id += 1
        else:
            ranges.append(_check_range(line.split("\t", 1)[0], expected_id=expected_id, path=path, lineno=lineno))
    if expected_id == 1:
        problem = "sentence has no word lines (only comments, multiword tokens or empty nodes)"
        raise DataError(problem, path=str(path), line=block[0][0])
    beyond = next((r for r in ranges if r is not None and r[0] >= expected_id), None)
    if beyond is not None:
        raise DataError(f"multiword token ends at word {beyond[0]}, beyond the sentence's last word "
                        f"{expected_id - 1}", path=str(path), line=beyond[1])


def _parse_block(block: Block, *, path: Path, column: TagColumn) -> TaggedSentence:
    try:
        tokens = conllu.parse_token_and_metadata(
            "\n".join(line for _, line in block), fields=_FIELDS, field_parsers=_FIELD_PARSERS
        )
    except ParseException as exc:
        # Our checks should catch everything first; if not, report the block's first line.
        problem = f"CoNLL-U parse error in the sentence starting here: {exc}"
        raise DataError(problem, path=str(path), line=block[0][0]) from exc
    words = tuple(t["form"] for t in tokens if isinstance(t["id"], int))
    tags = tuple(t[column] or "_" for t in tokens if isinstance(t["id"], int))  # "_": untagged input
    return TaggedSentence(words, tags)


def read_conllu(path: str | os.PathLike[str], *, column: TagColumn = "upos",
                require_tags: bool = True, lines: Iterable[str] | None = None) -> list[TaggedSentence]:
    """Read the words and tags (`column` = "upos" or "xpos") of every sentence in a CoNLL-U file (or in
    ``lines`` already read from it, e.g. standard input; `path` then names them in errors).

    Raises `DataError` naming the file and 1-based line for a malformed line: a column count
    other than 10, an invalid or out-of-sequence ID, an empty FORM, or a missing tag ("_") on a
    word line (unless ``require_tags=False``: text to be tagged, whose missing tags read as "_").
    An empty file also raises, and so does a CoNLL-U Plus ``# global.columns`` header that names other
    columns than the standard ten (the tag column would be read from the wrong place).
    """
    if column not in _TAG_INDEX:
        raise ValueError(f"column must be 'upos' or 'xpos', got {column!r}")
    path = Path(path)
    sentences = []
    for block in _blocks(open_text(path) if lines is None else lines):
        _check_block(block, path=path, tag_index=_TAG_INDEX[column], require_tags=require_tags)
        sentences.append(_parse_block(block, path=path, column=column))
    if not sentences:
        raise DataError("no sentences (the file is empty)", path=str(path))
    return sentences


def with_tags(lines: Iterable[str], tags: Iterable[Sequence[str]], *, column: TagColumn = "upos") -> Iterator[str]:
    """The sentences of CoNLL-U ``lines`` (as ``read_conllu`` read them) with ``column`` of each word line set to
    the next sentence's ``tags``, every other line (comments, multiword tokens, empty nodes, the other columns)
    as it was: the input tagged, so that it lines up with its source and UD tools read it. Each sentence's lines
    end with one blank line (CoNLL-U's separator; runs of blank lines in the input become one)."""
    index, tags = _TAG_INDEX[column], list(tags)
    blocks = list(_blocks(lines))
    if len(blocks) != len(tags):
        raise ValueError(f"{len(tags)} tagged sentences for {len(blocks)} sentences")
    for block, sentence in zip(blocks, tags):
        rows = [line.split("\t") for _, line in block]
        words = [r for r in rows if not r[0].startswith("#") and isinstance(_parse_id(r[0]), int)]
        if len(words) != len(sentence):
            raise ValueError(f"line {block[0][0]}: {len(sentence)} tags for a sentence of {len(words)} words")
        for row, tag in zip(words, sentence):
            row[index] = tag
        yield from ("\t".join(r) + "\n" for r in rows)
        yield "\n"


# CoNLL-U's own comments: `# sent_id = 1`, `# text = ...`, `# newdoc` (with or without ` id = ...`)
_CONLLU_COMMENT = re.compile(r"#\s*((sent_id|text|global\.columns)\s*=|(newdoc|newpar)(\s*$|\s+id\s*=))")


def looks_like_conllu(lines: Iterable[str]) -> bool:
    """Whether text that is not named ``.conllu`` is meant as CoNLL-U all the same: a comment CoNLL-U writes
    (``# sent_id``, ``# text``, ...) before its first word line, or a first word line (neither blank nor a
    comment) that is a word ID and a tab, or ten tab-separated columns. Such a file with a malformed line is
    then an error naming that line, not tagged word by word as plain text. (Tokenised plain text rarely has
    tabs, and never one after a number that starts a line.)"""
    for line in lines:
        if _CONLLU_COMMENT.match(line):
            return True
        if line.strip() and not line.startswith("#"):
            columns = line.split("\t")
            return len(columns) == 10 or (len(columns) > 1 and _parse_id(columns[0]) is not None)
    return False


def plain_words(line: str) -> tuple[str, ...]:
    """The tokens of a line of tokenised text to tag: split at spaces and tabs only, so that a token holding
    another kind of space (a no-break space in "10\u00a0000", as some treebanks write numbers) stays one token.
    `sanlab tag` and the tagger's attention map both read a line so, and show the same words."""
    return tuple(word for word in re.split(r"[ \t]+", line) if word)


def write_conllu(
    path: str | os.PathLike[str], sentences: Iterable[TaggedSentence], *, no_space_before: frozenset[str] = frozenset()
) -> None:
    """Write sentences as CoNLL-U with the tags in the UPOS column; other columns are "_".

    Each sentence gets `# sent_id` and `# text` comments. Words whose tag is in `no_space_before`
    (e.g. PUNCT) are attached to the previous word in `# text`, with `SpaceAfter=No` on it. The file is replaced
    whole (``files.replacing``): a reader, say another grid's process, never finds it half-written.
    """
    from sanlab.files import replacing

    with replacing(path) as out:
        for number, sentence in enumerate(sentences, start=1):
            out.write("".join(_sentence_lines(sentence, sent_id=str(number), no_space_before=no_space_before)))


def _sentence_lines(sentence: TaggedSentence, *, sent_id: str, no_space_before: frozenset[str]) -> Iterator[str]:
    glued = [i + 1 < len(sentence) and sentence.tags[i + 1] in no_space_before for i in range(len(sentence))]
    text = "".join(word + ("" if glue else " ") for word, glue in zip(sentence.words, glued)).rstrip()
    yield f"# sent_id = {sent_id}\n# text = {text}\n"
    for i, (word, tag, glue) in enumerate(zip(sentence.words, sentence.tags, glued), start=1):
        if not word or any(c.isspace() for c in word):
            raise ValueError(f"sentence {sent_id}: word {i} ({word!r}) is empty or contains whitespace")
        misc = "SpaceAfter=No" if glue else "_"
        yield "\t".join([str(i), word, "_", tag, "_", "_", "_", "_", "_", misc]) + "\n"
    yield "\n"


def chunk_sentences(sentences: Sequence[TaggedSentence], max_len: int) -> list[TaggedSentence]:
    """Split sentences longer than `max_len` into consecutive chunks (nothing is dropped).

    Dufter et al. split long training sentences this way rather than truncating them.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    chunks = []
    for sentence in sentences:
        for start in range(0, max(len(sentence), 1), max_len):
            end = start + max_len
            chunks.append(TaggedSentence(sentence.words[start:end], sentence.tags[start:end]))
    return chunks
