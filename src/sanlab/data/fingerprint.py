"""Fingerprints of a run's training data, recorded when the run starts and checked when it resumes.

A fingerprint is a file's size and the sha256 of a sample of its bytes (the first and last 64 KiB), so
it costs two reads whatever the corpus size. The modification time alone decides nothing: copying or cloning
data changes it without changing the data, and a resume must not break on that. But a sample cannot see an
edit of the same length between its two ends, so a run also records the sha256 of each whole file
(``content_sha256``) and its ``identity``, and where a file was written or touched since (another modification
time, or another identity: ``touch -d`` and ``cp -p`` cannot set the status-change time back) with its size and
sample unchanged, ``changes`` reads the whole file and compares that. Cache keys use ``fingerprint`` (the modification
time in them makes a touched file a cache miss); a cache entry also records each file's ``identity`` and
whole sha256, so that an edit whose modification time was set back is not a stale hit either.
"""

from __future__ import annotations

import functools
import hashlib
import os
from datetime import datetime, timezone
from pathlib import Path

SAMPLE_BYTES = 1 << 16


def fingerprint(path: str | os.PathLike[str]) -> dict | None:
    """``{"size", "sample_sha256", "mtime"}`` of a file, or None if it is not there."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            digest = hashlib.sha256(f.read(SAMPLE_BYTES))
            if size > SAMPLE_BYTES:
                f.seek(max(size - SAMPLE_BYTES, SAMPLE_BYTES))
                digest.update(f.read())
            mtime_ns = os.fstat(f.fileno()).st_mtime_ns
    except OSError:  # not there, a directory, unreadable: reading the file says what is wrong, with its name
        return None
    # to the microsecond: an edit within the same second, at the same size, between the sampled ends must not
    # look untouched (records in seconds, from before, read as touched: their whole-file sha256 decides)
    when = datetime.fromtimestamp(mtime_ns // 1000 / 1e6, timezone.utc).isoformat(timespec="microseconds")
    return {"size": size, "sample_sha256": digest.hexdigest(), "mtime": when}


def fingerprints(paths: list[str]) -> dict[str, dict]:
    """Fingerprints by path; files that are not there are left out (reading them is the error)."""
    found = {p: fingerprint(p) for p in dict.fromkeys(paths)}
    return {p: f for p, f in found.items() if f is not None}


def identity(path: str | os.PathLike[str]) -> list[int]:
    """A file's size, modification and status-change times and inode. The status-change time cannot be set back
    (``touch -d`` and ``cp -p`` set it to now): a file with the same identity was not written since."""
    stat = os.stat(path)
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def content_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of the whole file (read once per process for a given ``identity``)."""
    return _content_sha256(str(path), *identity(path))


@functools.lru_cache(maxsize=64)
def _content_sha256(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def with_content(recorded: dict[str, dict], current: dict[str, dict]) -> dict[str, dict]:
    """``current`` as a run records it: each file's fingerprint with its ``identity`` and the sha256 of its whole
    content, which is read only where the recorded one cannot stand (a new file, or one touched or changed since)."""
    keep = ("size", "sample_sha256", "mtime")
    out = {}
    for path, new in current.items():
        old, now = recorded.get(path) or {}, identity(path)
        if old.get("sha256") and all(old.get(k) == new[k] for k in keep) and old.get("identity", now) == now:
            out[path] = {**new, "identity": now, "sha256": old["sha256"]}
        else:
            out[path] = {**new, "identity": now, "sha256": content_sha256(path)}
    return out


def changes(recorded: dict[str, dict], current: dict[str, dict]) -> dict[str, str]:
    """What differs, by path, between two ``fingerprints``: a file's size or its content. A file missing
    now is not listed: reading it fails with its own message. Where size and sample agree but the file was
    touched since (another modification time or ``identity``) and the record has the whole file's sha256, the
    whole file is read and compared."""
    found = {}
    for path, old in recorded.items():
        new = current.get(path)
        if new is None:
            continue
        when = f"modified {new['mtime']}, recorded {old.get('mtime')}"
        if (new["size"], new["sample_sha256"]) == (old.get("size"), old.get("sample_sha256")):
            touched = new["mtime"] != old.get("mtime") or old.get("identity") not in (None, identity(path))
            if old.get("sha256") and touched and content_sha256(path) != old["sha256"]:
                found[path] = f"same size and ends, other bytes in between (whole-file sha256); {when}"
            continue
        what = f"{old.get('size')} -> {new['size']} bytes" if new["size"] != old.get("size") else "same size, other bytes"
        found[path] = f"{what}; {when}"
    return found
