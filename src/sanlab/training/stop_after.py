"""``sanlab train --stop-after DURATION``: end a session cleanly at a wall-time limit, resumable exactly.

A property of the invocation, not of the run: never written into the run's config, and a resume without it (or
with another limit) continues the same run. The time counts from the start of the command (``started``), data
preparation and model building included, as a scheduler's wall-time limit does. Under ``sanlab train --nproc N``
the launcher passes its deadline to its workers (``DEADLINE_ENV``), so theirs counts from the same start. Within a
process the limit is kept by time.monotonic(): a clock change during a session (an NTP step) moves no limit.

Nothing here imports torch: the command line parses it.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from dataclasses import dataclass

# the launcher's deadline (seconds since the epoch, as time.time(): ``StopAfter.stop_at``) for the workers of
# `sanlab train --nproc N`, converted to their time.monotonic() on arrival
DEADLINE_ENV = "SANLAB_STOP_AT"
UNITS = {"s": 1, "m": 60, "h": 3600}
# what a session that stopped early (the limit, Ctrl-C) says to do next: under --overwrite "the same command" would
# empty the run and start it again, losing every session's training
RERUN = "rerun the same command to resume"
RERUN_WITHOUT_OVERWRITE = ("rerun the command without --overwrite to resume (with it, the run starts again from "
                           "update 0)")


def rerun_advice(*, overwrite: bool) -> str:
    """How to resume a ``sanlab train`` session that stopped early, for a command given ``--overwrite`` or not."""
    return RERUN_WITHOUT_OVERWRITE if overwrite else RERUN
_DURATION = re.compile(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))([smh])")


def parse_duration(text: str) -> float:
    """Seconds of ``text``: a number with a unit, ``90s``, ``9m``, ``1.5h``. A bare number is refused: it would be
    seconds to timeout(1) and hours to fairseq's --stop-time-hours. ValueError says why."""
    found = _DURATION.fullmatch(text.strip().lower())
    if found is None:
        if re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", text.strip()):
            raise ValueError(f"{text!r} has no unit: give one, e.g. {text.strip()}s or {text.strip()}m (s, m or h)")
        raise ValueError(f"expected a duration such as 90s, 9m or 1.5h (a number and s, m or h), got {text!r}")
    seconds = float(found.group(1)) * UNITS[found.group(2)]
    if seconds <= 0:
        raise ValueError(f"expected a duration above 0, got {text!r}")
    return seconds


def duration_argument(text: str) -> str:
    """argparse type of ``--stop-after`` (``train`` and ``compare``): checked here, kept as given (for messages)."""
    try:
        parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


@dataclass(frozen=True)
class StopAfter:
    """The limit as given (``text``, for messages) and the time.monotonic() it ends at (``deadline_mono``): the
    clock no NTP step or clock set by hand moves. A wall-clock time stands for it only where it crosses processes
    (``stop_at``), converted back on arrival (``arriving``): a monotonic clock's reference is a process's own."""

    text: str
    deadline_mono: float
    rerun: str = RERUN  # how the stop message says to resume (``rerun_advice``)

    @classmethod
    def starting(cls, text: str, started: float | None = None, *, rerun: str = RERUN) -> StopAfter:
        """The limit ``text`` counted from ``started`` (a time.monotonic() reading; default now). In a worker of
        ``sanlab train --nproc`` the launcher's deadline, which counts from the launcher's start."""
        seconds = parse_duration(text)
        inherited = os.environ.get(DEADLINE_ENV) if "WORLD_SIZE" in os.environ else None
        if inherited:
            return cls.arriving(text, float(inherited), rerun)
        return cls(text, (time.monotonic() if started is None else started) + seconds, rerun)

    @classmethod
    def arriving(cls, text: str, stop_at: float, rerun: str = RERUN) -> StopAfter:
        """The limit another process handed over as a wall-clock time (``stop_at``, time.time()), converted here
        once: the wall clock moving later moves it no more."""
        return cls(text, time.monotonic() + (stop_at - time.time()), rerun)

    def stop_at(self) -> float:
        """The deadline as a wall-clock time (time.time()), to hand to another process (``arriving`` there)."""
        return time.time() + (self.deadline_mono - time.monotonic())

    def __reduce__(self):  # pickled to a spawned process (``sanlab compare --jobs``): by the wall clock, as above
        return StopAfter.arriving, (self.text, self.stop_at(), self.rerun)

    def reached(self) -> bool:
        return self.reached_after() is not None

    def reached_after(self) -> float | None:
        """Seconds since the start the limit counts from, where the limit is reached now (one look at the clock,
        so the stop says when it was seen, not when the checkpoint after it was written); else None."""
        now = time.monotonic()
        return now - self._start_mono() if now >= self.deadline_mono else None

    def since_start(self) -> float:
        """Seconds since the start the limit counts from (the command's; under ``--nproc``, the launcher's)."""
        return time.monotonic() - self._start_mono()

    def _start_mono(self) -> float:
        return self.deadline_mono - parse_duration(self.text)

    def message(self, where: str, *, since_start: float, training: float) -> str:
        """Why a session the limit ended at ``where`` (``stopped_at``) stopped: train.log's last line ends with it,
        the CLI prints it after "stopped: ". Both times are said, and which is which: the limit counts from the
        command's start (``since_start``), the session's time in train.log (``training``) from its loop's, so
        "stopped after 20s" beside "(18s this session)" read as a contradiction."""
        from sanlab.training.logging import duration  # (tqdm: not imported where the command line is parsed)

        return (f"--stop-after {self.text} reached at {where}, {duration(since_start)} after the command started "
                f"({duration(training)} of them training); {self.rerun}")


def stopped_at(step: int, *, max_steps: int, epochs: tuple[int, int] | None = None) -> str:
    """Where a session stopped, against the bound that ends the run: ``update 1,234 of 3,000`` (train.max_steps), or
    where ``epochs`` (done, train.max_epochs) ends it first, ``update 1,234 (2 of 20 epochs done)`` (a tagger's
    train.max_steps is its default 100,000, far from its end). Epochs done, not the one under way: train.log numbers
    epochs from 0."""
    if epochs is None:
        return f"update {step:,} of {max_steps:,}"
    return f"update {step:,} ({epochs[0]:,} of {epochs[1]:,} epochs done)"
