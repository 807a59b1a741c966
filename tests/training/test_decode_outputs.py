"""What `sanlab translate` and `sanlab tag` read and write: never their own input or a file of the run, `-` for
standard output, gzip for a `.gz` name, the permissions a new file would get, pipes as input, and CoNLL-U that is
malformed named as such (the ``legacy`` fixture's tiny runs)."""

import gzip
import os
import stat
import threading
from pathlib import Path

import pytest

from sanlab.cli import main


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(params=["translate", "tag"])
def command(request, legacy):
    """(command, run, an input file of its kind)."""
    name = request.param
    run = "translation" if name == "translate" else "tagging"
    source = legacy / "input.txt"
    source.write_text("a b c\nd e\n" if name == "translate" else "the dog runs\n")
    return name, run, source


def test_the_input_is_never_the_output(command, capsys):
    name, run, source = command
    before = source.read_bytes()
    code, _, err = _run([name, "--run", run, "--input", str(source), "--output", str(source)], capsys)
    assert code == 2 and f"--output {source}: is the input file {source}, which the output would replace" in err
    assert source.read_bytes() == before


@pytest.mark.parametrize("own", ["config.yaml", "meta.json", "checkpoints/latest.json"])
def test_a_file_of_the_run_is_never_the_output(command, capsys, own):
    name, run, source = command
    before = os.path.join(run, own)
    kept = Path(before).read_bytes()
    code, _, err = _run([name, "--run", run, "--input", str(source), "--output", before], capsys)
    assert code == 2 and "is the run's own" in err and "write the output to another file" in err
    assert Path(before).read_bytes() == kept


@pytest.mark.parametrize("own", ["config.yaml", "meta.json", "checkpoints/latest.json"])
def test_a_file_of_another_run_is_never_the_output(command, capsys, own):
    """The run decoding is not the only one whose files an output could replace: the other legacy run's are
    refused as well."""
    name, run, source = command
    other = "tagging" if run == "translation" else "translation"
    before = os.path.join(other, own)
    kept = Path(before).read_bytes()
    code, _, err = _run([name, "--run", run, "--input", str(source), "--output", before], capsys)
    assert code == 2 and "is the run's own (" in err and f"/{other}), which the output would replace" in err
    assert Path(before).read_bytes() == kept


def test_other_names_in_the_run_directory_are_the_users(command, capsys):
    name, run, source = command
    code, _, _ = _run([name, "--run", run, "--input", str(source), "--output", os.path.join(run, "mine.txt")], capsys)
    assert code == 0 and os.path.getsize(os.path.join(run, "mine.txt")) > 0


def test_dash_is_standard_output_and_gz_is_compressed(command, capsys, legacy):
    name, run, source = command
    code, to_stdout, _ = _run([name, "--run", run, "--input", str(source), "--output", "-"], capsys)
    assert code == 0 and to_stdout and not (legacy / "-").exists()
    code, _, _ = _run([name, "--run", run, "--input", str(source), "--output", "out.txt.gz"], capsys)
    assert code == 0 and gzip.decompress((legacy / "out.txt.gz").read_bytes()).decode() == to_stdout


def test_an_output_file_has_the_permissions_a_new_file_would_get(command, capsys, legacy):
    """The umask for a new file; a replaced file keeps its own mode (0600 stays private)."""
    name, run, source = command
    old = os.umask(0o077)
    try:
        assert _run([name, "--run", run, "--input", str(source), "--output", "new.txt"], capsys)[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((legacy / "new.txt").stat().st_mode) == 0o600
    (legacy / "kept.txt").write_text("x")
    os.chmod(legacy / "kept.txt", 0o640)
    assert _run([name, "--run", run, "--input", str(source), "--output", "kept.txt"], capsys)[0] == 0
    assert stat.S_IMODE((legacy / "kept.txt").stat().st_mode) == 0o640


def test_a_pipe_is_an_input(command, capsys, legacy):
    name, run, source = command
    expected = _run([name, "--run", run, "--input", str(source)], capsys)[1]
    fifo = legacy / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(source.read_bytes()))
    writer.start()
    try:
        code, out, err = _run([name, "--run", run, "--input", str(fifo)], capsys)
    finally:
        writer.join(timeout=30)
    assert (code, out) == (0, expected), err


def test_a_missing_input_is_named_before_the_model_is_loaded(command, capsys, monkeypatch):
    import sanlab.runs

    name, run, _ = command
    monkeypatch.setattr(sanlab.runs, "load_trained", lambda *a, **k: pytest.fail("the model was loaded"))
    code, _, err = _run([name, "--run", run, "--input", "nosuch.txt"], capsys)
    assert code == 2 and "nosuch.txt: input file not found" in err


def test_malformed_conllu_not_named_so_is_an_error_not_plain_text(legacy, capsys):
    """A file meant as CoNLL-U (a `# sent_id` comment, a word ID and a tab) with a bad line: the line is named,
    not every token of it tagged as a word of plain text."""
    bad = legacy / "bad.txt"
    bad.write_text("# sent_id = 1\n1\tthe\t_\t_\t_\t_\t_\t_\t_\n2\tdog\t_\t_\t_\t_\t_\t_\t_\t_\n\n")
    code, out, err = _run(["tag", "--run", "tagging", "--input", str(bad)], capsys)
    assert code == 2 and out == "" and f"{bad}:2" in err


def test_a_text_word_spelled_like_padding_is_an_unknown_word():
    from sanlab.data.conllu_io import TaggedSentence
    from sanlab.tasks.tagging import UNK, TaggingVocab, encode_batch

    train = [TaggedSentence(("the", "dog"), ("DET", "NOUN"))]
    vocab = TaggingVocab.build(train, train, fraction=1.0, max_size=None)
    batch = encode_batch(vocab, [TaggedSentence(("the", "<pad>", "<oov>", "dog"), ("_",) * 4)], max_chars=8)
    assert batch.words[0, 1:3].tolist() == [UNK, UNK] and batch.words[0, 0] > UNK and batch.words[0, 3] > UNK
    assert not vocab.in_vocab("<pad>") and vocab.in_vocab("dog")


def test_tagged_output_given_as_input_is_refused_not_tagged_again(legacy, capsys):
    """`sanlab tag`'s own output (a word, a tab and a tag a line, blank lines between sentences) fed back as input:
    an error naming the file and its first line, not each line tagged as a sentence of a word and a tag."""
    tagged = legacy / "tagged.txt"
    tagged.write_text("the\tDET\ndog\tNOUN\n\nruns\tVERB\n\n")
    code, out, err = _run(["tag", "--run", "tagging", "--input", str(tagged)], capsys)
    assert code == 2 and out == ""
    assert f"{tagged}:1: " in err and "word<TAB>tag" in err and "one sentence per line" in err


def test_plain_text_with_tabs_between_words_is_still_tagged(legacy, capsys):
    """Words split at a tab are plain text too: only word<TAB>tag lines in blocks are refused."""
    text = legacy / "tabs.txt"
    text.write_text("the\tdog\truns\nthe\tdog\n")
    code, out, err = _run(["tag", "--run", "tagging", "--input", str(text)], capsys)
    assert code == 0, err
    assert [line.split("\t")[0] for line in out.splitlines()] == ["the", "dog", "runs", "", "the", "dog", ""]


@pytest.mark.parametrize("key, damage", [("words", lambda old: 5), ("chars", lambda old: []), ("tags", lambda old: None),
                                         ("words", lambda old: old[:2] + [7] + old[3:])],
                         ids=["words-a-number", "chars-empty", "tags-null", "words-holding-a-number"])
def test_a_damaged_tagging_vocabulary_is_named(legacy, capsys, key, damage):
    """A tagger-vocab.json whose lists are not lists of names (hand-edited, cut short): an error naming the file
    and the list, not a traceback from building the model or a number taken for a word."""
    import json

    path = legacy / "tagging" / "tagger-vocab.json"
    vocab = json.loads(path.read_text())
    path.write_text(json.dumps({**vocab, key: damage(vocab[key])}))
    source = legacy / "input.txt"
    source.write_text("the dog runs\n")
    code, out, err = _run(["tag", "--run", "tagging", "--input", str(source)], capsys)
    assert code == 2 and out == ""
    assert f"tagger-vocab.json: not a tagging vocabulary: {key} " in err
