"""Files are replaced whole or not at all."""

import gzip
import json
from pathlib import Path

import pytest

from sanlab.files import replacing, replacing_path, write_json, write_text


def test_write_text_and_json_replace_the_file(tmp_path):
    path = tmp_path / "table.md"
    write_text(path, "old\n")
    write_text(path, "new\n")
    assert path.read_text() == "new\n"
    write_json(tmp_path / "r.json", {"bleu": 38.5, "sys": "ä"})
    assert json.loads((tmp_path / "r.json").read_text(encoding="utf-8")) == {"bleu": 38.5, "sys": "ä"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "table.md"]  # no temporary file left


def test_an_error_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "hyp.txt"
    write_text(path, "complete\n")
    with pytest.raises(RuntimeError):
        with replacing(path) as f:
            f.write("half of a")
            raise RuntimeError("disk full")
    assert path.read_text() == "complete\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hyp.txt"]


def test_compressed(tmp_path):
    path = tmp_path / "tags.jsonl.gz"
    with replacing(path, compress=True) as f:
        f.write('{"pred": ["NOUN"]}\n')
    with gzip.open(path, "rt", encoding="utf-8") as f:
        assert f.read() == '{"pred": ["NOUN"]}\n'


def test_replace_directory_swaps_a_complete_directory_in(tmp_path):
    from sanlab.files import replace_directory

    final, tmp = tmp_path / "averaged", tmp_path / ".averaged.tmp"
    for directory, text in ((final, "old"), (tmp, "new")):
        directory.mkdir()
        (directory / "model.safetensors").write_text(text)
    replace_directory(tmp, final)
    assert (final / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["averaged"]


def test_replace_directory_that_fails_leaves_the_destination_as_it_was(tmp_path, monkeypatch):
    """A failing final rename puts the old directory back, and leaves no set-aside directory behind."""
    from sanlab import files

    final, tmp = tmp_path / "store", tmp_path / ".new.tmp"
    for directory, text in ((final, "old"), (tmp, "new")):
        directory.mkdir()
        (directory / "model.safetensors").write_text(text)
    _fail_renaming(tmp, monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        files.replace_directory(tmp, final)
    assert (final / "model.safetensors").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".new.tmp", "store"]


def test_replace_directory_over_a_link_replaces_the_link_only(tmp_path, monkeypatch):
    """A link ``final`` (a checkpoint linked in from another disk) is set aside as a link and removed once the new
    directory is in place, never what it points to; a failing final rename puts the link back. The link was removed
    before the renames (by the caller: moving a link aside onto a directory fails), so a failure lost it."""
    from sanlab import files

    store, tmp, link = tmp_path / "store", tmp_path / ".link.tmp", tmp_path / "link"
    for directory, text in ((store, "old"), (tmp, "new")):
        directory.mkdir()
        (directory / "model.safetensors").write_text(text)
    link.symlink_to(store)
    replace = _fail_renaming(tmp, monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        files.replace_directory(tmp, link)
    assert link.is_symlink() and (link / "model.safetensors").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".link.tmp", "link", "store"]
    monkeypatch.setattr(files.os, "replace", replace)
    files.replace_directory(tmp, link)
    assert not link.is_symlink() and (link / "model.safetensors").read_text() == "new"
    assert (store / "model.safetensors").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "store"]


def test_input_lines_split_at_newlines_only(tmp_path, monkeypatch):
    import io

    from sanlab.data.parallel import input_lines

    text = "\ufeffone\u2028sentence\r\nzwei\n"  # U+2028 inside a line is not a line break here
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))
    assert input_lines(None) == ["one\u2028sentence", "zwei"]
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    assert input_lines(tmp_path / "in.txt") == ["one\u2028sentence", "zwei"]


def test_bad_bytes_on_stdin_are_a_data_error_naming_the_line(monkeypatch):
    import io

    from sanlab.data.parallel import input_lines
    from sanlab.errors import DataError

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"fine\n\xff bad\n")))
    with pytest.raises(DataError, match=r"<stdin>:2: not valid UTF-8"):
        input_lines(None)


def test_gzip_on_stdin_is_not_told_to_be_named_gz(monkeypatch):
    """Standard input has no name to change: the hint says how to decompress it or pass the file instead."""
    import gzip
    import io

    from sanlab.data.parallel import input_lines
    from sanlab.errors import DataError

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(b"eins\n"))))
    with pytest.raises(DataError, match=r"<stdin>:1: not valid UTF-8 .*; it is gzip-compressed: decompress it "
                                        r"\(zcat\) or give the file as --input") as err:
        input_lines(None)
    assert "name it .gz" not in str(err.value)


def test_output_stream_leaves_no_partial_file(tmp_path):
    from sanlab.files import output_stream

    path = tmp_path / "out.txt"
    with pytest.raises(KeyError):
        with output_stream(path) as out:
            out.write("first line\n")
            raise KeyError("the model failed halfway")
    assert not path.exists() and list(tmp_path.iterdir()) == []
    with output_stream(path) as out:
        out.write("done\n")
    assert path.read_text() == "done\n"


def test_a_symlink_is_written_through_and_special_files_directly(tmp_path):
    from sanlab.files import output_stream

    target, link = tmp_path / "target.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to(target)
    write_text(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    with output_stream("/dev/null") as out:  # not replaced by a regular file
        out.write("discarded\n")
    assert not Path("/dev/null").is_file() and not list(Path("/dev").glob(".null.*"))


def test_gzip_output_is_the_same_bytes_for_the_same_text(tmp_path):
    for name in ("a.gz", "b.gz"):
        with replacing(tmp_path / name, compress=True) as f:
            f.write("same text\n")
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def test_replacing_path_replaces_the_file_only_when_its_writer_succeeds(tmp_path):
    """For writers that want a file name (matplotlib's savefig): a failure leaves the old file and no temporary."""
    target = tmp_path / "fig.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with replacing_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("drawing failed")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]
    with replacing_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]


def _fail_renaming(source: Path, monkeypatch):
    """os.replace as sanlab.files calls it fails (ENOSPC) for ``source``; returns the real one."""
    from sanlab import files

    replace = files.os.replace

    def failing(src, dst):
        if Path(src) == source:
            raise OSError(28, "No space left on device")
        return replace(src, dst)

    monkeypatch.setattr(files.os, "replace", failing)
    return replace
