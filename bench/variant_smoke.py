"""Train every variant recipe for a few hundred steps on the synthetic corpora; write a results table.

    python bench/variant_smoke.py --steps 300 --out results/variant-smoke.md
"""

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from sanlab.experiments.smoke import recipes, smoke_train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("results/variant-smoke.md"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", help="substring of the recipe names to run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for recipe in recipes():
            if args.only and args.only not in recipe.name:
                continue
            r = smoke_train(recipe, work=Path(work), steps=args.steps)
            rows.append(f"| {r.recipe} | {r.steps} | {r.first_loss:.3f} | {r.last_loss:.3f} | "
                        f"{'yes' if r.finite else 'NO'} | {'yes' if r.improved else 'NO'} | {r.seconds:.0f} |")
            print(rows[-1], flush=True)
    header = [f"# Variant smoke training ({args.steps} updates each, synthetic corpora)", "",
              f"Command: `python bench/variant_smoke.py --steps {args.steps} --threads {args.threads}`  ",
              f"Machine: {platform.machine()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}; "
              f"{time.strftime('%Y-%m-%d')}. Data: `sanlab.data.synthetic` (seed 1; translation 3,000 pairs, "
              "tagging 800 sentences); models shrunk to d=64 (see `sanlab/experiments/smoke.py`). Seconds are "
              "wall time and depend on machine load.", "",
              "| recipe | updates | loss (first 10%) | loss (last 10%) | finite | loss fell | seconds |",
              "|---|---|---|---|---|---|---|"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(header + rows) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
