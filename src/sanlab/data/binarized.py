"""A binarized parallel corpus on disk: token ids in flat arrays, written once, read a batch at a time.

One dataset directory holds numpy ``.npy`` files (``np.load(path, mmap_mode="r")`` opens any of them):

    src.tokens.npy   uint16 (int32 for vocabularies above 65,535): every source sentence's ids, concatenated
    src.offsets.npy  int64 (N + 1): sentence k is tokens[offsets[k]:offsets[k + 1]]
    tgt.tokens.npy, tgt.offsets.npy   the same for the target side
    lengths.npy      uint16 or int32 (N, 2): (source, target) ids per pair, without EOS/BOS
    manifest.json    written last: format version, the key it was built for, N, each file's size and sha256

A directory is built under a temporary name and renamed into place once its manifest is written, so a
killed writer leaves only a temporary directory that nothing reads. ``open_dataset`` checks every file
against the manifest (size and sha256) and raises ``CacheError`` for anything missing or different.

Training reads rows with ``os.pread`` rather than through a memory map: a map would count every page a
batch touched into the process's resident memory, which then grows with the corpus over an epoch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import weakref
from pathlib import Path

import numpy as np

from sanlab.errors import DataError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SIDES = ("src", "tgt")
_HASH_CHUNK = 1 << 22


class CacheError(DataError):
    """A cached dataset that is missing, incomplete or not what its manifest says."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _save(path: Path, array: np.ndarray) -> None:
    """``np.save`` through a Python file object: numpy writes an open file with ``ndarray.tofile``, which loses a
    small write to a full disk without a word and fails a large one with an OSError that has no errno."""
    array = np.ascontiguousarray(array)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
        f.write(array.data)


class DatasetWriter:
    """Appends encoded chunks to raw files in ``directory`` (a fresh temporary directory), then
    ``finish`` turns them into ``.npy`` arrays and writes the manifest last."""

    def __init__(self, directory: Path, *, dtype: np.dtype):
        self.dir, self.dtype = Path(directory), np.dtype(dtype)
        self.dir.mkdir(parents=True)
        self._raw = {f"{side}.tokens": open(self.dir / f"{side}.tokens.raw", "wb") for side in SIDES}
        self._lengths: list[np.ndarray] = []

    def add(self, src: np.ndarray, src_len: np.ndarray, tgt: np.ndarray, tgt_len: np.ndarray) -> None:
        """Append pairs: each side's ids concatenated, and the ids per sentence."""
        for side, flat in zip(SIDES, (src, tgt)):
            self._raw[f"{side}.tokens"].write(np.ascontiguousarray(flat, dtype=self.dtype).data)  # (see _save)
        # int32: a sentence's ids never reach 2**31, and WMT17's 20.6M pairs then hold 165 MB here, not 330
        self._lengths.append(np.stack([src_len, tgt_len], axis=1).astype(np.int32))

    def finish(self, *, key: str, extra: dict | None = None) -> dict:
        for f in self._raw.values():
            f.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros((0, 2), np.int32)
        small = lengths.size == 0 or int(lengths.max()) < 1 << 16
        _save(self.dir / "lengths.npy", lengths.astype(np.uint16 if small else np.int32))
        for k, side in enumerate(SIDES):
            offsets = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths[:, k], out=offsets[1:])
            _save(self.dir / f"{side}.offsets.npy", offsets)
            raw, n = self.dir / f"{side}.tokens.raw", int(offsets[-1])
            # the raw ids after an .npy header, copied in chunks: a paper-scale side is a GB or more, never read whole
            # (and not through a memory map, which a full disk answers with SIGBUS: the process dies without a word)
            at = 0
            with open(self.dir / f"{side}.tokens.npy", "wb") as out, open(raw, "rb") as f:
                np.lib.format.write_array_header_1_0(out, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                           "fortran_order": False, "shape": (n,)})
                while chunk := f.read(_HASH_CHUNK):
                    out.write(chunk)
                    at += len(chunk)
            if at != n * self.dtype.itemsize:
                raise CacheError(f"{at // self.dtype.itemsize} token ids written, the lengths add up to {n}",
                                 path=str(raw))
            raw.unlink()
        files = sorted(p.name for p in self.dir.glob("*.npy"))
        manifest = {"format": FORMAT_VERSION, "key": key, "pairs": len(lengths), "dtype": self.dtype.name,
                    "files": {name: {"bytes": (self.dir / name).stat().st_size, "sha256": _sha256(self.dir / name)}
                              for name in files}, **(extra or {})}
        for name in files:  # the data is on disk before the manifest says it is complete
            with open(self.dir / name, "rb+") as f:
                os.fsync(f.fileno())
        tmp = self.dir / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / MANIFEST)
        return manifest

    def abort(self) -> None:
        for f in self._raw.values():
            f.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def read_manifest(directory: Path, *, key: str, verify: bool = True) -> dict:
    """The manifest of a complete dataset built for ``key``; CacheError naming what is wrong otherwise.
    ``verify`` also recomputes every file's sha256 (a read of the whole dataset). A CacheError means the entry
    itself is incomplete or damaged (it is built again); the machine failing to read it (permissions, too many open
    files, a disk error) is the machine's OSError, raised as it is: the entry may be whole."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CacheError("no manifest: the dataset was never completed", path=str(directory)) from None
    except ValueError as exc:  # (UnicodeDecodeError included)
        raise CacheError(f"unreadable manifest: {exc}", path=str(directory / MANIFEST)) from None
    files = manifest.get("files", {}) if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(want, dict) and isinstance(want.get("bytes"), int) and isinstance(want.get("sha256"), str)
            for want in files.values()):
        raise CacheError("the manifest is not a JSON object of the expected form", path=str(directory / MANIFEST))
    if manifest.get("format") != FORMAT_VERSION or manifest.get("key") != key:
        raise CacheError(f"manifest is for format {manifest.get('format')} / key {manifest.get('key')}, "
                         f"expected {FORMAT_VERSION} / {key}", path=str(directory / MANIFEST))
    for name, want in manifest.get("files", {}).items():
        path = directory / name
        size = path.stat().st_size if path.is_file() else None
        if size != want["bytes"]:
            raise CacheError(f"{size} bytes, the manifest says {want['bytes']} (truncated or missing)", path=str(path))
        if verify and _sha256(path) != want["sha256"]:
            raise CacheError("sha256 differs from the manifest (corrupt)", path=str(path))
    return manifest


class _Rows:
    """Rows of one side, read with ``pread`` from the tokens and offsets files (see the module note)."""

    def __init__(self, directory: Path, side: str):
        self._tokens, self._tok_at, self.dtype = self._open(directory / f"{side}.tokens.npy")
        self._offsets, self._off_at, _ = self._open(directory / f"{side}.offsets.npy")

    @staticmethod
    def _open(path: Path) -> tuple[int, int, np.dtype]:
        array = np.load(path, mmap_mode="r")  # only to learn the header size and dtype
        at, dtype = array.offset, array.dtype
        del array
        return os.open(path, os.O_RDONLY), at, dtype

    def row(self, k: int) -> np.ndarray:
        start, end = np.frombuffer(os.pread(self._offsets, 16, self._off_at + 8 * k), dtype=np.int64)
        size = self.dtype.itemsize
        return np.frombuffer(os.pread(self._tokens, int(end - start) * size, self._tok_at + int(start) * size),
                             dtype=self.dtype)

    def close(self) -> None:
        for fd in (self._tokens, self._offsets):
            os.close(fd)


class BinarizedCorpus:
    """An opened dataset directory: ``lengths`` (N, 2) in memory, rows read on demand."""

    def __init__(self, directory: Path, manifest: dict):
        self.dir, self.manifest = Path(directory), manifest
        self.lengths = np.load(self.dir / "lengths.npy")
        self._rows = {side: _Rows(self.dir, side) for side in SIDES}
        weakref.finalize(self, _close, list(self._rows.values()))  # the files close with the object

    def __len__(self) -> int:
        return len(self.lengths)

    def pair(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target ids of pair ``k`` (int64 arrays, without EOS/BOS)."""
        return self._rows["src"].row(k).astype(np.int64), self._rows["tgt"].row(k).astype(np.int64)



def _close(rows: list[_Rows]) -> None:
    for r in rows:
        r.close()


def open_dataset(directory: Path, *, key: str, verify: bool = True) -> BinarizedCorpus:
    return BinarizedCorpus(directory, read_manifest(directory, key=key, verify=verify))
