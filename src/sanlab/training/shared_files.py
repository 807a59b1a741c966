"""The files a distributed run's main process writes when training starts and the others read (the subword
model(s), the tagger's vocabulary: ``Task.shared_files``), compared across the processes by sha256.

Only the main process builds them; the others read its copies from the run directory. A process that sees
another directory (a node without the shared filesystem, or with a stale copy of an earlier run at the same
path) would read another vocabulary, train embedding rows that mean other pieces, and nothing later would say
so: the comparison stops every process first, naming the files that differ and the ranks that read them.
"""

from __future__ import annotations

from pathlib import Path

from sanlab.errors import TrainingError
from sanlab.training.checkpoint import file_sha256


def digests(paths: list[Path]) -> list[tuple[str, str | None]]:
    """(path, sha256 or None where the file is not there) of each of ``paths``, in order."""
    return [(str(p), file_sha256(p) if Path(p).is_file() else None) for p in paths]


def check_same_files(dist, paths: list[Path]) -> None:
    """Every process's ``paths`` hold the main process's bytes, or a TrainingError on every process (all of
    them gather every process's digests, so all stop alike, none waits for another in a later collective).
    Called once the main process has written them, before the others read them; a collective of all
    processes (a no-op for one process)."""
    if not dist.enabled:  # (one process: its files are the main process's)
        return
    found = dist.gather(digests(paths))
    main = found[0]
    problems = []
    for rank, files in enumerate(found):
        for (path, digest), (main_path, main_digest) in zip(files, main):
            if digest == main_digest and digest is not None:
                continue
            if main_digest is None:
                if rank == 0:  # (said once: the main process should have written it)
                    problems.append(f"rank 0 has no {main_path}")
            elif digest is None:
                problems.append(f"rank {rank} has no {path}")
            else:
                problems.append(f"rank {rank}'s {path} (sha256 {digest[:12]}) differs from rank 0's {main_path} "
                                f"(sha256 {main_digest[:12]})")
    if problems:
        raise TrainingError(f"the processes do not read the files the main process wrote when training started "
                            f"({'; '.join(problems)}): every process must see the same run directory (on several "
                            f"nodes, a shared filesystem at the same path)")
