"""Property-based tests of the input readers (issue 27): on any input, random or malformed, the
parallel-text and CoNLL-U readers return a correct parse or raise a DataError naming the file; never
another exception, never a hang."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sanlab.data.conllu_io import read_conllu
from sanlab.data.parallel import read_parallel
from sanlab.errors import DataError

# a deadline of 5 s per example fails one that is slow (measured after it ends); a real hang is ended by
# the module's timeout (pytest-timeout), so it fails instead of stopping the suite
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # (hundreds of examples: make test runs them)
FAST = settings(max_examples=150, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
_names = itertools.count()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """One directory for the module: hypothesis runs a test body many times within one test."""
    return tmp_path_factory.mktemp("inputs")


def _file(scratch: Path, data: bytes, *, gz: bool = False) -> Path:
    path = scratch / f"f{next(_names)}{'.gz' if gz else '.txt'}"
    path.write_bytes(data)
    return path


# text lines as users have them: words, odd whitespace, non-ASCII, a stray \r; no NUL, which the reader refuses
# by design as UTF-16 or a zero-filled block (tests/data/test_parallel.py)
words = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\n\x00"), max_size=12)
lines = st.lists(words, min_size=0, max_size=8)


def _damaged_gzip(payload: bytes, cut: int, flips: list[int]) -> bytes:
    """gzip of ``payload`` truncated at ``cut`` and with bytes flipped: corrupt streams of every kind."""
    data = bytearray(gzip.compress(payload))
    for k in flips:
        data[k % len(data)] ^= 0xFF
    return bytes(data[: max(cut, 1)])


def _read(src: Path, tgt: Path, **flags):
    try:
        return read_parallel(src, tgt, **flags)
    except DataError as err:
        assert str(src) in str(err) or str(tgt) in str(err), err  # the message names a file
        return None


@FAST
@given(st.binary(max_size=200), st.binary(max_size=200), st.sampled_from([{}, {"skip_empty": True},
                                                                          {"keep_empty": True}]))
def test_parallel_reader_on_random_bytes(scratch, src, tgt, flags):
    pairs = _read(_file(scratch, src), _file(scratch, tgt), **flags)
    if pairs is not None:
        assert pairs and all(isinstance(s, str) and isinstance(t, str) for s, t in pairs)
        assert flags.get("keep_empty") or all(s.strip() and t.strip() for s, t in pairs)


@FAST
@given(st.binary(max_size=300), st.integers(0, 400), st.lists(st.integers(0, 400), max_size=3))
def test_parallel_reader_on_damaged_gzip(scratch, payload, cut, flips):
    damaged = _file(scratch, _damaged_gzip(payload, cut, flips), gz=True)
    pairs = _read(damaged, damaged, keep_empty=True)
    assert pairs is None or len(pairs) >= 1


@FAST
@given(lines, st.booleans(), st.booleans())
def test_parallel_reader_parses_well_formed_text(scratch, text_lines, crlf, gz):
    """Equal line counts, valid UTF-8: the pairs are the lines (without their endings), or a DataError for a blank
    line or an empty file."""
    ending = "\r\n" if crlf else "\n"
    body = "".join(line + ending for line in text_lines).encode("utf-8")
    src = _file(scratch, gzip.compress(body) if gz else body, gz=gz)
    pairs = _read(src, src)
    expected = [line if crlf else line.removesuffix("\r") for line in text_lines]  # one "\r" before "\n" goes
    if expected and all(line.strip() for line in expected):
        assert pairs == [(line, line) for line in expected]
    else:
        assert pairs is None


# ------------------------------------------------------------------------------------------------ CoNLL-U
forms = st.text(st.characters(whitelist_categories=["L", "N", "P"]), min_size=1, max_size=6)
tags = st.sampled_from(["NOUN", "VERB", "PUNCT", "_", ""])
ids = st.one_of(st.integers(-1, 6).map(str), st.sampled_from(["1-2", "2-3", "3-9", "1.1", "0", "a", "", "2-1"]))


@st.composite
def token_lines(draw):
    """A token line, usually of ten columns, sometimes not: wrong counts, bad IDs, spaces, comments."""
    columns = [draw(ids), draw(forms), "_", draw(tags), draw(tags), "_", "0", "root", "_", "_"]
    shape = draw(st.sampled_from(["ok", "ok", "ok", "short", "long", "space", "comment"]))
    if shape == "short":
        columns = columns[: draw(st.integers(1, 9))]
    elif shape == "long":
        columns += ["x"]
    elif shape == "space":
        columns[1] += "  x"
    elif shape == "comment":
        return "# " + draw(forms)
    return "\t".join(columns)


conllu_text = st.lists(st.lists(token_lines(), min_size=0, max_size=6), max_size=4).map(
    lambda sentences: "".join("\n".join(s) + "\n\n" for s in sentences))


def _read_conllu(path: Path, **flags):
    try:
        return read_conllu(path, **flags)
    except DataError as err:
        assert str(path) in str(err), err
        return None


@FAST
@given(conllu_text, st.booleans())
def test_conllu_reader_on_malformed_sentences(scratch, text, require_tags):
    sentences = _read_conllu(_file(scratch, text.encode("utf-8")), require_tags=require_tags)
    if sentences is not None:
        assert sentences and all(len(s.words) == len(s.tags) >= 1 for s in sentences)
        assert all(w and "\t" not in w for s in sentences for w in s.words)


@FAST
@given(st.binary(max_size=300), st.booleans())
def test_conllu_reader_on_random_bytes(scratch, data, gz):
    sentences = _read_conllu(_file(scratch, gzip.compress(data) if gz else data, gz=gz), require_tags=False)
    assert sentences is None or all(len(s.words) == len(s.tags) >= 1 for s in sentences)


@FAST
@given(st.lists(st.lists(st.tuples(forms, st.sampled_from(["NOUN", "VERB", "PUNCT"])), min_size=1, max_size=6),
                min_size=1, max_size=4))
def test_conllu_reader_parses_well_formed_sentences(scratch, sentences):
    text = "".join("# sent_id = x\n" + "".join(f"{i}\t{w}\t_\t{t}\t_\t_\t0\troot\t_\t_\n"
                                                for i, (w, t) in enumerate(s, start=1)) + "\n" for s in sentences)
    parsed = _read_conllu(_file(scratch, text.encode("utf-8")))
    if any("  " in w for s in sentences for w, _ in s):
        return  # two spaces in a form: refused on purpose (readers take them as a column break)
    assert [(s.words, s.tags) for s in parsed] == [(tuple(w for w, _ in s), tuple(t for _, t in s)) for s in sentences]
