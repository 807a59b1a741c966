"""Files are replaced whole or not at all."""

import gzip
import json

import pytest

from sanlab.files import replacing, write_json, write_text


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
