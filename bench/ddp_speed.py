"""Data-parallel speed on this machine: N processes x 1 thread (torchrun + DDP) against 1 process x N
threads accumulating the same N batches per update, on a real recipe. Both runs do the same updates
over the same batches; speed is the trainer's own (update time only, no validation or data set-up).

    python bench/ddp_speed.py --updates 40 --out results/ddp-speed.md
    python bench/ddp_speed.py --config configs/ud-ewt-tagger.yaml --updates 100 --out results/ddp-speed-ud.md

Run it on an otherwise idle machine (see docs/performance.md): anything beside it
distorts both columns differently.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sanlab.training.logging import read_metrics
from report import check_out, machine, run_main, whole_number, write_out  # bench/report.py


def train(config: Path, run: Path, *, processes: int, threads: int, accum: int, updates: int) -> dict:
    command = [sys.executable, "-m", "sanlab", "train", str(config), "--run", str(run), "--quiet",
               "--nproc", str(processes), "--set", f"train.threads={threads}", "--set", f"train.accum_steps={accum}",
               "--set", f"train.max_steps={updates}", "--set", f"train.valid_every={updates}",
               "--set", "train.valid_max_sentences=20", "--set", "train.patience=0"]
    start = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - start
    lines = read_metrics(run)
    speed = [x for x in lines if x["split"] == "speed"][-1]
    return {"steps_per_s": speed["steps_per_s"], "tokens_per_s": speed["tokens_per_s"], "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("configs/multi30k-en-de-transformer.yaml"))
    parser.add_argument("--processes", type=whole_number, default=2)
    parser.add_argument("--updates", type=whole_number, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    check_out(parser, args.out, "ddp_speed.py")
    n = args.processes
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        # The baseline also prepares the vocabulary (subword model / tagger vocabulary); the DDP run reuses
        # it, so neither measurement includes it.
        base = train(args.config, work / "one", processes=1, threads=n, accum=n, updates=args.updates)
        (work / "ddp").mkdir()
        for shared in [*(work / "one").glob("subword.*"), *(work / "one").glob("tagger-vocab.json")]:
            shutil.copy(shared, work / "ddp" / shared.name)
        ddp = train(args.config, work / "ddp", processes=n, threads=1, accum=1, updates=args.updates)
    rows = [(f"1 process x {n} threads, accum {n}", base), (f"{n} processes x 1 thread (DDP, gloo)", ddp)]
    command = " ".join(["python bench/ddp_speed.py", "--config", str(args.config), "--processes", str(n),
                        "--updates", str(args.updates)] + (["--out", str(args.out)] if args.out else []))
    lines = [f"# Data-parallel training speed ({args.config.name}, {args.updates} updates of {n} batches)", "",
             f"Command: `{command}`  ",
             f"Machine: {machine()}; {time.strftime('%Y-%m-%d')}", "",
             "| run | updates/s | target tokens/s | ratio (tokens/s) | wall s (incl. start-up, validation) |",
             "|---|---:|---:|---:|---:|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['steps_per_s']:.3f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['tokens_per_s'] / base['tokens_per_s']:.2f} | {r['wall']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_out(args.out, text)


if __name__ == "__main__":
    run_main(main)
