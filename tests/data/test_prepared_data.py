"""The prepared-data cache: exact round trip, fingerprints, corrupt and killed builds, reuse."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sanlab.data import encode
from sanlab.data.binarized import MANIFEST, CacheError, open_dataset
from sanlab.data.cache import cache_root
from sanlab.data.parallel import iter_parallel, read_parallel
from sanlab.errors import DataError
from sanlab.tasks.translation_data import corpus_key, prepare
from training_fixtures import make_reverse_config


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SANLAB_CACHE_DIR", str(root))
    return root


def _entries(root, kind):
    return sorted(p for p in root.glob(f"{kind}-*") if p.is_dir())


def test_round_trip_is_exact(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    messages = []
    data = prepare(config, tmp_path / "run", log=messages.append)
    pairs = read_parallel(config.data.train.src, config.data.train.tgt)
    assert len(data) == len(pairs)
    for k, (s, t) in enumerate(pairs):
        src, tgt = data.pair(k)
        assert src.tolist() == data.spm.src.encode(s) and tgt.tolist() == data.spm.tgt.encode(t)
    assert data.lengths.tolist() == [[len(data.spm.src.encode(s)), len(data.spm.tgt.encode(t))] for s, t in pairs]
    assert (tmp_path / "run" / "subword.model").read_bytes() == (_entries(cache, "subword")[0] / "subword.model").read_bytes()


def test_filters_match_the_in_memory_path(tmp_path, cache):
    config = make_reverse_config(tmp_path).model_copy(deep=True)
    config.data.max_len, config.data.max_ratio = 4, 1.5
    data = prepare(config, tmp_path / "run", log=print)
    pairs = read_parallel(config.data.train.src, config.data.train.tgt)
    encoded = [(data.spm.src.encode(s), data.spm.tgt.encode(t)) for s, t in pairs]
    kept = [e for e in encoded if 1 <= min(map(len, e)) and max(map(len, e)) <= 4
            and max(map(len, e)) <= 1.5 * min(map(len, e))]
    assert 0 < len(data) == len(kept) < len(pairs)
    assert [tuple(x.tolist() for x in data.pair(k)) for k in range(len(data))] == kept


def test_a_corpus_filtered_to_nothing_is_refused_before_its_cache_entry(tmp_path, cache):
    config = make_reverse_config(tmp_path).model_copy(deep=True)
    config.data.max_len = 1   # every sentence has 2 words or more
    with pytest.raises(DataError, match=r"train\.src: no training pair has 1 to data\.max_len = 1 subword tokens"):
        prepare(config, tmp_path / "run", log=print)
    assert _entries(cache, "corpus") == [] and not list(cache.glob(".corpus-*"))   # nothing cached, nothing left over
    assert _entries(cache, "subword")    # the subword model stays: it does not depend on max_len

def test_second_prepare_reuses_the_cache(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "a", log=print)
    manifest = next(iter(_entries(cache, "corpus"))) / MANIFEST
    before = manifest.stat().st_mtime_ns
    messages = []
    prepare(config, tmp_path / "b", log=messages.append)  # another run, same data and subword settings
    assert manifest.stat().st_mtime_ns == before  # nothing built: only what it reads is said again
    assert messages == [f"{tmp_path / 'train.src'} / {tmp_path / 'train.tgt'}: 200 of 200 pairs kept (0 beyond "
                        f"data.max_len 200); encoded earlier, from the cache ({manifest.parent})"]
    assert len(_entries(cache, "corpus")) == 1 and len(_entries(cache, "subword")) == 1


def test_a_rebuilt_subword_entry_reuses_the_encoded_corpus(tmp_path, cache, monkeypatch):
    """After the subword entry is trained again (the cache was cleaned), the new model and a resumed run's own
    copy of the old one segment alike: their corpus is encoded once, not once per copy (the .model bytes
    differ only in the staging path their trainer spec records)."""
    config = make_reverse_config(tmp_path)
    first = prepare(config, tmp_path / "a", log=print)
    old_model = (tmp_path / "a" / "subword.model").read_bytes()
    shutil.rmtree(_entries(cache, "subword")[0])
    pid = os.getpid() + 1
    monkeypatch.setattr(os, "getpid", lambda: pid)   # trained again by another process: another staging path
    messages = []
    second = prepare(config, tmp_path / "b", log=messages.append)
    assert (tmp_path / "b" / "subword.model").read_bytes() != old_model
    assert corpus_key(config, config.data.train, first.spm) == corpus_key(config, config.data.train, second.spm)
    assert len(_entries(cache, "corpus")) == 1 and "encoded earlier, from the cache" in messages[-1]


def test_every_run_says_what_its_cached_corpus_left_out_and_names_its_own_files(tmp_path, cache, capsys):
    """Pairs skipped for an empty side or filtered by length are counted in the entry, so a run that reuses it
    says so as the run that built it did; and ``sanlab prepare`` names the files of its own config (an entry
    serves every copy of the same files)."""
    from sanlab.cli import main
    from sanlab.config import dump_config, validate

    config = make_reverse_config(tmp_path)
    lines = (tmp_path / "train.tgt").read_text().splitlines()
    lines[5] = "   "
    (tmp_path / "train.tgt").write_text("\n".join(lines) + "\n")
    raw = config.model_dump(mode="json")
    raw["data"].update(skip_empty=True, max_len=6)
    config = validate(raw, source="test")
    said = [[], []]
    for n in range(2):
        data = prepare(config, tmp_path / f"run{n}", log=said[n].append)
    kept = len(data.corpora[0])
    report = f"{tmp_path / 'train.src'} / {tmp_path / 'train.tgt'}: {kept} of 200 pairs kept (1 with an empty side " \
             f"skipped, {199 - kept} beyond data.max_len 6)"
    assert 0 < kept < 199 and report in said[0] and said[1] == [
        f"{report}; encoded earlier, from the cache ({data.corpora[0].dir})"]
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("train.src", "train.tgt"):
        shutil.copy2(tmp_path / name, copy / name)  # the same bytes and times: the same entry
    raw["data"]["train"] = {"src": str(copy / "train.src"), "tgt": str(copy / "train.tgt")}
    (tmp_path / "c.yaml").write_text(dump_config(validate(raw, source="test")))
    capsys.readouterr()
    assert main(["prepare", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert out.count(f"{copy / 'train.src'} / {copy / 'train.tgt'}: {kept} of 200 pairs kept") == 1  # said once
    assert f"{copy / 'train.src'} / {copy / 'train.tgt'}: {kept} pairs, 0.0 MiB in " in out


def test_a_side_that_encodes_to_no_tokens_is_counted_as_that_not_as_too_long(tmp_path, cache):
    """A line of only a zero-width space is not blank (str.strip keeps it) but sentencepiece's normaliser removes
    it: the pair has no subword tokens on that side and is dropped. The report says so, not 'beyond data.max_len'
    (it said so, and a corpus with no pair over data.max_len then seemed to have some)."""
    config = make_reverse_config(tmp_path)
    lines = (tmp_path / "train.tgt").read_text().splitlines()
    lines[7] = "\u200b"
    (tmp_path / "train.tgt").write_text("\n".join(lines) + "\n")
    said = []
    data = prepare(config, tmp_path / "run", log=said.append)
    assert len(data) == 199
    report = f"{tmp_path / 'train.src'} / {tmp_path / 'train.tgt'}: 199 of 200 pairs kept (1 with a side of no " \
             "subword tokens, 0 beyond data.max_len 200)"
    assert report in said

def test_fingerprint_changes_with_the_file_and_only_then(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    spm = prepare(config, tmp_path / "run", log=print).spm
    key = corpus_key(config, config.data.train, spm)
    assert corpus_key(config, config.data.train, spm) == key
    path = config.data.train.tgt
    text = open(path).read()
    open(path, "w").write(text.replace("a", "b", 1))  # same size, other bytes
    assert corpus_key(config, config.data.train, spm) != key
    open(path, "w").write(text)
    os.utime(path, (1e9, 1e9))  # same bytes again, another modification time: a new entry, to be safe
    assert corpus_key(config, config.data.train, spm) != key


def test_a_same_size_edit_between_the_sampled_ends_is_found_by_the_whole_file_digest(tmp_path):
    """The fingerprint samples a file's first and last 64 KiB; a run also records each whole file's sha256, and a
    file touched since with the same size and ends is read whole and compared. Untouched: nothing is read."""
    from sanlab.data import fingerprint as fp

    path = tmp_path / "train.src"
    text = "".join(f"sentence number {i} of the corpus\n" for i in range(10_000))  # ~340 KB: a middle unsampled
    path.write_text(text)
    recorded = fp.with_content({}, fp.fingerprints([str(path)]))
    assert recorded[str(path)]["sha256"] == fp.content_sha256(path)
    assert fp.changes(recorded, fp.fingerprints([str(path)])) == {}
    kept = fp.with_content({str(path): {**recorded[str(path)], "sha256": "kept"}}, fp.fingerprints([str(path)]))
    assert kept[str(path)]["sha256"] == "kept"  # untouched since recorded: the whole file is not read again
    middle = len(text) // 2
    path.write_text(text[:middle] + "X" + text[middle + 1:])  # same size, same ends
    os.utime(path, (1e9, 1e9))
    current = fp.fingerprints([str(path)])
    assert (current[str(path)]["size"], current[str(path)]["sample_sha256"]) == \
        (recorded[str(path)]["size"], recorded[str(path)]["sample_sha256"])
    assert "other bytes in between (whole-file sha256)" in fp.changes(recorded, current)[str(path)]
    path.write_text(text)  # the same bytes again, touched: a copy, not a change
    os.utime(path, (2e9, 2e9))
    assert fp.changes(recorded, fp.fingerprints([str(path)])) == {}
    assert fp.changes({str(path): {k: v for k, v in recorded[str(path)].items() if k != "sha256"}},
                      fp.fingerprints([str(path)])) == {}  # runs recorded before whole-file digests: the sample


def test_other_subwords_never_share_encoded_ids(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "a", log=print)
    other = config.model_copy(deep=True)
    other.data.subword.vocab_size = 30
    prepare(other, tmp_path / "b", log=print)
    assert len(_entries(cache, "subword")) == 2 and len(_entries(cache, "corpus")) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-manifest"])
def test_damaged_cache_is_detected_and_rebuilt(tmp_path, cache, damage):
    config = make_reverse_config(tmp_path)
    data = prepare(config, tmp_path / "run", log=print)
    expected = [tuple(x.tolist() for x in data.pair(k)) for k in range(len(data))]
    entry = _entries(cache, "corpus")[0]
    tokens = entry / "src.tokens.npy"
    if damage == "truncate":
        tokens.write_bytes(tokens.read_bytes()[:-6])
    elif damage == "flip":
        raw = bytearray(tokens.read_bytes())
        raw[-1] ^= 0xFF
        tokens.write_bytes(bytes(raw))
    else:
        (entry / MANIFEST).unlink()
    with pytest.raises(CacheError):
        open_dataset(entry, key=corpus_key(config, config.data.train, data.spm))
    messages = []
    again = prepare(config, tmp_path / "run", log=messages.append)
    assert any("rebuilding" in m for m in messages), messages
    assert [tuple(x.tolist() for x in again.pair(k)) for k in range(len(again))] == expected


def test_a_subword_entry_missing_its_vocab_file_is_rebuilt(tmp_path, cache):
    """The .model loads without its .vocab, but a run copies both: the entry is rebuilt, not a FileNotFoundError."""
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "run", log=print)
    (entry,) = _entries(cache, "subword")
    vocab = next(entry.glob("*.vocab"))
    text = vocab.read_text()
    vocab.unlink()
    messages = []
    prepare(config, tmp_path / "other", log=messages.append)
    assert any(f"rebuilding it: {entry}: the cached subword model lacks {vocab.name}" in m for m in messages), messages
    assert vocab.read_text() == text and (tmp_path / "other" / vocab.name).read_text() == text


def test_killed_prepare_leaves_nothing_trusted(tmp_path, cache):
    """A prepare killed while encoding leaves only a temporary directory; the next one builds the entry."""
    config = make_reverse_config(tmp_path)
    script = (
        "import sys, time\n"
        "from training_fixtures import make_reverse_config\n"
        "import sanlab.data.binarized as b\n"
        "from sanlab.tasks.translation_data import prepare\n"
        "finish = b.DatasetWriter.finish\n"
        "def slow(self, **kw):\n"
        "    print('encoding', flush=True); time.sleep(60)\n"
        "b.DatasetWriter.finish = slow\n"
        f"prepare(make_reverse_config(__import__('pathlib').Path({str(tmp_path)!r})), None, log=print)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(os.path.dirname(os.path.dirname(__file__))),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    while "encoding" not in proc.stdout.readline():
        assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _entries(cache, "corpus") == []            # nothing under a name a run would open
    assert list(cache.glob(".corpus-*.tmp"))          # only the killed build's temporary directory
    data = prepare(config, tmp_path / "run", log=print)
    assert len(data) == 200 and not list(cache.glob(".corpus-*.tmp"))


def test_streaming_reader_reports_what_read_parallel_reports(tmp_path):
    (tmp_path / "a").write_text("x\ny\nz\n")
    (tmp_path / "b").write_text("x\ny\n")
    with pytest.raises(DataError, match="line counts differ: .*a has 3 lines, .*b has 2; line 3 of .*a has no partner"):
        list(iter_parallel(tmp_path / "a", tmp_path / "b"))
    (tmp_path / "b").write_text("x\n \nz\n")
    with pytest.raises(DataError, match=r"b:2: empty line"):
        list(iter_parallel(tmp_path / "a", tmp_path / "b"))
    assert list(iter_parallel(tmp_path / "a", tmp_path / "b", skip_empty=True)) == [("x", "x"), ("z", "z")]


@pytest.mark.parametrize("empty", ["a", "b", "both"])
def test_both_readers_name_an_empty_file_alike(tmp_path, empty):
    for name in "ab":
        (tmp_path / name).write_text("" if empty in (name, "both") else "x\ny\n")
    named = "a" if empty == "both" else empty   # the source is checked first
    for read in (read_parallel, lambda src, tgt: list(iter_parallel(src, tgt))):
        with pytest.raises(DataError) as info:
            read(tmp_path / "a", tmp_path / "b")
        assert str(info.value) == f"{tmp_path / named}: file is empty"


def test_blank_line_is_reported_before_any_cache_entry(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    lines = open(config.data.train.src).read().splitlines()
    lines[7] = ""
    open(config.data.train.src, "w").write("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"train.src:8: empty line"):
        prepare(config, None, log=print)
    assert _entries(cache, "subword") == [] and _entries(cache, "corpus") == []


def test_a_missing_training_file_is_named_before_anything_is_logged(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    os.remove(config.data.train.tgt)
    logged = []
    with pytest.raises(DataError, match=r"train\.tgt: file not found"):
        prepare(config, None, log=logged.append)
    assert not [m for m in logged if "sentencepiece" in m]  # no "training ... on N sentences" first
    assert _entries(cache, "subword") == [] and _entries(cache, "corpus") == []


@pytest.mark.parametrize("damage", ["not gzip at all", "truncated"])
def test_a_training_file_that_is_not_a_readable_gzip_is_named(tmp_path, cache, damage):
    """A .gz training file that is plain text or cut short: a DataError naming it, not gzip's traceback (the
    line count that sizes the subword sample reads it first)."""
    import gzip

    config = make_reverse_config(tmp_path)
    bad = tmp_path / "train.src.gz"
    text = open(config.data.train.src, "rb").read()
    bad.write_bytes(text if damage == "not gzip at all" else gzip.compress(text)[:-20])
    config = config.model_copy(update={"data": config.data.model_copy(update={
        "train": config.data.train.model_copy(update={"src": str(bad)})})})
    with pytest.raises(DataError, match=rf"{bad}: cannot read \(corrupt or truncated compressed file\?\)"):
        prepare(config, None, log=print)
    assert _entries(cache, "subword") == [] and _entries(cache, "corpus") == []


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SANLAB_CACHE_DIR", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x"
    monkeypatch.delenv("SANLAB_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "sanlab"


def test_parallel_workers_write_the_same_dataset(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    one = prepare(config, tmp_path / "run", log=print, workers=1)
    first = _entries(cache, "corpus")[0]
    one_bytes = {p.name: p.read_bytes() for p in first.glob("*.npy")}
    shutil.rmtree(first)
    old = encode.CHUNK_PAIRS
    encode.CHUNK_PAIRS = 37  # several chunks, returned in order by two processes
    try:
        prepare(config, tmp_path / "run", log=print, workers=2)
    finally:
        encode.CHUNK_PAIRS = old
    assert {p.name: p.read_bytes() for p in _entries(cache, "corpus")[0].glob("*.npy")} == one_bytes
    assert len(one) == 200 and np.array_equal(one.lengths, np.load(first / "lengths.npy"))


def test_a_worker_killed_while_encoding_ends_the_encoding_with_an_error_not_a_wait(tmp_path, cache, monkeypatch):
    """A worker killed from outside (for memory, say): ``Pool.imap`` waited for its chunk forever, holding the cache
    entry's lock; now the encoding stops, naming the cause, and nothing enters the cache."""
    import multiprocessing

    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "run", log=print, workers=1)  # the subword model, then the corpus entry ...
    shutil.rmtree(_entries(cache, "corpus")[0])  # ... which is built again below
    monkeypatch.setattr(encode, "CHUNK_PAIRS", 10)
    import sanlab.tasks.translation_data as translation_data

    reader = translation_data.iter_parallel

    def reading_and_killing(*args, **kwargs):
        for n, pair in enumerate(reader(*args, **kwargs)):
            if n == 50:  # the pool's first chunks are out: its workers exist
                for child in multiprocessing.active_children():
                    os.kill(child.pid, signal.SIGKILL)
            yield pair

    monkeypatch.setattr(translation_data, "iter_parallel", reading_and_killing)
    with pytest.raises(encode.EncodingWorkerDied, match="ended before it finished .* fewer --workers"):
        prepare(config, tmp_path / "run", log=print, workers=2)
    assert _entries(cache, "corpus") == [] and not list(cache.glob(".corpus-*"))


@pytest.mark.slow
def test_prepare_command_then_train_reuses_its_cache(tmp_path, cache, capsys):
    from sanlab.cli import main
    from sanlab.config import dump_config
    config = make_reverse_config(tmp_path, max_steps=1, valid_every=1)
    (tmp_path / "c.yaml").write_text(dump_config(config))
    assert main(["prepare", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert "200 of 200 pairs kept (0 beyond data.max_len 200)" in out and ": 200 pairs, 0.0 MiB in " in out
    entries = _entries(cache, "corpus") + _entries(cache, "subword")
    assert main(["train", str(tmp_path / "c.yaml"), "--run", str(tmp_path / "run"), "--quiet"]) == 0
    assert _entries(cache, "corpus") + _entries(cache, "subword") == entries  # nothing built again
    log = (tmp_path / "run" / "train.log").read_text()
    assert "encoded earlier, from the cache" in log and "process(es) in" not in log


def test_weighted_corpora_each_get_an_entry_and_feed_the_batches(tmp_path, cache):
    from sanlab.config import validate
    from sanlab.tasks.translation import TranslationTask
    from sanlab.training.logging import SilentLogger
    from training_fixtures import write_reverse_corpus

    for name, n in (("a", 300), ("b", 100)):
        (tmp_path / name).mkdir()
        write_reverse_corpus(tmp_path / name, n=n, seed=n)
    base = make_reverse_config(tmp_path).model_dump()
    files = [{"src": str(tmp_path / d / "train.src"), "tgt": str(tmp_path / d / "train.tgt")} for d in "ab"]
    base["data"]["train"] = [{**files[0], "weight": 1.0}, {**files[1], "weight": 3.0}]
    task = TranslationTask(validate(base, source="test"), tmp_path / "run", SilentLogger(tmp_path / "run"))
    assert [len(c) for c in task.train.corpora] == [300, 100] and len(_entries(cache, "corpus")) == 2
    drawn = np.concatenate([b.indices for b in task.epoch_batches(0)])
    assert len(drawn) == 400 and 200 < np.count_nonzero(drawn >= 300) < 400  # ~300 of 400 from corpus b
    batch = task.read(task.epoch_batches(0)[0])
    assert batch.tokens == task.epoch_batches(0)[0].tokens

    # one corpus in the list form is the plain form: the same batches
    base["data"]["train"] = [files[0]]
    listed = TranslationTask(validate(base, source="test"), tmp_path / "r1", SilentLogger(tmp_path / "r1"))
    base["data"]["train"] = files[0]
    plain = TranslationTask(validate(base, source="test"), tmp_path / "r2", SilentLogger(tmp_path / "r2"))
    assert [b.indices.tolist() for b in listed.epoch_batches(1)] == [b.indices.tolist() for b in plain.epoch_batches(1)]


def test_a_same_second_edit_of_the_same_size_is_a_cache_miss_and_a_change(tmp_path, cache):
    """Modification times are kept to the microsecond: an edit within the same second, at the same size and
    between the sampled ends, is neither a stale cache hit nor an unseen change on resume."""
    from sanlab.data import fingerprint as fp

    path = tmp_path / "train.src"
    text = "".join(f"sentence number {i} of the corpus\n" for i in range(10_000))
    path.write_text(text)
    os.utime(path, ns=(1_700_000_000_100_000_000, 1_700_000_000_100_000_000))
    recorded = fp.with_content({}, fp.fingerprints([str(path)]))
    middle = len(text) // 2
    path.write_text(text[:middle] + "X" + text[middle + 1:])
    os.utime(path, ns=(1_700_000_000_900_000_000, 1_700_000_000_900_000_000))  # the same second
    current = fp.fingerprints([str(path)])
    assert current[str(path)] != {k: v for k, v in recorded[str(path)].items() if k != "sha256"}  # another cache key
    assert "other bytes in between" in fp.changes(recorded, current)[str(path)]


def test_a_cache_manifest_of_another_shape_is_rebuilt(tmp_path, cache):
    config = make_reverse_config(tmp_path)
    data = prepare(config, tmp_path / "run", log=print)
    entry = _entries(cache, "corpus")[0]
    key = corpus_key(config, config.data.train, data.spm)
    good = (entry / MANIFEST).read_text()
    files = json.loads(good)["files"]
    name = next(iter(files))
    for shape in ("[1, 2]", json.dumps({**json.loads(good), "files": {**files, name: 7}}),
                  json.dumps({**json.loads(good), "files": {**files, name: {"sha256": "x"}}})):
        (entry / MANIFEST).write_text(shape)
        with pytest.raises(CacheError, match="not a JSON object of the expected form"):
            open_dataset(entry, key=key)
    messages = []
    prepare(config, tmp_path / "run", log=messages.append)
    assert any("rebuilding" in m for m in messages), messages


def test_a_cache_entry_the_machine_cannot_read_now_is_an_error_not_a_rebuild(tmp_path, cache, monkeypatch):
    """Permissions, too many open files, a disk error: the entry may be whole, so it is not deleted and built again
    (as a damaged one is); the machine's error is raised as it is."""
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "run", log=print)
    entry = _entries(cache, "corpus")[0]
    real = Path.read_text

    def refusing(self, *args, **kwargs):
        if self.name == MANIFEST:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", refusing)
    with pytest.raises(PermissionError):
        prepare(config, tmp_path / "run", log=print)
    monkeypatch.setattr(Path, "read_text", real)
    assert _entries(cache, "corpus") == [entry] and (entry / MANIFEST).is_file()


def test_a_subword_model_that_cannot_be_trained_names_the_data_and_the_setting(tmp_path, cache):
    from sanlab.errors import DataError

    config = make_reverse_config(tmp_path)
    config.data.subword.vocab_size = 8  # fewer pieces than the corpus has characters
    with pytest.raises(DataError) as info:
        prepare(config, tmp_path / "run", log=print)
    message = str(info.value)
    assert str(config.data.train.src) in message and "data.subword.vocab_size 8" in message
    assert ".tmp" not in message  # (sentencepiece's staging path, gone by then)


def test_a_data_error_stops_subword_training_where_it_is_found(tmp_path, cache, monkeypatch):
    """A blank line early in a corpus ends sentencepiece's reading there, not after the whole corpus."""
    from sanlab.errors import DataError
    from sanlab.tasks import translation_data

    config = make_reverse_config(tmp_path)
    src = Path(config.data.train.src)
    lines = src.read_text().splitlines()
    src.write_text("\n".join([lines[0], "", *lines[2:]]) + "\n")
    read = []
    real = translation_data.iter_parallel

    def counting(*args, **kwargs):
        for pair in real(*args, **kwargs):
            read.append(pair)
            yield pair

    trained = []
    real_train = translation_data.SubwordModel.train

    def recording(*args, **kwargs):
        trained.append(real_train(*args, **kwargs))  # reached only if sentencepiece trained on to the end
        return trained[-1]

    monkeypatch.setattr(translation_data, "iter_parallel", counting)
    monkeypatch.setattr(translation_data.SubwordModel, "train", recording)
    with pytest.raises(DataError, match=r"train\.src:2: "):
        prepare(config, tmp_path / "run", log=print)
    assert len(read) == 1 and trained == []  # no model of the first line alone was trained first


def test_an_unreadable_training_file_is_named_by_the_reader_not_a_traceback(tmp_path, cache, monkeypatch):
    """The fingerprint leaves a file it cannot open to the reader, whose error names it."""
    import builtins

    from sanlab.data import fingerprint as fp
    from sanlab.errors import DataError

    config = make_reverse_config(tmp_path)
    denied_path = str(config.data.train.src)
    real = builtins.open

    def denied(file, *args, **kwargs):  # (the tests run as root, for whom chmod 000 still reads)
        if str(file) == denied_path:
            raise PermissionError(13, "Permission denied", str(file))
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", denied)
    assert fp.fingerprint(denied_path) is None
    with pytest.raises(DataError, match=rf"{denied_path}: cannot (open|read): Permission denied"):
        prepare(config, tmp_path / "run", log=print)


def test_the_token_files_are_copied_in_chunks_to_the_same_bytes(tmp_path, monkeypatch):
    """``DatasetWriter.finish`` copies each side's ids in chunks (a paper-scale side is never read whole): with
    chunks of 8 bytes (4 uint16 ids, boundaries inside sentences) the arrays are the ids written, in order."""
    from sanlab.data import binarized

    monkeypatch.setattr(binarized, "_HASH_CHUNK", 8)
    rng = np.random.default_rng(0)
    src_len, tgt_len = rng.integers(1, 9, 50), rng.integers(1, 9, 50)
    src, tgt = rng.integers(0, 400, int(src_len.sum())), rng.integers(0, 400, int(tgt_len.sum()))
    writer = binarized.DatasetWriter(tmp_path / "d", dtype=np.uint16)
    s, t = int(src_len[:10].sum()), int(tgt_len[:10].sum())  # two chunks of pairs, as the encoder adds them
    writer.add(src[:s], src_len[:10], tgt[:t], tgt_len[:10])
    writer.add(src[s:], src_len[10:], tgt[t:], tgt_len[10:])
    writer.finish(key="k")
    assert np.array_equal(np.load(tmp_path / "d" / "src.tokens.npy"), src)
    assert np.array_equal(np.load(tmp_path / "d" / "tgt.tokens.npy"), tgt)
    corpus = open_dataset(tmp_path / "d", key="k")
    assert np.array_equal(corpus.pair(49)[1], tgt[-int(tgt_len[-1]):])


def test_an_edit_in_place_with_its_time_set_back_is_not_a_stale_cache_hit(tmp_path, cache):
    """The key's fingerprint samples a file's first and last 64 KiB: a same-size edit between them whose modification
    time is set back (``touch -d``, ``cp -p``) keeps the key. The entry records each file's identity (with the
    status-change time, which cannot be set back) and whole sha256, so the edit is seen and the entry rebuilt."""
    from training_fixtures import write_reverse_corpus

    write_reverse_corpus(tmp_path, n=30_000)  # ~270 KB a side: a middle that no sample reads
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "run", log=print)
    src = Path(config.data.train.src)
    before = src.stat()
    lines = src.read_text().splitlines()
    k = next(k for k in range(len(lines) // 2, len(lines)) if lines[k] != lines[k][::-1])
    lines[k] = lines[k][::-1]  # the same characters, another sentence
    src.write_text("\n".join(lines) + "\n")
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert src.stat().st_size == before.st_size
    messages = []
    data = prepare(config, tmp_path / "run2", log=messages.append)
    assert data.pair(k)[0].tolist() == data.spm.src.encode(lines[k])
    assert any(f"rebuilding it: {data.corpora[0].dir}: built from other content of {src}" in m for m in messages), \
        messages


def test_a_copy_of_the_files_reuses_the_entry_after_reading_them_whole(tmp_path, cache):
    """Another copy of the same files (another inode and status-change time) is compared by its whole sha256: the
    same content, the same entry, not built again."""
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "run", log=print)
    raw = config.model_dump(mode="json")
    (tmp_path / "copy").mkdir()
    for side in ("src", "tgt"):
        shutil.copy2(raw["data"]["train"][side], tmp_path / "copy" / f"train.{side}")
        raw["data"]["train"][side] = str(tmp_path / "copy" / f"train.{side}")
    from sanlab.config import validate

    messages = []
    prepare(validate(raw, source="test"), tmp_path / "run2", log=messages.append)
    assert len(messages) == 1 and "encoded earlier, from the cache" in messages[0], messages


def test_the_encoded_corpus_is_keyed_by_the_sentencepiece_version(tmp_path, cache, monkeypatch):
    """The ids are made by the installed sentencepiece's encoder: another version may segment the same model's
    input otherwise, so its corpus is encoded again rather than read as if it were the same."""
    from sanlab.tasks import translation_data

    config = make_reverse_config(tmp_path)
    spm = prepare(config, tmp_path / "run", log=print).spm
    key = corpus_key(config, config.data.train, spm)
    monkeypatch.setattr(translation_data, "_sentencepiece_version", lambda: "0.0.1")
    assert corpus_key(config, config.data.train, spm) != key


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device every write to fails")
@pytest.mark.parametrize("pairs", [200, 3000], ids=["write-buffered", "write-beyond-the-buffer"])
def test_a_full_disk_while_encoding_names_the_cache(tmp_path, cache, monkeypatch, pairs):
    """The source ids go to /dev/full (ENOSPC on every write, as a full disk). numpy's ``tofile`` lost a small write
    without a word (then: '0 token ids written') and raised an OSError without errno for a large one ('N requested
    and 0 written'); now the disk's own error, named as the cache's, and nothing is kept."""
    from sanlab.data import binarized
    from training_fixtures import write_reverse_corpus

    write_reverse_corpus(tmp_path, n=pairs)
    config = make_reverse_config(tmp_path)
    prepare(config, None, log=print)  # the subword entry; the corpus entry is built again below
    shutil.rmtree(_entries(cache, "corpus")[0])
    real_init = binarized.DatasetWriter.__init__

    def full(self, directory, *, dtype):
        real_init(self, directory, dtype=dtype)
        self._raw["src.tokens"].close()
        self._raw["src.tokens"] = open("/dev/full", "wb")

    monkeypatch.setattr(binarized.DatasetWriter, "__init__", full)
    with pytest.raises(DataError) as info:
        prepare(config, None, log=print)
    assert str(info.value).startswith(f"{cache}: cannot write to the data cache: No space left on device")
    assert _entries(cache, "corpus") == [] and not list(cache.glob(".corpus-*"))


@pytest.mark.parametrize("cut", ["model", "vocab"])
def test_a_subword_model_written_short_on_a_full_disk_is_named_as_that(tmp_path, cache, monkeypatch, cut):
    """sentencepiece reports success when its files could not be written whole (seen on a full tmpfs). A model cut
    short after a few pieces even loads, and a short .vocab is never read: either was cached (cut elsewhere, the
    error blamed data.subword.vocab_size). Now the cache's disk is named, and nothing is cached."""
    import sentencepiece

    real = sentencepiece.SentencePieceTrainer.train
    written = []

    def short(**kwargs):
        real(**kwargs)
        path = Path(f"{kwargs['model_prefix']}.{cut}")
        path.write_bytes(path.read_bytes()[:100])  # what a full disk leaves
        written.append(path)

    monkeypatch.setattr(sentencepiece.SentencePieceTrainer, "train", short)
    config = make_reverse_config(tmp_path)
    with pytest.raises(DataError) as info:
        prepare(config, None, log=print)
    message = str(info.value)
    assert message.startswith(f"{cache}: cannot write to the data cache: sentencepiece wrote an incomplete model"), \
        message
    assert "vocab_size" not in message and "bytes free" in message
    assert written and _entries(cache, "subword") == [] and not list(cache.glob(".subword-*"))


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE (POSIX)")
def test_a_dataset_file_the_disk_takes_only_in_part_is_the_disk_s_error(tmp_path):
    """A process whose files may not grow past 9,000 bytes (RLIMIT_FSIZE: each write beyond fails with EFBIG, as on
    a disk that fills up): the token files fit, the lengths and offsets do not. ``np.save`` wrote them with
    ``tofile``, which failed with '3001 requested and N written' and no errno (or lost a small write without a
    word); now the OS error itself, with its errno, which ``build_once`` names as the cache's."""
    script = (
        "import errno, resource, signal, sys\n"
        "import numpy as np\n"
        "from sanlab.data.binarized import DatasetWriter\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (9000, 9000))\n"
        f"writer = DatasetWriter(__import__('pathlib').Path({str(tmp_path / 'd')!r}), dtype=np.uint16)\n"
        "ones = np.ones(3000, np.int64)\n"
        "writer.add(np.arange(3000), ones, np.arange(3000), ones)  # 6,000 bytes of ids a side; lengths: 12,000\n"
        "try:\n"
        "    writer.finish(key='k')\n"
        "except OSError as err:\n"
        "    print('errno', err.errno, err)\n"
        "else:\n"
        "    print('finished')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"errno {errno.EFBIG} "), done.stdout


def test_a_resume_sees_a_same_size_edit_whose_time_was_set_back(tmp_path):
    """A run's record of its data holds each file's identity (with the status-change time, which ``touch -d`` and
    ``cp -p`` cannot set back): an edit between the sampled ends whose modification time was restored is read whole
    and found (it was not: only another modification time made a resume read the file); the same bytes again are
    not a change."""
    from sanlab.data import fingerprint as fp

    path = tmp_path / "train.src"
    text = "".join(f"sentence number {i} of the corpus\n" for i in range(10_000))
    path.write_text(text)
    recorded = fp.with_content({}, fp.fingerprints([str(path)]))
    assert fp.changes(recorded, fp.fingerprints([str(path)])) == {}
    before = path.stat()
    middle = len(text) // 2
    path.write_text(text[:middle] + "X" + text[middle + 1:])
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    current = fp.fingerprints([str(path)])
    assert current[str(path)] == {k: v for k, v in recorded[str(path)].items() if k in current[str(path)]}
    assert "other bytes in between (whole-file sha256)" in fp.changes(recorded, current)[str(path)]
    path.write_text(text)  # the same bytes again, its time set back again: not a change
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert fp.changes(recorded, fp.fingerprints([str(path)])) == {}


def test_a_subword_entry_is_not_reused_for_an_edit_with_its_time_set_back(tmp_path, cache):
    """The subword entry's key holds the same fingerprints as the corpus's: an edit between the sampled ends whose
    modification time was set back kept the model trained on the old text. The entry records the files' identity and
    whole sha256 too, and is trained again on the text as it is."""
    from training_fixtures import write_reverse_corpus

    write_reverse_corpus(tmp_path, n=30_000)
    config = make_reverse_config(tmp_path)
    prepare(config, tmp_path / "run", log=print)
    (entry,) = _entries(cache, "subword")
    tgt = Path(config.data.train.tgt)
    before = tgt.stat()
    lines = tgt.read_text().splitlines()
    k = len(lines) // 2
    lines[k] = "q" * len(lines[k])  # a character the corpus does not have: a piece of the model trained on it
    tgt.write_text("\n".join(lines) + "\n")
    os.utime(tgt, ns=(before.st_atime_ns, before.st_mtime_ns))
    messages = []
    data = prepare(config, tmp_path / "run2", log=messages.append)
    assert any(f"rebuilding it: {entry}: trained on other content of {tgt}" in m for m in messages), messages
    assert data.spm.src.piece_to_id("q") != data.spm.src.unk_id


def test_a_refusal_outside_the_cache_is_not_said_as_the_cache_s(tmp_path, cache, monkeypatch):
    """Permission refused on a file in the cache is the cache's to name; refused elsewhere while building (the
    encoding pool's semaphore, say, which names no file), it is raised as it is."""
    import errno as errnos

    from sanlab.data import binarized

    config = make_reverse_config(tmp_path)
    prepare(config, None, log=print)
    shutil.rmtree(_entries(cache, "corpus")[0])
    for filename, said in ((None, False), (str(cache / "x"), True)):
        def refused(self, *args, **kwargs):
            raise PermissionError(errnos.EACCES, "Permission denied", filename)

        monkeypatch.setattr(binarized.DatasetWriter, "add", refused)
        with pytest.raises((DataError, PermissionError)) as info:
            prepare(config, None, log=print)
        assert isinstance(info.value, DataError if said else PermissionError)
        assert ("cannot write to the data cache: Permission denied" in str(info.value)) == said


def test_a_read_only_cache_serves_the_entries_it_holds_and_names_itself_for_the_rest(tmp_path, cache, monkeypatch):
    """A cache this process cannot write (a shared copy prepared once and made read-only) still serves its entries
    as they are: only building one needs the lock, and the lock file cannot be made there. An entry it lacks, or one
    that does not pass its check, is the cache's one-line error. (Simulated: root ignores permissions.)"""
    from sanlab.data import cache as cache_module

    config = make_reverse_config(tmp_path)
    before = prepare(config, None, log=print)
    real_open = open

    def read_only(path, mode="r", *args, **kwargs):
        if str(path).endswith(".lock"):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(cache_module, "open", read_only, raising=False)
    again = prepare(config, None, log=print)  # every entry is there: served, nothing built
    assert [again.pair(k)[0].tolist() for k in range(len(again))] == [before.pair(k)[0].tolist()
                                                                       for k in range(len(before))]
    shorter = config.model_copy(deep=True)
    shorter.data.max_len = 7
    with pytest.raises(DataError, match=r"cannot write to the data cache: Read-only file system \(set "
                                        r"SANLAB_CACHE_DIR to use another cache directory\)$"):
        prepare(shorter, None, log=print)  # another filter: an entry the cache lacks
    corpus = _entries(cache, "corpus")[0]
    (corpus / MANIFEST).write_text("{}")
    with pytest.raises(DataError, match=r"cannot write to the data cache: Read-only file system, and its entry is "
                                        r"not usable \("):
        prepare(config, None, log=print)
