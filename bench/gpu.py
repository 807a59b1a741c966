"""Training throughput and model FLOP utilisation of every variant of a translation grid at its own size (GPU).

Issue 24's benchmark: Transformer-Base (the grid's baseline, e.g. CSAN Table 1 at WMT14 scale: 6+6 layers,
d 512, 8 heads, FFN 2048) and every other variant of the grid, trained on the same synthetic batches of about
``--tokens`` target tokens (source and target ``--length`` tokens, random ids of the configured vocabulary:
the arithmetic of a real batch of that shape, without the data). Each variant runs eager; ``--compile``
adds a compiled row for each variant named (all if none; ``torch.compile``, inductor; compile time excluded
from the rounds, reported apart); ``--deterministic`` an eager row under deterministic algorithms
(``train.deterministic``: what a bit-exact GPU run costs) for each variant named (all if none).

Timed: forward, label-smoothed loss, backward and an AdamW step, under ``--precision`` autocast, in rounds
whose order rotates, the device synchronised around each update. Reported: median ms per update, target
tokens/s, the ratio to the baseline's tokens/s paired by round, model FLOPs per update (counted by
``torch.utils.flop_counter`` on one forward and backward: what the model really computes, attention
included) and MFU against the device's dense peak for that precision (``--peak-tflops`` overrides the table),
and the operators an eager forward and backward dispatches (``op_count.py``: kernel launches on a GPU; counted
with the accelerator's paths, ``op_count.accelerator_paths``, also on the CPU).

``--profile DIR`` then runs ``--profile-updates`` more updates of each row under ``torch.profiler`` and writes
``DIR/profile.md``: per row, how busy the device was (its kernels' time over the wall time: the rest is
launch overhead and host work), the share of matrix products and attention kernels against everything else
(elementwise, normalisation, optimizer), and the ops that took the most device time; with
``--profile-trace``, also each row's Chrome trace (gzip). This says where the MFU below the target goes.

    python bench/gpu.py configs/compare/csan-table1-wmt14.yaml --device cuda --precision bf16 \\
        --compile vanilla 1D-CSAN --out results/gpu-train-speed.md     # on a GPU (scripts/gpu_check.sh)
    .venv/bin/python bench/gpu.py configs/compare/csan-table1-multi30k.yaml --quick --only 1D-CSAN  # CPU smoke
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from grid_speed import add_grid_arguments, bench_cells, provenance, refuse_unknown_variants
from op_count import accelerator_paths, count_ops
from report import check_out, device_argument, run_main, whole_number, write_out
from sanlab.experiments.grid import Cell, load_grid
from sanlab.models.builders import build_seq2seq, count_parameters
from sanlab.training.device import deterministic_algorithms

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
    ops: int | None = None  # operators of one forward and backward, eager (None: a compiled row)
    compile_seconds: float | None = None
    seconds: list[float] = field(default_factory=list)
    baseline: bool = False  # the grid's baseline, eager: the row the others' ratios are to


def make_batch(vocab: int, *, tokens: int, length: int, device: torch.device, seed: int = 0):
    batch = max(1, tokens // length)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (batch, length), generator=gen)
    tgt = torch.randint(4, vocab, (batch, length + 1), generator=gen)
    return src.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)


def check_length(parser: argparse.ArgumentParser, cells: list[Cell], length: int) -> None:
    """Refuse (status 2) a ``--length`` past a variant's ``model.max_positions``: its model refuses such sentences
    (a ValueError), which stopped the bench midway, after the rows before it."""
    for cell in cells:
        limit = cell.config.model.max_positions
        if length > limit:
            parser.error(f"--length {length}: longer than variant {cell.variant}'s model.max_positions ({limit}); "
                         f"give at most {limit} (or raise it with --set model.max_positions=...)")


def make_step(model, batch, precision: str, device: torch.device, *, compiled: bool, backend: str = "inductor",
              optimize: bool = True, deterministic: bool = False):
    """One update: forward, loss, backward and (``optimize``) the optimizer's step; (``deterministic``) under
    deterministic algorithms, switched on and off around each update, as the other rows run without."""
    # as training builds it (training/loop.build_optimizer): fused on CUDA
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if device.type == "cuda" else {}))
    forward = torch.compile(model, backend=backend) if compiled else model
    src, tgt_in, tgt_out = batch

    def step() -> None:
        with deterministic_algorithms(deterministic, device), \
                torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = forward(src, tgt_in)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), label_smoothing=0.1)
        with deterministic_algorithms(deterministic, device):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if optimize:
                optimizer.step()

    return step


def count_flops(step) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def prepare(cell: Cell, args, device: torch.device, batch, *, compiled: bool, deterministic: bool = False,
            baseline: bool = False) -> Runner:
    config = cell.config
    torch.manual_seed(config.train.seed)
    sw = config.data.subword
    model = build_seq2seq(config.model, vocab_size=sw.vocab_size, pad_id=0,
                          tgt_vocab_size=None if sw.joint else sw.vocab_size).to(device)
    name = cell.variant + (" (compiled)" if compiled else "") + (" (deterministic)" if deterministic else "")
    runner = Runner(name, model, make_step(model, batch, args.precision, device, compiled=compiled,
                                           backend=args.backend, deterministic=deterministic),
                    count_parameters(model), baseline=baseline)
    if compiled:  # the first calls compile (forward, backward): timed apart, never in the rounds
        start = time.perf_counter()
        for _ in range(2):
            runner.step()
        sync(device)
        runner.compile_seconds = time.perf_counter() - start
    runner.flops = count_flops(make_step(model, batch, args.precision, device, compiled=False))
    if not compiled:  # (the optimizer left out: fused on CUDA, one loop per parameter on the CPU)
        with accelerator_paths():  # a CPU's count is a GPU's launches
            runner.ops = count_ops(make_step(model, batch, args.precision, device, compiled=False, optimize=False,
                                             deterministic=deterministic))
    return runner


def optional_rows(cells: list[Cell], failed: list[str], build, kind: str) -> list[Runner]:
    """The rows ``build`` makes of ``cells``; one that fails (a compiler error, an operator with no deterministic
    form) is added to ``failed`` with its error and left out, so that the table of the others is still written."""
    rows = []
    for cell in cells:
        try:
            row = build(cell)
            row.step()  # one update before the rounds: what fails only when it runs fails here
            rows.append(row)
        except Exception as err:  # noqa: BLE001  (any failure of an optional row: said, not fatal)
            said = " ".join(str(err).split())[:300]
            failed.append(f"{cell.variant} ({kind}): {type(err).__name__}: {said}")
            print(f"gpu.py: the {kind} row of {cell.variant} failed, left out: {failed[-1]}", flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return rows


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
    # declared, not assumed first: a grid's `baseline: true` variant need not be its first
    [base] = [r for r in runners if r.baseline]
    lines = ["| variant | params | ms / update | target tokens / s | vs baseline | GFLOP / update | MFU | ops |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runners:
        ms = statistics.median(r.seconds) * 1e3
        ratio = statistics.median(b / s for b, s in zip(base.seconds, r.seconds))
        achieved = r.flops / (ms / 1e3) / 1e12
        mfu = f"{100 * achieved / peak:.1f}%" if peak else "n/a"
        compile_note = f" (compile {r.compile_seconds:.0f} s)" if r.compile_seconds is not None else ""
        lines.append(f"| {r.name}{' (baseline)' if r is base else ''}{compile_note} | {r.params:,} | {ms:.1f} | {tokens / (ms / 1e3):,.0f} | "
                     f"{ratio:.2f} | {r.flops / 1e9:,.4g} | {mfu} | {r.ops if r.ops is not None else '—'} |")
    lines += ["", "ops: the operators one forward and backward dispatches in eager mode, views and the optimizer "
                  "left out (bench/op_count.py): on a GPU, kernel launches"]
    return lines


# kernels and ops doing matrix products or attention (aten ops eager; cuBLAS/CUTLASS/flash kernels; inductor's extern mm)
PRODUCTS = re.compile(r"mm|gemm|matmul|linear|xmma|cutlass|cublas|flash|attention|sdpa|sm\d\d_", re.IGNORECASE)


def profile_rows(runners: list[Runner], *, updates: int, device: torch.device, out_dir: Path,
                 trace: bool) -> list[str]:
    """Each runner's breakdown under torch.profiler (after the timed rounds, so compilation is done), written to
    ``out_dir/profile.md`` after every row: a lease that runs out keeps the rows profiled so far."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    lines = [f"# Where an update's time goes ({updates} updates per row under torch.profiler)", "",
             "Device busy: the time of every kernel on the device over the wall time of the profiled updates (the "
             "profiler's own overhead counts against it). Products: matrix products and attention kernels. On a "
             "CPU the rows are ops, not kernels, and busy is not meaningful.", ""]
    for runner in runners:
        runner.step()
        sync(device)
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            for _ in range(updates):
                runner.step()
            sync(device)
        wall_us = (time.perf_counter() - start) * 1e6
        events = _device_events(prof.key_averages(), device)
        self_time = _self_time_attribute(events, device)
        total = sum(getattr(e, self_time) for e in events) or 1.0
        products = sum(getattr(e, self_time) for e in events if PRODUCTS.search(e.key))
        lines += [f"## {runner.name}", "",
                  f"- device busy {100 * total / wall_us:.0f}% of {wall_us / 1e3 / updates:.1f} ms per update; "
                  f"products {100 * products / total:.0f}% of device time, the rest {100 * (1 - products / total):.0f}%",
                  "", "| op | calls | self device ms / update | share |", "|---|---:|---:|---:|"]
        for e in sorted(events, key=lambda e: -getattr(e, self_time))[:25]:
            t = getattr(e, self_time)
            lines.append(f"| `{e.key[:90]}` | {e.count // updates} | {t / 1e3 / updates:.3f} | {100 * t / total:.1f}% |")
        lines.append("")
        (out_dir / "profile.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        if trace:
            path = out_dir / f"{re.sub(r'[^A-Za-z0-9]+', '-', runner.name).strip('-')}.trace.json"
            prof.export_chrome_trace(str(path))
            with open(path, "rb") as raw, gzip.open(f"{path}.gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            path.unlink()
    return lines


def _device_events(events, device: torch.device) -> list:
    """The events that ran on ``device``, as torch's own profiler table totals them: on CUDA the kernels (an aten
    op's device time is its kernels', and a ``record_function`` range spans kernels: counting either would count
    twice), on the CPU the ops."""
    from torch.autograd import DeviceType

    kind = DeviceType.CUDA if device.type == "cuda" else DeviceType.CPU
    return [e for e in events if e.key and e.device_type == kind and not getattr(e, "is_user_annotation", False)]


def _self_time_attribute(events, device: torch.device) -> str:
    """The name of an event's self time on ``device`` in this torch (renamed from cuda to device in 2.4)."""
    if device.type != "cuda":
        return "self_cpu_time_total"
    return "self_device_time_total" if events and hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_arguments(p)
    p.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--tokens", type=int, default=25_000, help="target tokens per update (CSAN's ~25k)")
    p.add_argument("--length", type=int, default=64,
                   help="source and target length of every sentence (at most model.max_positions)")
    p.add_argument("--compile", nargs="*", metavar="VARIANT",
                   help="also time these variants (all, if none is named) under torch.compile")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (eager/aot_eager: tests)")
    p.add_argument("--deterministic", nargs="*", metavar="VARIANT",
                   help="also time these variants (all, if none is named) under deterministic algorithms")
    p.add_argument("--rounds", type=whole_number, default=3)
    p.add_argument("--updates", type=whole_number, default=10, help="updates per variant and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, help="the device's peak for --precision (default: from a table)")
    p.add_argument("--quick", action="store_true", help="a CPU smoke run: tiny batch, 2 rounds of 1 update")
    p.add_argument("--out", help="also write the table to this Markdown file")
    p.add_argument("--profile", type=Path, metavar="DIR", help="then profile each row: DIR/profile.md (see above)")
    p.add_argument("--profile-updates", type=whole_number, default=3)
    p.add_argument("--profile-trace", action="store_true", help="with --profile: each row's Chrome trace, gzipped")
    args = p.parse_args()
    check_out(p, args.out, "gpu.py")
    args.device = device_argument(p, args.device)
    if args.quick:
        args.tokens, args.length, args.rounds, args.updates, args.warmup = 64, 8, 2, 1, 0
    torch.set_num_threads(args.threads)
    device = args.device
    grid = load_grid(args.grid, overrides=args.set)
    cells = bench_cells(grid, args)
    if cells[0].config.task != "translation":  # (its batch and FLOPs are a Seq2Seq model's)
        p.error(f"{args.grid}: the GPU bench times translation models, this grid is {cells[0].config.task}")
    check_length(p, cells, args.length)
    refuse_unknown_variants(grid, "--compile", args.compile)
    refuse_unknown_variants(grid, "--deterministic", args.deterministic)
    vocab = cells[0].config.data.subword.vocab_size
    batch = make_batch(vocab, tokens=args.tokens, length=args.length, device=device)
    runners = [prepare(c, args, device, batch, compiled=False, baseline=c.variant == grid.baseline) for c in cells]
    failed: list[str] = []  # optional rows that could not be built: named under the table, the rest still timed
    if args.compile is not None:
        runners += optional_rows([c for c in cells if not args.compile or c.variant in args.compile], failed,
                                 lambda c: prepare(c, args, device, batch, compiled=True), "compiled")
    if args.deterministic is not None:
        runners += optional_rows([c for c in cells if not args.deterministic or c.variant in args.deterministic],
                                 failed, lambda c: prepare(c, args, device, batch, compiled=False,
                                                           deterministic=True), "deterministic")
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
                 *table(runners, tokens=tokens, peak=peak),
                 *(["", "Rows that could not be built (not timed):", *(f"- {f}" for f in failed)] if failed else [])]
        print("\n".join(lines), flush=True)
        if args.out:
            write_out(args.out, "\n".join(lines) + "\n")  # whole, though rewritten after every round

    measure(runners, rounds=args.rounds, updates=args.updates, warmup=args.warmup, device=device,
            after_round=report)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        lines = profile_rows(runners, updates=args.profile_updates, device=device, out_dir=args.profile,
                             trace=args.profile_trace)
        print("\n".join(lines[:4] + [line for line in lines if line.startswith(("## ", "- device busy"))]), flush=True)


if __name__ == "__main__":
    run_main(main)
