"""Translation training data, prepared once: the subword model(s) and the binarized corpus, in the cache.

``prepare`` (``sanlab prepare CONFIG``, and the start of every ``sanlab train``) makes two cache entries
(``data.cache``: where, locking, atomic builds):

* ``subword-<key>/``: the sentencepiece model(s), keyed by the training files' fingerprints, the
  ``data.subword`` settings and ``data.skip_empty`` (which decides the texts it learns from), with the files'
  content (``CONTENT``) checked whenever it is used, as a corpus entry's is (``_built_from``). A run
  copies them into its directory, as before; a run that has its own already (a resumed run) keeps them.
  Of a distributed run's processes only the main one does (``main=True``); the others read the copy it
  made in the run directory and write nothing there (``shared_subwords``).
* ``corpus-<key>/``: the training pairs encoded with those models and filtered (``data.max_len``,
  ``data.max_ratio``, ``data.skip_empty``), a ``BinarizedCorpus``, keyed by the files' fingerprints,
  the subword models' sha256 (runs with other subwords never share ids), sentencepiece's version and the
  filters. It records each file's identity and whole sha256, checked whenever it is used (``_built_from``).

A key also names ``PREPARE_VERSION``: bump it when what an entry holds changes meaning.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sanlab.config import ParallelFiles, TranslationConfig
from sanlab.data import binarized
from sanlab.data.binarized import BinarizedCorpus, CacheError, DatasetWriter, open_dataset, token_dtype
from sanlab.data.cache import build_once, cache_root, entry_key, unwritable
from sanlab.data.encode import LengthFilter, encode_into
from sanlab.data.fingerprint import content_sha256, fingerprint, identity
from sanlab.data.parallel import iter_parallel, require_file
from sanlab.data.subword import IncompleteModel, SubwordModel, SubwordPair
from sanlab.errors import DataError
from sanlab.files import replacing_path
from sanlab.training.checkpoint import CheckpointManager
from sanlab.training.layout import RunLayout

PREPARE_VERSION = 1
CONTENT = "content.json"  # in a subword entry: its training files' identity and sha256 (not copied into a run)
# below this size of the source file as stored (about 200,000 sentences of plain text, more compressed), one
# process encodes faster than a pool starts; judged by size, not lines: counting them would read a WMT-scale
# corpus once more only to choose
PARALLEL_ABOVE_BYTES = 16 * 2**20


def load_subwords(run_dir: Path, *, joint: bool) -> SubwordPair:
    """The subword model(s) of a run (or of a cache entry, which names them alike): one joint model, or a
    source and a target one (``data.subword.joint``)."""
    layout = RunLayout(run_dir)
    if joint:
        return SubwordPair(SubwordModel.load(layout.subword_model("joint")))
    return SubwordPair(SubwordModel.load(layout.subword_model("src")), SubwordModel.load(layout.subword_model("tgt")))


def count_lines(path: str | os.PathLike[str]) -> int:
    """Lines of a plain or gzip file, counted in bytes (no decoding); 0 for a file that is not there."""
    path = Path(path)
    if not path.is_file():
        return 0
    n, last = 0, b"\n"
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            while block := f.read(1 << 22):
                n, last = n + block.count(b"\n"), block[-1:]
    except (OSError, EOFError, zlib.error) as exc:  # what gzip raises for a corrupt or truncated stream
        # (counted in blocks: no line number to give; reading it line by line would name one)
        why = " (corrupt or truncated compressed file?)" if path.suffix == ".gz" and not isinstance(
            exc, PermissionError) else ""
        raise DataError(f"cannot read{why}: {getattr(exc, 'strerror', None) or exc}", path=str(path)) from exc
    return n + (last != b"\n")


# ----------------------------------------------------------------------------- subword model(s)
def _texts(corpora: list[ParallelFiles], side: int, skip_empty: bool, problems: list[DataError]) -> Iterator[str]:
    """One side's texts. A DataError (a blank line, differing line counts) is kept in ``problems`` and raised
    inside sentencepiece's reader, which stops its training there (not at the end of a long corpus) with an
    error of its own: ``_train_subwords`` raises the kept one instead, which names the file and line."""
    try:
        for c in corpora:
            yield from (pair[side] for pair in iter_parallel(c.src, c.tgt, skip_empty=skip_empty, log=lambda _: None))
    except DataError as problem:
        problems.append(problem)
        raise


def _train_subwords(config: TranslationConfig, out: Path, log: Callable[[str], None]) -> None:
    d, sw, layout = config.data, config.data.subword, RunLayout(out)
    corpora = config.data.train_corpora
    for path in (p for c in corpora for p in (c.src, c.tgt)):
        require_file(path)  # before the log line counts its sentences ("on 0 sentences" for a missing file)
    sentences = sum(count_lines(c.src) for c in corpora) * (2 if sw.joint else 1)
    sample = sw.sample_sentences if sentences > sw.sample_sentences else None
    options = dict(vocab_size=sw.vocab_size, model_type=sw.model_type, character_coverage=sw.character_coverage,
                   sample=sample)
    how = f"on a sample of {sample:,} of {sentences:,} sentences" if sample else f"on {sentences:,} sentences"
    problems: list[DataError] = []
    if sw.joint:
        log(f"training a joint {sw.model_type} sentencepiece model, vocabulary {sw.vocab_size}, {how}")
        texts = (t for side in (0, 1) for t in _texts(corpora, side, d.skip_empty, problems))
        jobs = [(texts, layout.subword_stem("joint"))]
    else:
        log(f"training source and target {sw.model_type} sentencepiece models, vocabulary {sw.vocab_size} each, "
            f"{how}")
        jobs = [(_texts(corpora, side, d.skip_empty, problems), layout.subword_stem(name))
                for side, name in ((1, "tgt"), (0, "src"))]
    files = ", ".join(str(p) for c in corpora for p in (c.src, c.tgt))
    content = _content([p for c in corpora for p in (c.src, c.tgt)])  # before reading, as for a corpus
    for texts, stem in jobs:
        try:
            SubwordModel.train(texts, model_path=stem, **options)
        except IncompleteModel as err:  # the disk's doing, not the settings'
            raise unwritable(err.problem, out.parent) from None
        except DataError as err:
            if problems:
                raise problems[0] from None
            # (the staging path sentencepiece wrote to is gone: name what the user can change instead)
            raise DataError(f"training the subword model on {files} with data.subword.vocab_size "
                            f"{sw.vocab_size} failed: {err.problem}") from None
        if problems:
            raise problems[0]
    (out / CONTENT).write_text(json.dumps(content), encoding="utf-8")


def _copy_atomic(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` whole or not at all (flushed to disk; an interrupted copy leaves nothing)."""
    with replacing_path(target) as tmp:
        shutil.copyfile(source, tmp)


def shared_subwords(config: TranslationConfig, run_dir: Path) -> SubwordPair:
    """The subword model(s) the main process of a distributed run put into ``run_dir`` (``subwords``), read by
    the other processes, which neither train nor copy one: a clear error naming the file where it is not there
    (the main process writes it before the others start reading; a process that does not find it sees another
    directory than the main one's). That it is the main process's file, not a stale one of the same name, is
    checked before (``training.shared_files``, by sha256)."""
    joint = config.data.subword.joint
    for path in RunLayout(run_dir).subword_models(joint=joint):
        if not path.is_file():
            raise DataError("no subword model here, where the main process (rank 0) writes it when training starts "
                            "and the other processes read it: every process must see the same run directory (on "
                            "several nodes, a shared filesystem at the same path)", path=str(path))
    return load_subwords(run_dir, joint=joint)


def subwords(config: TranslationConfig, run_dir: Path | None, log: Callable[[str], None], *,
             main: bool = True) -> SubwordPair:
    """The run's subword model(s): its own if it has them and a checkpoint trained with them (a resumed run),
    else the cache's (trained there once), copied into ``run_dir`` (``.vocab`` first, ``.model`` last: the model
    marks them done). A run killed before its first checkpoint starts again from step 0 on the data as it is
    now, so it takes the cache's model for that data, not the one it copied before (the data may have changed).
    ``main=False`` (a distributed run's other processes): the main process's copy in ``run_dir``, read only
    (``shared_subwords``)."""
    if not main:
        if run_dir is None:
            raise ValueError("only the main process prepares subword models outside a run directory")
        return shared_subwords(config, run_dir)
    joint = config.data.subword.joint
    if run_dir is not None and all(p.exists() for p in RunLayout(run_dir).subword_models(joint=joint)) \
            and CheckpointManager.has_checkpoints(run_dir):
        return load_subwords(run_dir, joint=joint)
    d = config.data
    # sentencepiece's version too: another version trains another model from the same texts and seed
    key = entry_key({"v": PREPARE_VERSION, "files": [[fingerprint(c.src), fingerprint(c.tgt)]
                                                     for c in config.data.train_corpora],
                     "subword": d.subword.model_dump(), "skip_empty": d.skip_empty,
                     "sentencepiece": _sentencepiece_version()})
    entry = cache_root() / f"subword-{key}"
    build_once(entry, check=lambda e: _complete_subwords(e, joint=joint, config=config),
               build=lambda tmp: _train_subwords(config, tmp, log), log=log)
    if run_dir is None:
        return load_subwords(entry, joint=joint)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    for target in RunLayout(run_dir).subword_files(joint=joint):  # .vocab first, .model last
        _copy_atomic(entry / target.name, target)
    return load_subwords(run_dir, joint=joint)


def _complete_subwords(entry: Path, *, joint: bool, config: TranslationConfig) -> SubwordPair:
    """A cache entry's subword models, if every file a run copies from it is there and it was trained on the files'
    present content (a DataError, so that ``build_once`` rebuilds it, otherwise: the entry was damaged from outside,
    or a file edited in place with its time set back). An entry from before ``CONTENT`` is trusted as before: a
    model learned from other text still encodes consistently (corpus entries are keyed by the model itself)."""
    missing = [p.name for p in RunLayout(entry).subword_files(joint=joint) if not p.exists()]
    if missing:
        raise DataError(f"the cached subword model lacks {', '.join(missing)}", path=str(entry))
    if (entry / CONTENT).exists():
        try:
            recorded = json.loads((entry / CONTENT).read_text(encoding="utf-8"))
        except ValueError:
            raise DataError(f"unreadable {CONTENT}", path=str(entry)) from None
        changed = _changed(recorded, [p for c in config.data.train_corpora for p in (c.src, c.tgt)])
        if changed:
            raise DataError(f"trained on other content of {changed} (the same size, ends and modification time)",
                            path=str(entry))
    return load_subwords(entry, joint=joint)


def _sentencepiece_version() -> str:
    from importlib.metadata import version

    return version("sentencepiece")


# ----------------------------------------------------------------------------- encoded corpora
def corpus_key(config: TranslationConfig, corpus: ParallelFiles, spm: SubwordPair) -> str:
    d = config.data
    return entry_key({"v": PREPARE_VERSION, "format": binarized.FORMAT_VERSION,
                      "files": [fingerprint(corpus.src), fingerprint(corpus.tgt)],
                      "subword": [spm.src.encoding_digest(), spm.tgt.encoding_digest()],
                      # the ids are its encoder's: another version may segment the same model's input otherwise
                      "sentencepiece": _sentencepiece_version(),
                      "max_len": d.max_len, "max_ratio": d.max_ratio, "skip_empty": d.skip_empty})


def no_pair_kept(config: TranslationConfig, corpus: ParallelFiles) -> DataError:
    """The error for a training corpus that data.max_len (and max_ratio) filter to nothing."""
    d = config.data
    return DataError(f"no training pair has 1 to data.max_len = {d.max_len} subword tokens on both sides"
                     + (f" within data.max_ratio = {d.max_ratio}" if d.max_ratio else ""), path=str(corpus.src))


def _encode_corpus(config: TranslationConfig, corpus: ParallelFiles, spm: SubwordPair, *, key: str, out: Path,
                   workers: int | None, log: Callable[[str], None]) -> None:
    d, start = config.data, time.monotonic()
    if workers is None:
        workers = (os.cpu_count() or 1) if os.path.getsize(corpus.src) > PARALLEL_ABOVE_BYTES else 1
    content = _content([corpus.src, corpus.tgt])  # before reading: an edit while encoding is seen the next time
    writer = DatasetWriter(out, dtype=token_dtype(max(spm.src.vocab_size, spm.tgt.vocab_size)))
    counts: dict = {}
    try:
        pairs = iter_parallel(corpus.src, corpus.tgt, skip_empty=d.skip_empty, log=lambda _: None, counts=counts)
        read, kept, no_ids = encode_into(writer, pairs, src_model=str(spm.src.path), tgt_model=str(spm.tgt.path),
                                         keep=LengthFilter(max_len=d.max_len, max_ratio=d.max_ratio), workers=workers)
        if not kept:  # refused before the entry is written: a cached empty corpus would only fail later
            raise no_pair_kept(config, corpus)
        # what a run reusing the entry logs again (corpus_report): the files it was built from, what was dropped
        writer.finish(key=key, extra={"src": str(corpus.src), "tgt": str(corpus.tgt), "read": read, **counts,
                                      "no_subword_tokens": no_ids, "content": content})
    except BaseException:
        writer.abort()
        raise
    log(f"encoded {corpus.src} / {corpus.tgt} with {workers} process(es) in {time.monotonic() - start:.1f} s")


def _content(paths: list[str]) -> list[dict]:
    """What an entry records of the files it was made from: each one's identity and whole sha256."""
    content = []
    for path in paths:
        try:
            content.append({"identity": identity(path), "sha256": content_sha256(path)})
        except OSError as err:  # named as the reader names it (not as the cache, which build_once says for OSErrors)
            raise DataError(f"cannot read: {err.strerror or err}", path=str(path)) from None
    return content


def _changed(recorded: object, paths: list[str]) -> str | None:
    """The first of ``paths`` whose content is not the ``_content`` recorded (or all of them, as one string, when
    the record is not of that form), else None. The keys' fingerprints sample a file's ends only, so a same-size
    edit between them whose modification time was set back (``touch -d``, ``cp -p``) keeps a key: a file whose
    ``identity`` is not the one recorded (written since, or another copy) is read whole and its sha256 compared."""
    if not (isinstance(recorded, list) and len(recorded) == len(paths) and all(isinstance(r, dict) for r in recorded)):
        return ", ".join(map(str, paths))
    for was, path in zip(recorded, paths):
        if was.get("identity") != identity(path) and was.get("sha256") != content_sha256(path):
            return str(path)
    return None


def _built_from(encoded: BinarizedCorpus, corpus: ParallelFiles) -> BinarizedCorpus:
    """``encoded`` if it was built from the files' present content (``_changed``), else a CacheError: it is built
    again (so is an entry from before entries recorded it)."""
    recorded = encoded.manifest.get("content")
    if recorded is None:
        raise CacheError("built before entries recorded their files' whole content", path=str(encoded.dir))
    changed = _changed(recorded, [corpus.src, corpus.tgt])
    if changed:
        raise CacheError(f"built from other content of {changed} (the same size, ends and modification time)",
                         path=str(encoded.dir))
    return encoded


def corpus_report(config: TranslationConfig, files: ParallelFiles, corpus: BinarizedCorpus) -> str:
    """How many of the files' pairs training reads and why the others are left out (pairs with an empty side,
    ``data.skip_empty``; with a side sentencepiece encodes to no tokens; longer than ``data.max_len`` or beyond
    ``data.max_ratio``), from the entry's manifest: said by every run that uses the entry, not only the one that
    built it. ``files``: the run's own (an entry serves every copy of the same files)."""
    d, m = config.data, corpus.manifest
    kept, read = len(corpus), m["read"]
    limits = f"data.max_len {d.max_len}" + (f" or data.max_ratio {d.max_ratio}" if d.max_ratio else "")
    # (an entry built before they were counted apart holds them among those beyond the limits)
    no_ids = m.get("no_subword_tokens", 0)
    beyond = (f"{no_ids:,} with a side of no subword tokens, " if no_ids else "") + \
        f"{read - kept - no_ids:,} beyond {limits}"
    if "lines" not in m:  # an entry built before the counts were kept
        return f"{files.src} / {files.tgt}: {kept:,} of {read:,} non-empty pairs kept ({beyond})"
    empty = f"{m['skipped_empty']:,} with an empty side skipped, " if m["skipped_empty"] else ""
    return f"{files.src} / {files.tgt}: {kept:,} of {m['lines']:,} pairs kept ({empty}{beyond})"


def encoded_corpus(config: TranslationConfig, corpus: ParallelFiles, spm: SubwordPair, *,
                   log: Callable[[str], None], workers: int | None = None) -> BinarizedCorpus:
    """The corpus encoded with ``spm``, from the cache (built there if missing or not trusted)."""
    key = corpus_key(config, corpus, spm)
    entry = cache_root() / f"corpus-{key}"
    built = []
    encoded = build_once(entry, check=lambda e: _built_from(open_dataset(e, key=key), corpus),
                         build=lambda tmp: built.append(_encode_corpus(config, corpus, spm, key=key, out=tmp,
                                                                       workers=workers, log=log)),
                         log=log)
    log(corpus_report(config, corpus, encoded) + ("" if built else f"; encoded earlier, from the cache ({entry})"))
    return encoded


@dataclass
class TrainingData:
    """What training reads: the subword model(s) and the encoded corpora, with their lengths."""
    spm: SubwordPair
    corpora: list[BinarizedCorpus]

    def __post_init__(self):
        # (N, 2) ids per pair over all corpora, in order (pair k of corpus c follows corpus c - 1)
        self.lengths = (self.corpora[0].lengths if len(self.corpora) == 1
                        else np.concatenate([c.lengths for c in self.corpora]))

    def pair(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        for corpus in self.corpora:
            if k < len(corpus):
                return corpus.pair(k)
            k -= len(corpus)
        raise IndexError(k)

    def __len__(self) -> int:
        return sum(len(c) for c in self.corpora)


def prepare(config: TranslationConfig, run_dir: Path | None, *, log: Callable[[str], None],
            workers: int | None = None, main: bool = True) -> TrainingData:
    """Subword model(s) and encoded training corpora, from the cache or built into it. ``main=False``: a
    distributed run's other processes, which read the main process's subword model(s) from ``run_dir``
    (``subwords``); by then the main process has encoded the corpora into the cache, where they find them."""
    spm = subwords(config, run_dir, log, main=main)
    return TrainingData(spm, [encoded_corpus(config, c, spm, log=log, workers=workers)
                              for c in config.data.train_corpora])


def summary(config: TranslationConfig, data: TrainingData) -> str:
    """What ``sanlab prepare`` prints after its log (which said each corpus's ``corpus_report``): the subword
    model(s) and each encoded corpus, named by this config's files, with its size on disk."""
    lines = [f"subword model(s): {', '.join(sorted({str(data.spm.src.path), str(data.spm.tgt.path)}))}"]
    for files, corpus in zip(config.data.train_corpora, data.corpora):
        size = sum(f["bytes"] for f in corpus.manifest["files"].values())
        lines.append(f"{files.src} / {files.tgt}: {len(corpus):,} pairs, {size / 2**20:.1f} MiB in {corpus.dir}")
    return "\n".join(lines)
