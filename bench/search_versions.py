"""Beam search of this checkout against another revision's: the same hypotheses? how fast?

The search (``sanlab/decoding/search.py``) imports nothing from models, so another revision's file can be
loaded beside the current one and both can decode with the same model in one process. Two workloads:

* ``bookkeeping``: a step that only looks up precomputed log-probabilities ([B sentences, k beams, V]), so
  the time is the search's own work (top-k, finishing hypotheses, reordering); sentences finish at different
  steps as EOS grows likelier.
* ``--run DIR``: a trained translation run's checkpoint decodes ``--input`` (one sentence per line) with its
  own decoding settings, as ``sanlab translate`` does; reported: seconds per round and in how many sentences
  the two searches gave the same output (they must agree on all).

Rounds alternate the order of the two searches. Reported: median seconds and the median per-round ratio.

    .venv/bin/python bench/search_versions.py --against 54332da --threads 1 \\
        --run results/compare/csan-table1-multi30k/bi-direct/seed-1 \\
        --input ../shared/data/multi30k/test_2016_flickr.en.gz --out results/decode-search-2026-11-27.md

Run it alone on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from types import ModuleType

import torch

import sanlab.decoding.search as current
import sanlab.tasks.translation as translation
from report import check_out, machine, run_main, whole_number, write_out
from revisions import module_at_revision  # bench/revisions.py (the script's folder is on sys.path)


def load_revision(rev: str) -> ModuleType:
    """``sanlab/decoding/search.py`` as it is at git revision ``rev``, as a module of its own."""
    return module_at_revision(rev, "src/sanlab/decoding/search.py", "search_at_revision")


def bookkeeping(search: ModuleType, *, sentences: int, beam: int, vocab: int, length: int):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(sentences, length, vocab, generator=g).mul_(3).log_softmax(-1)
    table[:, :, 3] = torch.linspace(-12.0, -1.0, length)  # EOS (id 3) grows likelier with every step

    def step(tokens, cache):
        sentence, t = cache
        return table[sentence, t], (sentence, t + 1)

    def run():
        hyps = search.beam_search(step, (torch.arange(sentences), torch.zeros(sentences, dtype=torch.long)),
                                  batch_size=sentences, beam_size=beam, bos=2, eos=3, pad=0,
                                  max_lengths=torch.full((sentences,), length))
        return [h[0].tokens for h in hyps]
    return run


def translating(search: ModuleType, run_dir: Path, lines: list[str]):
    from sanlab.runs.trained import load_trained

    config, model, spm = load_trained(run_dir, checkpoint="best")

    def run():
        translation.beam_search = search.beam_search  # translate() calls the module-level name
        try:
            return translation.translate(model, spm, lines, decode=config.decode)
        finally:
            translation.beam_search = current.beam_search
    return run


def timed(workloads: dict, rounds: int) -> tuple[dict, dict]:
    seconds: dict = {name: [] for name in workloads}
    outputs: dict = {}
    for r in range(rounds):
        for name in (list(workloads) if r % 2 == 0 else list(reversed(workloads))):
            start = time.perf_counter()
            outputs[name] = workloads[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds, outputs


def rows(title: str, seconds: dict, outputs: dict, against: str) -> list[str]:
    base = seconds[against]
    same = sum(a == b for a, b in zip(outputs["this checkout"], outputs[against]))
    lines = [f"### {title}", "", "| search | seconds (median) | vs " + against + " (median of per-round ratios) "
             "| seconds per round |", "|---|---:|---:|---|"]
    for name, secs in seconds.items():
        ratio = statistics.median(s / b for s, b in zip(secs, base))
        lines.append(f"| {name} | {statistics.median(secs):.2f} | {ratio:.2f} | {' '.join(f'{s:.2f}' for s in secs)} |")
    lines += ["", f"Same output in {same} of {len(outputs[against])} sentences.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="git revision whose search.py is the baseline")
    parser.add_argument("--rounds", type=whole_number, default=4)
    parser.add_argument("--threads", type=whole_number, default=1)
    parser.add_argument("--sentences", type=whole_number, default=64, help="bookkeeping: sentences in the batch")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--run", type=Path, help="a trained translation run (its best checkpoint decodes --input)")
    parser.add_argument("--input", type=Path, help="source sentences, one per line, .gz or not (with --run)")
    parser.add_argument("--out", type=Path, help="also write the report here (markdown)")
    args = parser.parse_args()
    check_out(parser, args.out, "search_versions.py")
    if (args.run is None) != (args.input is None):
        parser.error("--run and --input go together")
    torch.set_num_threads(args.threads)
    baseline = load_revision(args.against)
    searches = {"this checkout": current, args.against: baseline}
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [f"## Beam search: this checkout ({revision}, working tree) vs {args.against}", "",
             f"- command: `python bench/search_versions.py {' '.join(sys.argv[1:])}`",
             f"- machine: {machine()}, {torch.get_num_threads()} torch thread(s)",
             f"- date: {datetime.now().astimezone().isoformat(timespec='seconds')}", ""]
    with torch.no_grad():
        work = {name: bookkeeping(s, sentences=args.sentences, beam=args.beam, vocab=args.vocab, length=args.length)
                for name, s in searches.items()}
        lines += rows(f"Bookkeeping: {args.sentences} sentences, beam {args.beam}, V {args.vocab}, up to "
                      f"{args.length} steps, a table-lookup step", *timed(work, args.rounds), args.against)
        if args.run:
            opener = gzip.open if args.input.suffix == ".gz" else open
            with opener(args.input, "rt", encoding="utf-8") as f:
                text = f.read().splitlines()
            work = {name: translating(s, args.run, text) for name, s in searches.items()}
            lines += rows(f"Translating {len(text)} sentences with {args.run} (best checkpoint, its decode settings)",
                          *timed(work, args.rounds), args.against)
    report = "\n".join(lines)
    print(report)
    if args.out:
        write_out(args.out, report + "\n")


if __name__ == "__main__":
    run_main(main)
