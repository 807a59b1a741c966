"""The tagger's character CNN on distinct words vs on every word slot: whole training updates.

Builds the tagger recipe's task (data, vocabulary, model) in a scratch directory, takes the same real
batches of epoch 0, and times the trainer's own update (forward, backward, clipping, optimizer step)
with ``CharCNN.distinct_words`` on and off, in rounds whose order alternates, so that a load change
hits both alike. Reported: median updates/s of each, and the median over rounds of the ratio
(distinct / every slot, paired by round). Both start from the same weights; the updates differ only by
floating-point summation order (``tests/models/test_dufter_tagger.py`` checks values and gradients).

    .venv/bin/python bench/char_cnn.py configs/ud-ewt-tagger.yaml --threads 2 --updates 20 --rounds 3

Run it alone on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import tempfile
import time
from datetime import datetime
from itertools import cycle
from pathlib import Path

import torch

from sanlab.config import load_config
from sanlab.runs import make_task
from sanlab.training.logging import SilentLogger
from sanlab.training.loop import Trainer
from report import check_out, machine, run_main, whole_number, write_out  # bench/report.py


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="a tagging recipe, e.g. configs/ud-ewt-tagger.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE")
    p.add_argument("--threads", type=whole_number, default=2)
    p.add_argument("--updates", type=whole_number, default=20, help="updates per variant per round")
    p.add_argument("--rounds", type=whole_number, default=3)
    p.add_argument("--out", help="also write the Markdown table here")
    args = p.parse_args()
    check_out(p, args.out, "char_cnn.py")
    return args


def _time(trainer: Trainer, groups: cycle, updates: int) -> float:
    start = time.perf_counter()
    for _ in range(updates):
        trainer.update(next(groups))
    trainer.settle()  # an update does not wait for the device; this read does (and stops on a NaN)
    return time.perf_counter() - start


def main() -> int:
    args = _parse()
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.overrides)
    if config.task != "tagging":
        raise SystemExit(f"{args.config} is a {config.task} recipe; this bench needs a tagger")
    with tempfile.TemporaryDirectory() as scratch:
        torch.manual_seed(config.train.seed)
        log = SilentLogger(Path(scratch))
        task = make_task(config, Path(scratch), log)
        state = copy.deepcopy(task.model.state_dict())
        epoch = task.epoch_batches(0)  # built when read: take only the batches the rounds use
        # an epoch's batches are pending (each process encodes only those it trains on): encode them here,
        # outside the timed updates
        batches = [task.read(epoch[i]) for i in range(min(len(epoch), 2 + args.rounds * args.updates))]
        trainers, groups = {}, {}
        for name, distinct in (("every slot", False), ("distinct words", True)):
            task.model.load_state_dict(state)
            model = copy.deepcopy(task.model)
            model.char_cnn.distinct_words = distinct
            clone = copy.copy(task)
            clone.model = model
            trainers[name] = Trainer(task=clone, config=config.train, run_dir=Path(scratch), logger=log)
            # without the distinct words the batches bring (found while they are built, outside an update's time):
            # the forward finds them, so the distinct path pays for its torch.unique as it did before batches
            # brought them, and the two paths are timed on the same work
            groups[name] = cycle([[dataclasses.replace(b, char_words=None)] for b in batches])
        names = list(trainers)
        for name in names:  # warm-up
            _time(trainers[name], groups[name], 2)
        seconds = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                seconds[name].append(_time(trainers[name], groups[name], args.updates))
    rate = {n: statistics.median(args.updates / s for s in seconds[n]) for n in names}
    per_round = [a / b for a, b in zip(seconds["every slot"], seconds["distinct words"])]
    ratio = statistics.median(per_round)
    lines = [
        f"# Tagger character CNN: distinct words vs every slot ({datetime.now().astimezone():%Y-%m-%d})", "",
        f"Command: `python bench/char_cnn.py {' '.join(sys.argv[1:])}`", "",
        f"Machine: {machine()}, {args.threads} threads; "
        f"{args.rounds} rounds of {args.updates} updates each on the recipe's epoch-0 batches (batch "
        f"{config.train.batch_size} chunks).", "",
        "| char CNN runs on | updates/s | ratio |", "|---|---:|---:|",
        f"| every word slot (reference) | {rate['every slot']:.2f} | 1.00 |",
        f"| distinct words of the batch | {rate['distinct words']:.2f} | {ratio:.2f} |", "",
        "ratio: median over rounds of the speed of distinct words over every slot in the same round "
        f"(rounds: {', '.join(f'{r:.2f}' for r in per_round)}); it need not equal the ratio of the two "
        "median speeds.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_out(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
