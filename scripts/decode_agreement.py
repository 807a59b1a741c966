"""Decode one split of a translation run in fp32 and in bf16 and report how often the two agree (issue 24:
"decoding in bf16 gives the same hypotheses as fp32 on the committed Multi30k test set for >= 99% of
sentences").

    python scripts/decode_agreement.py --run RUN [--split test_2016_flickr] [--device cuda] [--checkpoint best]
                                       [--beam N] [--rounds N] [--output report.md]

Both passes load the same checkpoint once and decode with the run's ``decode`` settings (``--beam`` overrides
the beam; one hypothesis per sentence, as ``sanlab evaluate`` scores). bf16 is ``sanlab translate --precision
bf16``: the model's forward steps under autocast; the output projection, log-probabilities and beam scores in
fp32; the choice among the search's finished hypotheses by their fp32 scores. The report gives
the share of sentences whose hypotheses are identical (string equality of the detokenised output), BLEU and
chrF of each pass (sacreBLEU, against the split's references), the wall time of each pass (after a warm-up on a
few sentences in both precisions, so neither pays the first call's costs; with ``--rounds N`` the median of N
passes each, in an order that alternates from round to round, so that neither precision always runs first and a
change of load hits both alike, as in bench/char_cnn.py), the machine and the command, and the first sentences
that differ (the hypotheses are the first round's). It writes nothing into the run directory. ``--src``/``--ref`` point the split at
other files (a run whose config names data paths that this machine lays out elsewhere).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

TARGET = 99.0  # issue 24: identical hypotheses for at least this share of sentences
WARMUP_SENTENCES = 16
SCRIPT = "scripts/decode_agreement.py"  # named by the command line of every report (check_report_file)


def _timed(fn, device) -> tuple[object, float]:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def pass_order(names: list[str], round_: int) -> list[str]:
    """The order of the passes in round ``round_`` (0-based): as given in even rounds, reversed in odd ones."""
    return list(names) if round_ % 2 == 0 else list(names)[::-1]


def measure(run: Path, *, split: str | None = None, device: str = "auto", checkpoint: str = "best",
            beam: int | None = None, src: str | None = None, ref: str | None = None, rounds: int = 1,
            output: str | None = None) -> dict:
    """fp32 and bf16 hypotheses of ``split``, their scores and wall times (the median of ``rounds`` passes each,
    in alternating order), and what produced them. ``output`` (the report's file) is checked before decoding: it
    may not be the source or references read, nor a file of a run, nor a file that is no earlier report."""
    import torch

    from sanlab.data.parallel import read_parallel
    from sanlab.errors import ConfigError
    from sanlab.evaluation.bleu import corpus_scores
    from sanlab.files import check_output_file, check_report_file
    from sanlab.training.device import cpu_model
    from sanlab.runs.trained import load_checkpoint
    from sanlab.tasks.base import task_for
    from sanlab.tasks.translation import translate
    from sanlab.training.device import DECODE_PRECISIONS, decoding_precision, environment, model_device
    from sanlab.training.rundir import check_not_a_run_file

    config, model, spm, _, scored = load_checkpoint(run, checkpoint=checkpoint, device=device)
    task = task_for(config)
    task.require("translate", run)
    split = split or task.default_split(config)
    if split not in task.splits(config):
        raise ConfigError(f"unknown split {split!r}; {run} has: {', '.join(task.splits(config))}")
    default_src, default_ref = task.split_files(config, split)
    src_path, ref_path = Path(src or default_src), Path(ref or default_ref)
    if output is not None and Path(output).parent.is_dir():  # (a missing directory is made for it: nothing to replace)
        check_output_file(output, inputs=(src_path, ref_path))
    check_not_a_run_file(output, run)
    check_report_file(output, script=SCRIPT)  # an earlier report is replaced; any other file is the user's
    pairs = read_parallel(src_path, ref_path, keep_empty=True)  # every line, as `sanlab evaluate` scores
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    decode = config.decode.updated(n_best=1, beam=beam)
    where = model_device(model)
    precisions = {name: decoding_precision(name, where) for name in DECODE_PRECISIONS}
    for precision in precisions.values():  # warm-up: allocations, kernels, autocast's first casts
        translate(model, spm, sources[:WARMUP_SENTENCES], decode=decode, precision=precision)
    passes = {name: {"rounds": []} for name in precisions}
    for r in range(rounds):
        for name in pass_order(list(precisions), r):
            hyps, seconds = _timed(lambda p=precisions[name]: translate(model, spm, sources, decode=decode,
                                                                        source=str(src_path), precision=p), where)
            passes[name]["rounds"].append(seconds)
            passes[name].setdefault("hypotheses", hyps)  # the first round's: scored and compared
    for found in passes.values():
        found["seconds"] = statistics.median(found["rounds"])
        found["scores"] = corpus_scores(found["hypotheses"], refs)
    env = environment(where)
    return {"run": str(run), "which": checkpoint, **scored, "split": split,
            "src": str(src_path), "ref": str(ref_path), "sources": sources, "decode": decode.model_dump(),
            "passes": passes, "rounds": rounds, "device": str(where), "device_name": env.get("device_name") or cpu_model(),
            "torch": env["torch"], "cuda": env["cuda"], "threads": torch.get_num_threads(),
            "identical": sum(a == b for a, b in zip(passes["fp32"]["hypotheses"], passes["bf16"]["hypotheses"]))}


def report(found: dict, *, command: str, examples: int = 5) -> str:
    """The Markdown report of ``measure``'s result."""
    fp32, bf16 = found["passes"]["fp32"], found["passes"]["bf16"]
    n = len(found["sources"])
    share = 100.0 * found["identical"] / n if n else 100.0
    verdict = "meets" if share >= TARGET else "does not meet"
    d = found["decode"]
    form = " in GNMT's form" if d.get("length_penalty_style") == "gnmt" else ""  # (fairseq's: reports before the key)
    cpu = found["device"] == "cpu"
    lines = [
        f"# Decoding in bf16 against fp32: {found['run']}, {found['split']}",
        "",
        f"Identical hypotheses: **{found['identical']:,} of {n:,} sentences ({share:.2f}%)**, which {verdict} issue "
        f"24's criterion (at least {TARGET:g}%).",
        "",
        "| | fp32 | bf16 |",
        "|---|---:|---:|",
        f"| BLEU | {fp32['scores'].bleu:.2f} | {bf16['scores'].bleu:.2f} |",
        f"| chrF | {fp32['scores'].chrf:.2f} | {bf16['scores'].chrf:.2f} |",
        f"| wall time, s{' (median)' if found['rounds'] > 1 else ''} | {fp32['seconds']:.1f} | "
        f"{bf16['seconds']:.1f} |",
        f"| sentences/s | {n / max(fp32['seconds'], 1e-9):.1f} | {n / max(bf16['seconds'], 1e-9):.1f} |",
        "",
        f"- Run: `{found['run']}`, checkpoint {found['which']} (`{found['checkpoint']}`, update {found['step']}); "
        f"split {found['split']}: `{found['src']}` against `{found['ref']}`",
        f"- Decoding: beam {d['beam']}, length penalty {d['length_penalty']}{form}, max length {d['max_len_a']} x "
        f"source + {d['max_len_b']}, {d['batch_sentences']} sentences per batch; one hypothesis per sentence",
        "- bf16: the model's encoder pass and decoder steps under torch.autocast (bfloat16), the weights cast once "
        "per batch; the output projection, the log-softmax and the beam search's scores in fp32; the search keeps "
        "every finished hypothesis and the fp32 model, teacher-forced, chooses among them "
        "(`sanlab translate --precision bf16`)",
        f"- BLEU: sacreBLEU `{fp32['scores'].bleu_signature}`",
        f"- Wall time: decoding only (no loading, no scoring), after a warm-up on {WARMUP_SENTENCES} sentences in "
        "each precision" + (f"; the median of {found['rounds']} rounds, fp32 first in the odd rounds and bf16 "
                            "first in the even ones (seconds per round: fp32 "
                            f"{', '.join(f'{t:.1f}' for t in fp32['rounds'])}; bf16 "
                            f"{', '.join(f'{t:.1f}' for t in bf16['rounds'])})"
                            if found["rounds"] > 1 else ""),
        f"- Machine: {found['device']} ({found['device_name']}), torch {found['torch']}"
        + (f", CUDA {found['cuda']}" if found["device"].startswith("cuda") else "")
        + f", {found['threads']} CPU thread(s)",
        f"- Command: `{command}`",
        f"- Date: {datetime.date.today().isoformat()}",
    ]
    if cpu:
        lines += ["", "This is the CPU's bf16 (torch's CPU autocast), not a GPU's: the GPU measurement is the "
                  "`decode-agreement` step of `scripts/gpu_check.sh`."]
    differing = [k for k, (a, b) in enumerate(zip(fp32["hypotheses"], bf16["hypotheses"])) if a != b]
    if differing and examples:
        lines += ["", f"## Sentences that differ (the first {min(examples, len(differing))} of {len(differing)})", ""]
        for k in differing[:examples]:
            lines += [f"{k + 1}. source: {found['sources'][k]}", f"   - fp32: {fp32['hypotheses'][k]}",
                      f"   - bf16: {bf16['hypotheses'][k]}"]
    return "\n".join(lines) + "\n"


def write_report(path: Path, text: str) -> None:
    """The report whole (written beside ``path``, then renamed over it: one killed mid-write leaves the earlier
    report, not half of one); a terminal or a pipe (``/dev/stdout``) is written in place."""
    from sanlab.files import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
    else:
        write_text(path, text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a trained translation run directory")
    parser.add_argument("--split", help="a split of the run (default: its first test split, e.g. test_2016_flickr)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda | cuda:N")
    parser.add_argument("--checkpoint", default="best", help="best | last | averaged | step-N | a directory")
    parser.add_argument("--beam", type=int, help="beam size (default: the run's decode.beam)")
    parser.add_argument("--src", help="the split's source file (default: the one the run's config names)")
    parser.add_argument("--ref", help="the split's reference file (default: the one the run's config names)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="timed passes of each precision, in alternating order; the median is reported "
                             "(default 1)")
    parser.add_argument("--examples", type=int, default=5, help="differing sentences to show (default 5)")
    parser.add_argument("--output", help="write the Markdown report here too (it is always printed)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")

    from sanlab.errors import SanlabError

    try:
        found = measure(Path(args.run), split=args.split, device=args.device, checkpoint=args.checkpoint,
                        beam=args.beam, src=args.src, ref=args.ref, rounds=args.rounds,
                        output=args.output)
    except SanlabError as err:
        print(f"decode_agreement: error: {err}", file=sys.stderr)
        return 2
    command = shlex.join(["python", SCRIPT, *argv])
    text = report(found, command=command, examples=args.examples)
    if args.output:  # written before printing: a reader that stops early (`| head`) must not cost the report
        write_report(Path(args.output), text)
    try:
        print(text, end="", flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or the flush at exit fails again
    return 0


if __name__ == "__main__":
    sys.exit(main())
