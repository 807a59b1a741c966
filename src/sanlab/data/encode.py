"""Encoding a parallel corpus with sentencepiece in worker processes, into a ``DatasetWriter``.

The main process reads the two files (``iter_parallel``) and hands out chunks of pairs; each worker
loads the subword model(s) once and returns the chunk's ids as numpy arrays. Chunks come back in
order, so the dataset's pair k is the k-th kept pair of the files, as in the in-memory path. At most
``AHEAD_PER_WORKER`` chunks a worker are read ahead (a paper-scale corpus is never held in memory whole), and a
worker that dies (killed for memory, say) ends the encoding with an error instead of a wait that never ends.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import numpy as np
import sentencepiece as spm

from sanlab.data.binarized import DatasetWriter
from sanlab.errors import SanlabError

CHUNK_PAIRS = 20_000
AHEAD_PER_WORKER = 2  # chunks handed out and not yet written, per worker
_worker: dict = {}


class EncodingWorkerDied(SanlabError):
    """A worker process of ``encode_into`` ended before its chunk was encoded; nothing was written."""


@dataclass(frozen=True)
class LengthFilter:
    """The training filter of ``parallel.length_filter``: 1 to ``max_len`` ids a side, within ``max_ratio``."""
    max_len: int
    max_ratio: float | None = None

    def keep(self, src_len: np.ndarray, tgt_len: np.ndarray) -> np.ndarray:
        short, long_ = np.minimum(src_len, tgt_len), np.maximum(src_len, tgt_len)
        ok = (short >= 1) & (long_ <= self.max_len)
        if self.max_ratio is not None:
            ok &= long_ <= self.max_ratio * short
        return ok


def _load(src_model: str, tgt_model: str) -> None:
    _worker["src"] = spm.SentencePieceProcessor(model_file=src_model)
    _worker["tgt"] = _worker["src"] if tgt_model == src_model else spm.SentencePieceProcessor(model_file=tgt_model)


Encoded = tuple[np.ndarray, np.ndarray]  # (flat ids, ids per sentence) of one side of a chunk


def _flat(rows: list[list[int]]) -> Encoded:
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    return np.fromiter(itertools.chain.from_iterable(rows), np.int32, int(lengths.sum())), lengths


def _encode(chunk: list[tuple[str, str]]) -> tuple[Encoded, Encoded]:
    return _flat(_worker["src"].encode([s for s, _ in chunk])), _flat(_worker["tgt"].encode([t for _, t in chunk]))


def _chunks(pairs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    it = iter(pairs)
    while chunk := list(itertools.islice(it, CHUNK_PAIRS)):
        yield chunk


def encode_into(writer: DatasetWriter, pairs: Iterable[tuple[str, str]], *, src_model: str, tgt_model: str,
                keep: LengthFilter, workers: int) -> tuple[int, int, int]:
    """Encode ``pairs`` and append those ``keep`` accepts to ``writer``; (pairs read, pairs kept, pairs with a side
    of no ids: a line sentencepiece's normaliser empties, such as a zero-width space alone, which ``keep`` drops
    for that and not for its length). ``workers`` = 1 encodes in this process (no pool to start)."""
    if workers <= 1:
        _load(src_model, tgt_model)
        results = map(_encode, _chunks(pairs))
        return _drain(writer, results, keep)
    _load(src_model, tgt_model)  # here first: a model that does not load is its own error, not a broken pool
    # spawn, not fork: the parent may hold threads (torch's), which a forked child would inherit locked
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_load,
                             initargs=(src_model, tgt_model)) as pool:
        try:
            return _drain(writer, _in_order(pool, _chunks(pairs), ahead=AHEAD_PER_WORKER * workers), keep)
        except BrokenProcessPool:
            raise EncodingWorkerDied(f"a process encoding the corpus with {src_model} ended before it finished (killed "
                                     f"from outside, perhaps for memory: {workers} processes were encoding; or it "
                                     "could not start: see any error printed above); nothing was kept. Run again, "
                                     "with fewer --workers to need less memory") from None


def _in_order(pool: ProcessPoolExecutor, chunks: Iterator[list[tuple[str, str]]], *, ahead: int
              ) -> Iterator[tuple[Encoded, Encoded]]:
    """``_encode`` of each chunk, in order, with at most ``ahead`` chunks handed out at a time (``Pool.imap`` and
    ``Executor.map`` read the whole input first, and ``imap`` waits forever for a worker that died)."""
    pending = collections.deque(pool.submit(_encode, chunk) for chunk in itertools.islice(chunks, ahead))
    while pending:
        done = pending.popleft().result()  # BrokenProcessPool if a worker died
        pending.extend(pool.submit(_encode, chunk) for chunk in itertools.islice(chunks, 1))
        yield done


def _drain(writer: DatasetWriter, results: Iterable[tuple[Encoded, Encoded]],
           keep: LengthFilter) -> tuple[int, int, int]:
    read = kept = no_ids = 0
    for (src, src_len), (tgt, tgt_len) in results:
        ok = keep.keep(src_len, tgt_len)
        writer.add(src[np.repeat(ok, src_len)], src_len[ok], tgt[np.repeat(ok, tgt_len)], tgt_len[ok])
        read, kept = read + len(ok), kept + int(ok.sum())
        no_ids += int(np.count_nonzero(np.minimum(src_len, tgt_len) == 0))
    return read, kept, no_ids
