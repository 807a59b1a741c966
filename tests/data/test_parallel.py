"""Reading parallel text: line handling, gzip, and the errors users see for bad files."""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
from pathlib import Path

import pytest

from sanlab.data.parallel import length_filter, open_text, read_parallel
from sanlab.errors import DataError


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


@pytest.mark.parametrize("name", ["a.txt", "a.txt.gz"])
def test_open_text_strips_only_the_line_ending(tmp_path, name):
    path = write(tmp_path / name, "\ufefffirst\n second  \r\nthird")
    assert list(open_text(path)) == ["first", " second  ", "third"]


def test_open_text_reports_bad_utf8_with_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nstill ok\nbad \xff byte\n")
    with pytest.raises(DataError, match=r"bad\.txt:3: not valid UTF-8") as info:
        list(open_text(path))
    assert info.value.path == str(path) and info.value.line == 3


def test_open_text_missing_file_raises_at_call(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: file not found"):
        open_text(tmp_path / "nope.txt")


def test_open_text_corrupt_gzip(tmp_path):
    path = tmp_path / "broken.gz"
    path.write_bytes(b"this is not gzip")
    with pytest.raises(DataError, match=r"broken\.gz"):
        list(open_text(path))


def test_read_parallel_pairs_lines(tmp_path):
    src = write(tmp_path / "train.en.gz", "a cat .\nthe dog\n")
    tgt = write(tmp_path / "train.de", "eine katze .\nder hund\n")
    assert read_parallel(src, tgt) == [("a cat .", "eine katze ."), ("the dog", "der hund")]


def test_read_parallel_count_mismatch_names_both_files(tmp_path):
    src = write(tmp_path / "x.src", "1\n2\n3\n")
    tgt = write(tmp_path / "x.tgt", "1\n2\n3\n4\n")
    with pytest.raises(DataError) as info:
        read_parallel(src, tgt)
    message = str(info.value)
    assert str(src) in message and str(tgt) in message
    assert "has 3 lines" in message and "has 4" in message
    assert f"line 4 of {tgt} has no partner" in message


def test_read_parallel_empty_file(tmp_path):
    src = write(tmp_path / "x.src", "")
    tgt = write(tmp_path / "x.tgt", "1\n")
    with pytest.raises(DataError, match=r"x\.src: file is empty"):
        read_parallel(src, tgt)


def test_read_parallel_missing_file(tmp_path):
    src = write(tmp_path / "x.src", "1\n")
    with pytest.raises(DataError, match=r"x\.tgt: file not found"):
        read_parallel(src, tmp_path / "x.tgt")


def test_read_parallel_empty_line_names_file_and_line(tmp_path):
    src = write(tmp_path / "x.src", "a\nb\nc\n")
    tgt = write(tmp_path / "x.tgt", "A\n  \nC\n")
    with pytest.raises(DataError, match=r"x\.tgt:2: empty line") as info:
        read_parallel(src, tgt)
    assert info.value.line == 2


def test_read_parallel_skip_empty_drops_and_logs(tmp_path, caplog):
    src = write(tmp_path / "x.src", "a\n\nc\nd\n")
    tgt = write(tmp_path / "x.tgt", "A\nB\nC\n\t\n")
    with caplog.at_level(logging.INFO, logger="sanlab.data.parallel"):
        assert read_parallel(src, tgt, skip_empty=True) == [("a", "A"), ("c", "C")]
    assert "skipped 2 of 4 pairs" in caplog.text


def test_read_parallel_skip_empty_with_nothing_left(tmp_path):
    src = write(tmp_path / "x.src", " \n")
    tgt = write(tmp_path / "x.tgt", "A\n")
    with pytest.raises(DataError, match="no non-empty pairs"):
        read_parallel(src, tgt, skip_empty=True)


def test_length_filter():
    pairs = [([1, 2], [3, 4, 5]), ([], [1]), ([1] * 6, [1]), ([1] * 9, [1] * 9), ([1], [1] * 4)]
    assert length_filter(pairs, max_len=8) == [0, 2, 4]
    assert length_filter(pairs, max_len=9, max_ratio=3) == [0, 3]
    assert length_filter(pairs, min_len=0, max_len=9, max_ratio=4) == [0, 3, 4]
    with pytest.raises(ValueError, match="min_len"):
        length_filter(pairs, min_len=5, max_len=2)


def test_read_parallel_keep_empty_keeps_every_line_and_the_modes_exclude_each_other(tmp_path):
    src = write(tmp_path / "x.src", "a\n\nc\n")
    tgt = write(tmp_path / "x.tgt", "A\nB\n \n")
    assert read_parallel(src, tgt, keep_empty=True) == [("a", "A"), ("", "B"), ("c", " ")]
    messages = []
    assert read_parallel(src, tgt, skip_empty=True, log=messages.append) == [("a", "A")]
    assert messages == [f"skipped 2 of 3 pairs with an empty side in {src} / {tgt}"]
    with pytest.raises(ValueError, match="exclude each other"):
        read_parallel(src, tgt, skip_empty=True, keep_empty=True)


def test_utf16_text_and_nul_bytes_are_named_not_read_as_garbage(tmp_path):
    """UTF-16 without a BOM decodes as valid UTF-8 with a NUL every other byte (and a stray NUL-only line)."""
    src, tgt = tmp_path / "u16.en", tmp_path / "u16.de"
    src.write_bytes("a small cat\nthe dog\n".encode("utf-16-le"))
    tgt.write_bytes("eine Katze\nder Hund\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"u16\.en:1: NUL byte at character 2 of the line \(UTF-16 text"):
        read_parallel(src, tgt)
    zeroed = write(tmp_path / "z.txt", "fine\nbroken\x00\x00 block\n")
    with pytest.raises(DataError, match=r"z\.txt:2: NUL byte at character 7"):
        list(open_text(zeroed))


def test_lone_carriage_return_line_ends_are_named_not_read_as_one_line(tmp_path):
    """Old Mac text has no \\n at all: it would read as one pair holding \\r characters (the filter then reports
    "no training pair ..." or trains on it). CRLF and a \\r inside one line of a \\n file are read as before."""
    src, tgt = tmp_path / "mac.en", tmp_path / "mac.de"
    src.write_bytes(b"a small cat\rthe dog\r")
    tgt.write_bytes(b"eine Katze\rder Hund\r")
    with pytest.raises(DataError, match=r"mac\.en:1: the file has no \\n line ends but carriage returns"):
        read_parallel(src, tgt)
    crlf = tmp_path / "crlf.en"
    crlf.write_bytes(b"one\r\ntwo\rmore\r\nlast\r")
    assert list(open_text(crlf)) == ["one", "two\rmore", "last"]
    single = tmp_path / "single.en"
    single.write_bytes(b"only line\r")
    assert list(open_text(single)) == ["only line"]


def test_a_relative_path_not_found_says_where_it_was_looked_for_and_a_gzip_without_gz_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=rf"nope\.en: file not found \(relative to the working directory: "
                                        rf"{tmp_path / 'nope.en'}\)"):
        open_text("nope.en")
    packed = write(tmp_path / "packed.gz", "eins\nzwei\n")
    (tmp_path / "packed.txt").write_bytes(packed.read_bytes())
    with pytest.raises(DataError, match=r"packed\.txt:1: not valid UTF-8 .*; it is gzip-compressed: name it \.gz"):
        list(open_text(tmp_path / "packed.txt"))


def test_a_gz_file_compressed_twice_says_so_not_to_name_it_gz(tmp_path):
    """A .gz whose content is gzip again (a download saved still compressed by the transfer): naming it .gz
    would not help."""
    twice = tmp_path / "twice.en.gz"
    twice.write_bytes(gzip.compress(gzip.compress(b"eins\nzwei\n")))
    with pytest.raises(DataError, match=r"twice\.en\.gz:1: not valid UTF-8 .*; it is compressed twice") as err:
        list(open_text(twice))
    assert "name it .gz" not in str(err.value)


@pytest.mark.parametrize("content, said", [
    ("eins\nzwei\n".encode("utf-16"), "it is UTF-16 .*: convert it to UTF-8, e.g. `iconv -f UTF-16 -t UTF-8`"),
    (b"\xfe\xff" + "eins\nzwei\n".encode("utf-16-be"), "it is UTF-16 \\(big-endian"),
    (bz2.compress(b"eins\nzwei\n" * 50), "it is bzip2-compressed: decompress it \\(bunzip2\\)"),
    (lzma.compress(b"eins\nzwei\n" * 50), "it is xz-compressed: decompress it \\(unxz\\)"),
], ids=["utf-16-le", "utf-16-be", "bzip2", "xz"])
def test_a_file_in_another_encoding_or_compression_is_named_as_such(tmp_path, content, said):
    """Given a UTF-16 export or a .bz2/.xz download, the not-UTF-8 error says what the file is and what to do (a
    file whose first line is not UTF-8 for no such reason keeps the bare error)."""
    path = tmp_path / "corpus.en"
    path.write_bytes(content)
    with pytest.raises(DataError, match=rf"corpus\.en:1: not valid UTF-8 .*; {said}"):
        list(open_text(path))
    path.write_bytes(b"caf\xe9\n")  # Latin-1
    with pytest.raises(DataError, match=r"corpus\.en:1: not valid UTF-8 \(byte 4 of the line\)$"):
        list(open_text(path))


def test_a_missing_file_of_the_recipes_shared_data_says_where_that_data_comes_from(tmp_path, monkeypatch):
    """A fresh clone has no ../shared/data: the first `sanlab train` of a recipe stops there, and the message
    sends the user to README.md's "Real data" instead of leaving a bare "file not found"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"test\.en\.gz: file not found \(relative to the working directory: .*\); the "
                                        r"recipes read their data from \.\./shared/data, .*README\.md, \"Real data\""):
        open_text("../shared/data/multi30k/test.en.gz")
    with pytest.raises(DataError) as other:  # a file of the user's own: no word about the recipes' data
        open_text("../mine/test.en.gz")
    assert "shared/data" not in str(other.value) and "README" not in str(other.value)
