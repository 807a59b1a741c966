"""An attention part of this checkout against another revision's: the same results? how fast?

The part's module (``--module``, e.g. ``sanlab.attention.parts.rel_pos``) at another revision is loaded beside the
current one (it imports the rest of the package as it is now). One model of the recipe is built and copied; in the
copy, every submodule whose class the module defines takes the other revision's class of the same name (the
parameters stay: a class holds only the arithmetic). Two trainers over the two models take the same batches of
the recipe's epoch 0 with the same random seeds, so dropout draws alike; rounds of U updates alternate the order
of the two. With ``--decode N`` both models then translate the first N dev sentences with the recipe's beam
search, alternating too. Reported: median updates/s (and sentences/s) of each, the median per-round ratio, how
far apart the two models' weights are after every round (a new form of the same arithmetic adds in another
order: rounding apart, growing slowly with the updates), and how many translations are identical.

    .venv/bin/python bench/part_versions.py configs/multi30k-en-de-relpos.yaml \\
        --module sanlab.attention.parts.rel_pos --against 574fc3e \\
        --threads 2 --updates 5 --rounds 6 --decode 200 --out results/rel-pos-tables-cpu-2026-12-02.md

On a GPU add ``--set train.device=cuda --set train.precision=bf16``. Run it alone on the machine
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from sanlab.config import load_config
from sanlab.runs import make_task
from sanlab.tasks.translation import search_translations
from sanlab.training.loop import Trainer
from sanlab.training.logging import SilentLogger
from report import check_out, machine, run_main, whole_number, write_out
from revisions import module_at_revision, timed_batches, versions_table  # bench/revisions.py (the script's folder is on sys.path)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a translation recipe (its data must be on this machine)")
    p.add_argument("--module", required=True, help="the part's module, e.g. sanlab.attention.parts.rel_pos")
    p.add_argument("--against", required=True, help="git revision whose copy of the module to compare with")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    p.add_argument("--threads", type=whole_number, default=2)
    p.add_argument("--updates", type=whole_number, default=5, help="timed updates per version and round")
    p.add_argument("--rounds", type=whole_number, default=6)
    p.add_argument("--decode", type=int, default=0, metavar="N", help="also time translating N dev sentences")
    p.add_argument("--out", help="also write the Markdown report here")
    args = p.parse_args()
    check_out(p, args.out, "part_versions.py")
    return args


def switch_classes(model: nn.Module, current: ModuleType, old: ModuleType) -> int:
    """Give every submodule whose class ``current`` defines ``old``'s class of that name; how many switched."""
    switched = 0
    for sub in model.modules():
        cls = type(sub)
        if cls.__module__ == current.__name__:
            stages = sub.stages() if hasattr(sub, "stages") else None
            sub.__class__ = getattr(old, cls.__name__)
            # an Attention sorted its parts by their stages when it was built: other stages would go unrun
            if stages is not None and sub.stages() != stages:
                raise SystemExit(f"part_versions.py: error: {cls.__name__} has stages {sorted(stages)} here and "
                                 f"{sorted(sub.stages())} in the other revision: the bench cannot switch it")
            switched += 1
    return switched


def largest_difference(a: nn.Module, b: nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k].float() - sb[k].float()).abs().max()) for k in sa if sa[k].is_floating_point())


def main() -> int:
    args = _parse()
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.set)
    current = importlib.import_module(args.module)
    old = module_at_revision(args.against, "src/" + args.module.replace(".", "/") + ".py", "part_at_revision")
    names = ["this checkout", f"at {args.against}"]
    with tempfile.TemporaryDirectory() as scratch:
        log = SilentLogger(Path(scratch))
        task = make_task(config, Path(scratch), log)
        batches = timed_batches(task, rounds=args.rounds, updates=args.updates, config_path=args.config)
        models = {names[0]: task.model, names[1]: copy.deepcopy(task.model)}
        switched = switch_classes(models[names[1]], current, old)
        if not switched:
            raise SystemExit(f"part_versions.py: error: no module of the model is a class of {args.module}: "
                             f"does the recipe (with --set) use the part?")
        trainers = {}
        for name in names:
            clone = copy.copy(task)
            clone.model = models[name]
            trainers[name] = Trainer(task=clone, config=config.train, run_dir=Path(scratch), logger=log)
        seconds: dict[str, list[float]] = {n: [] for n in names}
        apart = []
        for r in range(args.rounds):
            groups = [[b] for b in batches[r * args.updates:(r + 1) * args.updates]]
            for name in names if r % 2 == 0 else names[::-1]:
                torch.manual_seed(1000 + r)  # the same dropout for both
                start = time.perf_counter()
                for group in groups:
                    trainers[name].update(group)
                trainers[name].settle()
                seconds[name].append(time.perf_counter() - start)
            apart.append(largest_difference(*models.values()))
        decoded = decode_rounds(task, models, names, args) if args.decode else None
    lines = [
        f"# {args.module}: this checkout against {args.against} ({datetime.now().astimezone():%Y-%m-%d})", "",
        f"Command: `python bench/part_versions.py {' '.join(sys.argv[1:])}`", "",
        f"Machine: {machine(next(task.model.parameters()).device)}, {args.threads} threads; device "
        f"{config.train.device}, precision {config.train.precision}; {switched} module(s) switched; {args.rounds} "
        f"rounds of {args.updates} updates of `{args.config}` on its epoch-0 batches, the two versions alternating "
        "first.",
        "", *versions_table("version", "updates/s", names, seconds, args.updates), "",
        "Largest difference of any weight between the two models after each round: "
        + ", ".join(f"{x:.2e}" for x in apart) + ".",
    ]
    if decoded:
        lines += ["", *decoded]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_out(args.out, text)
    return 0


def decode_rounds(task, models: dict[str, nn.Module], names: list[str], args) -> list[str]:
    """Both models translate the first ``--decode`` dev sentences with the recipe's decoding, alternating first."""
    sentences = [src for src, _ in task.valid_raw[:args.decode]]
    seconds: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[str]] = {}
    for r in range(max(2, args.rounds // 2)):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            outputs[name] = search_translations(models[name], task.spm, sentences, decode=task.config.decode)
            seconds[name].append(time.perf_counter() - start)
    same = sum(a[0].tokens == b[0].tokens if a and b else a == b for a, b in zip(*(outputs[n] for n in names)))
    return [*versions_table("version", "sentences/s (beam search)", names, seconds, len(sentences)), "",
            f"{len(sentences)} dev sentences decoded in fp32 (whatever train.precision), {len(seconds[names[0]])} "
            f"rounds, the two versions alternating first; identical best hypotheses: {same} of {len(sentences)}."]

if __name__ == "__main__":
    raise SystemExit(run_main(main))
