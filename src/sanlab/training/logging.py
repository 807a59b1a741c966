"""What a run reports: console lines, ``train.log``, ``metrics.jsonl``, TensorBoard scalars, a progress bar; and
``read_metrics``, which reads the records of ``metrics.jsonl`` back."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from tqdm import tqdm

from sanlab.errors import ConfigError
from sanlab.training.layout import RunLayout


def duration(seconds: float) -> str:
    """A wall time as the console and logs show it (a session, a grid's cell, the demo): whole seconds from 10 s,
    a tenth below (a resumed run that only validates, or a tiny one, takes under one: whole seconds showed
    "0s"), "<0.1s" below that."""
    if seconds < 0.05:
        return "<0.1s"
    return f"{seconds:.1f}s" if seconds < 9.95 else f"{seconds:.0f}s"


class _NullBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kw) -> None: ...
    def close(self) -> None: ...


class _LineBar:
    """The progress bar where the console is not a terminal (a batch job's log file, a pipe): tqdm's redrawn bar
    would write every redraw there, hundreds of carriage-return frames per epoch. Instead one plain line each time
    the bar is given the latest "train" record (every ``log_every`` updates), as fairseq's simple log format."""

    def __init__(self, *, total: int, initial: int, desc: str):
        self.total, self.done, self.desc = total, initial, desc

    def update(self, n: int = 1) -> None:
        self.done += n

    def set_postfix(self, **kw) -> None:
        shown = ", ".join(f"{key} {value}" for key, value in kw.items())
        print(f"[{time.strftime('%H:%M:%S')}] {self.desc}: {self.done}/{self.total} batches, {shown}", file=sys.stderr,
              flush=True)

    def close(self) -> None: ...


class RunLogger:
    """Logs of one run directory. TensorBoard is opened lazily (its import is slow)."""

    def __init__(self, run_dir: Path, *, progress: bool = True, tensorboard: bool = True, quiet: bool = False):
        self.dir, self.layout = Path(run_dir), RunLayout(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.progress, self.use_tensorboard, self.quiet = progress, tensorboard, quiet
        self._writer = None
        self._purge_step: int | None = None

    def info(self, message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        if not self.quiet:
            tqdm.write(line, file=sys.stderr)
        with open(self.layout.train_log, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def scalars(self, split: str, values: dict[str, float], *, step: int) -> None:
        path, torn = self.layout.metrics, False
        if path.exists() and path.stat().st_size:  # a kill mid-write leaves a torn last line: start a new one
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                torn = f.read(1) != b"\n"
        with open(path, "a", encoding="utf-8") as f:
            f.write(("\n" if torn else "") + json.dumps({"split": split, "step": step, "time": time.time(),
                                                        **values}) + "\n")
        if self.use_tensorboard:
            writer = self._tensorboard()
            for key, value in values.items():
                writer.add_scalar(f"{split}/{key}", value, step)
            writer.flush()

    def truncate_after(self, step: int) -> int | None:
        """Drop the records of updates after ``step`` (those a crashed session logged after its last checkpoint,
        which the resumed run logs again), in ``metrics.jsonl`` and, when it is next written, TensorBoard. Returns
        the last update a dropped record names (a torn line's too, where its update was written before the kill;
        None if no dropped line names one), so that the resume can say how far the interrupted session had got:
        once dropped, nothing else records it."""
        from sanlab.files import write_text

        path, last = self.layout.metrics, None
        if path.exists():
            lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
            kept = [line for line in lines if _record_step(line) <= step]
            dropped = [line for line in lines if _record_step(line) > step]
            if dropped:
                write_text(path, "".join(line + "\n" for line in kept))
                named = [_torn_record_step(line) if _record_step(line) == float("inf") else int(_record_step(line))
                         for line in dropped]
                last = max((s for s in named if s is not None and s > step), default=None)
        self._purge_step = step + 1
        return last

    def _tensorboard(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.layout.tensorboard), purge_step=self._purge_step)
        return self._writer

    def progress_bar(self, *, total: int, initial: int, desc: str):
        if not self.progress or self.quiet:
            return _NullBar()
        if not sys.stderr.isatty():
            return _LineBar(total=total, initial=initial, desc=desc)
        return tqdm(total=total, initial=initial, desc=desc, unit="batch", leave=False, dynamic_ncols=True,
                    file=sys.stderr)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _record_step(line: str) -> float:
    """The update a metrics line records; a torn line (a kill mid-write) sorts last and is dropped."""
    try:
        return json.loads(line).get("step", 0)
    except (json.JSONDecodeError, AttributeError):
        return float("inf")


def _torn_record_step(line: str) -> int | None:
    """The update a torn metrics line names, if the kill came after its "step" field was written."""
    found = re.search(r'"step": (\d+)[,}]', line)
    return int(found[1]) if found else None


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``metrics.jsonl``. A line cut short by a kill while it was appended is skipped (the
    logger starts the next record on a new line); any other damage is an error naming the line."""
    path = RunLayout(run_dir).metrics
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if not line.startswith("{") or line.rstrip().endswith("}"):  # not a torn record: real damage
                raise ConfigError(f"{path}:{lineno}: not a JSON record ({err})") from None
    return records


class SilentLogger(RunLogger):
    """The logger of a distributed run's other processes: the main process reports for all."""

    def __init__(self, run_dir: Path):
        super().__init__(run_dir, progress=False, tensorboard=False, quiet=True)

    def info(self, message: str) -> None: ...
    def scalars(self, split: str, values: dict[str, float], *, step: int) -> None: ...
    def truncate_after(self, step: int) -> int | None: ...
