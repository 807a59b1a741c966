"""Fingerprints of a run's training data, recorded when the run starts and checked when it resumes.

A fingerprint is a file's size and the sha256 of a sample of its bytes (the first and last 64 KiB), so
it costs two reads whatever the corpus size. The modification time is recorded as information only:
copying or cloning data changes it without changing the data, and a resume must not break on that.
"""

from __future__ import annotations

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
            mtime = os.fstat(f.fileno()).st_mtime
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    return {"size": size, "sample_sha256": digest.hexdigest(),
            "mtime": datetime.fromtimestamp(mtime, timezone.utc).isoformat(timespec="seconds")}


def fingerprints(paths: list[str]) -> dict[str, dict]:
    """Fingerprints by path; files that are not there are left out (reading them is the error)."""
    found = {p: fingerprint(p) for p in dict.fromkeys(paths)}
    return {p: f for p, f in found.items() if f is not None}


def changes(recorded: dict[str, dict], current: dict[str, dict]) -> dict[str, str]:
    """What differs, by path, between two ``fingerprints``: a file's size or its content. A file missing
    now is not listed: reading it fails with its own message."""
    found = {}
    for path, old in recorded.items():
        new = current.get(path)
        if new is None or (new["size"], new["sample_sha256"]) == (old.get("size"), old.get("sample_sha256")):
            continue
        what = f"{old.get('size')} -> {new['size']} bytes" if new["size"] != old.get("size") else "same size, other bytes"
        found[path] = f"{what}; modified {new['mtime']}, recorded {old.get('mtime')}"
    return found
