"""Training throughput and model FLOP utilisation of every variant of a translation grid at its own size (GPU).

Issue 24's benchmark: Transformer-Base (the grid's baseline, e.g. CSAN Table 1 at WMT14 scale: 6+6 layers,
d 512, 8 heads, FFN 2048) and every other variant of the grid, trained on the same synthetic batches of about
``--tokens`` target tokens (source and target ``--length`` tokens, random ids of the configured vocabulary:
the arithmetic of a real batch of that shape, without the data). Each variant runs eager; ``--compile``
adds a compiled row for each variant named (all if none; ``torch.compile``, inductor; compile time excluded
from the rounds, reported apart).

Timed: forward, label-smoothed loss, backward and an AdamW step, under ``--precision`` autocast, in rounds
whose order rotates, the device synchronised around each update. Reported: median ms per update, target
tokens/s, the ratio to the baseline's tokens/s paired by round, model FLOPs per update (counted by
``torch.utils.flop_counter`` on one forward and backward: what the model really computes, attention
included) and MFU against the device's dense peak for that precision (``--peak-tflops`` overrides the table).

    python bench/gpu.py configs/compare/csan-table1-wmt14.yaml --device cuda --precision bf16 \\
        --compile vanilla 1D-CSAN --out results/gpu-train-speed.md     # on a GPU (scripts/gpu_check.sh)
    .venv/bin/python bench/gpu.py configs/compare/csan-table1-multi30k.yaml --quick --only 1D-CSAN  # CPU smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from grid_speed import add_grid_arguments, bench_cells, provenance
from sanlab.experiments.grid import Cell, load_grid
from sanlab.models.builders import build_seq2seq, count_parameters

# dense (not sparse) peak TFLOP/s per precision, from the vendors' data sheets
PEAKS = {"H100": {"bf16": 989.4, "fp32": 67.0}, "H200": {"bf16": 989.4, "fp32": 67.0},
         "A100": {"bf16": 312.0, "fp32": 19.5}, "L4": {"bf16": 121.0, "fp32": 30.3}}


@dataclass
class Runner:
    """One variant's model and optimizer on the device, and its timings per round."""

    name: str
    model: torch.nn.Module
    step: callable
    params: int
    flops: float = 0.0
    compile_seconds: float | None = None
    seconds: list[float] = field(default_factory=list)


def make_batch(vocab: int, *, tokens: int, length: int, device: torch.device, seed: int = 0):
    batch = max(1, tokens // length)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, length), generator=gen)
    tgt = torch.randint(4, vocab, (batch, length + 1), generator=gen)
    return src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)


def make_step(model, batch, precision: str, device: torch.device, *, compiled: bool, backend: str = "inductor"):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    forward = torch.compile(model, backend=backend) if compiled else model
    src, tgt_in, tgt_out = batch

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = forward(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def count_flops(step) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def prepare(cell: Cell, args, device: torch.device, batch, *, compiled: bool) -> Runner:
    config = cell.config
    torch.manual_seed(config.train.seed)
    sw = config.data.subword
    model = build_seq2seq(config.model, vocab_size=sw.vocab_size, pad_id=0,
                          tgt_vocab_size=None if sw.joint else sw.vocab_size).to(device)
    name = cell.variant + (" (compiled)" if compiled else "")
    runner = Runner(name, model, make_step(model, batch, args.precision, device, compiled=compiled,
                                           backend=args.backend),
                    count_parameters(model))
    if compiled:  # the first calls compile (forward, backward): timed apart, never in the rounds
        start = time.perf_counter()
        for _ in range(2):
            runner.step()
        sync(device)
        runner.compile_seconds = time.perf_counter() - start
    runner.flops = count_flops(make_step(model, batch, args.precision, device, compiled=False))
    return runner


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_tflops(device: torch.device, precision: str, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p.get(precision) for key, p in PEAKS.items() if key in name), None)


def measure(runners: list[Runner], *, rounds: int, updates: int, warmup: int, device: torch.device,
            after_round=lambda done: None) -> None:
    for r in range(rounds):
        order = runners[r % len(runners):] + runners[:r % len(runners)]
        for runner in order:
            for _ in range(warmup if r == 0 else 0):
                runner.step()
            sync(device)
            start = time.perf_counter()
            for _ in range(updates):
                runner.step()
            sync(device)  # a GPU runs asynchronously: time the work, not its launch
            runner.seconds.append((time.perf_counter() - start) / updates)
        after_round(r + 1)


def table(runners: list[Runner], *, tokens: int, peak: float | None) -> list[str]:
    base = runners[0]
    lines = ["| variant | params | ms / update | target tokens / s | vs baseline | GFLOP / update | MFU |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in runners:
        ms = statistics.median(r.seconds) * 1e3
        ratio = statistics.median(b / s for b, s in zip(base.seconds, r.seconds))
        achieved = r.flops / (ms / 1e3) / 1e12
        mfu = f"{100 * achieved / peak:.1f}%" if peak else "n/a"
        compile_note = f" (compile {r.compile_seconds:.0f} s)" if r.compile_seconds is not None else ""
        lines.append(f"| {r.name}{compile_note} | {r.params:,} | {ms:.1f} | {tokens / (ms / 1e3):,.0f} | "
                     f"{ratio:.2f} | {r.flops / 1e9:,.4g} | {mfu} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_arguments(p)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--tokens", type=int, default=25_000, help="target tokens per update (CSAN's ~25k)")
    p.add_argument("--length", type=int, default=64, help="source and target length of every sentence")
    p.add_argument("--compile", nargs="*", metavar="VARIANT",
                   help="also time these variants (all, if none is named) under torch.compile")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (eager/aot_eager: tests)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=10, help="updates per variant and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, help="the device's peak for --precision (default: from a table)")
    p.add_argument("--quick", action="store_true", help="a CPU smoke run: tiny batch, 2 rounds of 1 update")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args = p.parse_args()
    if args.quick:
        args.tokens, args.length, args.rounds, args.updates, args.warmup = 64, 8, 2, 1, 0
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    grid = load_grid(args.grid, overrides=args.set)
    cells = bench_cells(grid, args)
    vocab = cells[0].config.data.subword.vocab_size
    batch = make_batch(vocab, tokens=args.tokens, length=args.length, device=device)
    runners = [prepare(c, args, device, batch, compiled=False) for c in cells]
    if args.compile is not None:
        runners += [prepare(c, args, device, batch, compiled=True) for c in cells
                    if not args.compile or c.variant in args.compile]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    peak = peak_tflops(device, args.precision, args.peak_tflops)
    tokens = batch[0].shape[0] * args.length

    def report(done: int) -> None:
        """The table after each round (a lease that runs out keeps the rounds measured so far)."""
        partial = f" (partial: {done} of {args.rounds} rounds)" if done < args.rounds else ""
        lines = [f"# Training throughput per variant ({where}, {args.precision}){partial}", "",
                 *provenance("gpu.py", grid, args, cells,
                             f"{tokens:,} target tokens per update ({batch[0].shape[0]} x {args.length}), median "
                             f"of {done} rounds x {args.updates} updates; peak {peak or 'unknown'} TFLOP/s"),
                 *table(runners, tokens=tokens, peak=peak)]
        print("\n".join(lines), flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")

    measure(runners, rounds=args.rounds, updates=args.updates, warmup=args.warmup, device=device,
            after_round=report)


if __name__ == "__main__":
    main()
