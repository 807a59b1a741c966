"""The training update of this checkout against another revision's: the same weights? how fast?

``sanlab/training/loop.py`` at another revision is loaded beside the current one (it imports the rest of the
package as it is now), and two trainers over copies of one model take the same batches of a recipe's epoch 0
with the same random seeds, so dropout draws alike. Rounds of U updates alternate the order of the two; each
trainer's round ends with whatever makes the host wait for its updates (the current loop's ``settle``; the old
one read every update's loss itself). Reported: median updates/s of each, the median per-round ratio, and
whether the two models' weights are still bit-identical after every round (they must be, where only the
bookkeeping changed).

    .venv/bin/python bench/trainer_versions.py configs/multi30k-en-de-transformer.yaml --against ad4b4c4 \\
        --threads 2 --updates 10 --rounds 4 --out results/trainer-versions-2026-11-28.md

Run it alone on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import ModuleType

import torch

from sanlab.config import load_config
from sanlab.runs import make_task
from sanlab.training import loop as current
from sanlab.training.logging import SilentLogger
from report import check_out, machine, run_main, whole_number, write_out
from revisions import module_at_revision, timed_batches, versions_table  # bench/revisions.py (the script's folder is on sys.path)


def load_revision(rev: str) -> ModuleType:
    """``sanlab/training/loop.py`` as it is at git revision ``rev``, as a module of its own."""
    return module_at_revision(rev, "src/sanlab/training/loop.py", "loop_at_revision")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a translation or tagging recipe (its data must be on this machine)")
    p.add_argument("--against", required=True, help="git revision whose training/loop.py to compare with")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--threads", type=whole_number, default=2)
    p.add_argument("--updates", type=whole_number, default=10, help="timed updates per version and round")
    p.add_argument("--rounds", type=whole_number, default=4)
    p.add_argument("--out", help="also write the Markdown report here")
    args = p.parse_args()
    check_out(p, args.out, "trainer_versions.py")
    return args


def main() -> int:
    args = _parse()
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.set)
    old = load_revision(args.against)
    with tempfile.TemporaryDirectory() as scratch:
        log = SilentLogger(Path(scratch))
        task = make_task(config, Path(scratch), log)
        batches = timed_batches(task, rounds=args.rounds, updates=args.updates, config_path=args.config)
        trainers = {}
        for name, module in (("this checkout", current), (f"at {args.against}", old)):
            clone = copy.copy(task)
            clone.model = copy.deepcopy(task.model)
            trainers[name] = module.Trainer(task=clone, config=config.train, run_dir=Path(scratch), logger=log)
        names = list(trainers)
        seconds: dict[str, list[float]] = {n: [] for n in names}
        identical = []
        for r in range(args.rounds):
            groups = [[b] for b in batches[r * args.updates:(r + 1) * args.updates]]
            for name in names if r % 2 == 0 else names[::-1]:
                trainer = trainers[name]
                torch.manual_seed(1000 + r)  # the same dropout for both
                start = time.perf_counter()
                for group in groups:
                    trainer.update(group)
                if hasattr(trainer, "settle"):
                    trainer.settle()
                seconds[name].append(time.perf_counter() - start)
            a, b = (trainers[n].model.state_dict() for n in names)
            identical.append(all(torch.equal(a[k], b[k]) for k in a))
    lines = [
        f"# Training update: this checkout against {args.against} ({datetime.now().astimezone():%Y-%m-%d})", "",
        f"Command: `python bench/trainer_versions.py {' '.join(sys.argv[1:])}`", "",
        f"Machine: {machine()}, {args.threads} threads; "
        f"{args.rounds} rounds of {args.updates} updates of `{args.config}` on its epoch-0 batches, the two "
        "versions alternating first.", "",
        *versions_table("training/loop.py", "updates/s", names, seconds, args.updates), "",
        "Weights bit-identical after each round: " + ", ".join("yes" if same else "NO" for same in identical) + ".",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_out(args.out, text)
    return 0 if all(identical) else 1


if __name__ == "__main__":
    raise SystemExit(run_main(main))
