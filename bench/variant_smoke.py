"""Train every variant recipe for a few hundred steps on the synthetic corpora; write a results table.

    python bench/variant_smoke.py --steps 300 --out results/variant-smoke.md
    python bench/variant_smoke.py --steps 300 --only multi30k-en-de-lightconv --only ud-ewt-muse-ff.yaml
        # (re)run some rows, keep the rest; --only takes a recipe's exact name, with or without .yaml
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from sanlab.experiments.smoke import recipes, smoke_train
from report import check_out, command, machine, run_main, whole_number, write_out  # bench/report.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=whole_number, default=300)
    parser.add_argument("--out", type=Path, default=Path("results/variant-smoke.md"))
    parser.add_argument("--threads", type=whole_number, default=1)
    parser.add_argument("--only", action="append", default=[],
                        help="a recipe to run, by its exact name (e.g. ud-ewt-muse-ff or ud-ewt-muse-ff.yaml; "
                             "repeatable); rows of the others already in --out are kept")
    args = parser.parse_args()
    check_out(parser, args.out, "variant_smoke.py")
    chosen = _chosen(parser, args.only)
    torch.set_num_threads(args.threads)
    rows = _kept_rows(args.out) if args.only else {}
    with tempfile.TemporaryDirectory() as work:
        for recipe in recipes():
            if args.only and recipe.name not in chosen:
                continue
            r = smoke_train(recipe, work=Path(work), steps=args.steps)
            rows[r.recipe] = (f"| {r.recipe} | {r.steps} | {r.first_loss:.3f} | {r.last_loss:.3f} | "
                              f"{'yes' if r.finite else 'NO'} | {'yes' if r.improved else 'NO'} | {r.seconds:.0f} |")
            print(rows[r.recipe], flush=True)
    order = [recipe.name for recipe in recipes()]
    rows = [rows[name] for name in order if name in rows]
    header = [f"# Variant smoke training ({args.steps} updates each, synthetic corpora)", "",
              f"Command: `{command('variant_smoke.py')}`  ",
              f"Machine: {machine()}, {torch.get_num_threads()} thread(s); "
              f"{time.strftime('%Y-%m-%d')}. Data: `sanlab.data.synthetic` (seed 1; translation 3,000 pairs, "
              "tagging 800 sentences); models shrunk to d=64 (see `sanlab/experiments/smoke.py`). Seconds are "
              "wall time and depend on machine load; rows refreshed with `--only` keep the other rows of the "
              "previous run.", "",
              "| recipe | updates | loss (first 10%) | loss (last 10%) | finite | loss fell | seconds |",
              "|---|---|---|---|---|---|---|"]
    write_out(args.out, "\n".join(header + rows) + "\n")
    print(f"wrote {args.out}")


def _chosen(parser: argparse.ArgumentParser, only: list[str]) -> set[str]:
    """The recipe file names ``--only`` names, exactly (a substring matched too much: "muse" ran muse-ff too);
    an unknown name is refused with the known ones, before anything trains."""
    known = [recipe.name for recipe in recipes()]
    chosen, unknown = set(), []
    for name in only:
        file = name if name.endswith(".yaml") else f"{name}.yaml"
        if file in known:
            chosen.add(file)
        else:
            unknown.append(name)
    if unknown:
        parser.error(f"--only: no recipe named {', '.join(map(repr, unknown))}; the recipes are: "
                     f"{', '.join(Path(k).stem for k in known)}")
    return chosen


def _kept_rows(path: Path) -> dict[str, str]:
    """The table rows already in ``path``, by recipe file name."""
    if not path.exists():
        return {}
    lines = [line for line in path.read_text().splitlines() if line.startswith("| ") and ".yaml" in line]
    return {line.split("|")[1].strip(): line for line in lines}


if __name__ == "__main__":
    run_main(main)
