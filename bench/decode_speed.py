"""Beam-search decoding speed of every variant of a translation grid, measured alike.

Decoding cost depends on how many steps each hypothesis runs, and a model's own stopping decides that.
To time the step function and nothing else, every sentence here decodes exactly ``--length`` tokens:
EOS is banned before the last step and forced at it (``min_length``/``max_lengths`` of the search),
so every variant runs the same number of steps on the same rows, whatever its weights say. The models
are untrained (each cell's config, the grid's first seed), which changes none of the arithmetic; the
sources are the first ``--sentences`` validation sentences of each cell's own pipeline.

Timed: ``beam_search`` over the model's ``decode_step`` (encoder once per batch, then cached decoder
steps, the cache reordered after every step), in rounds that rotate the order of the variants, as in
``grid_speed.py``. Reported: median over rounds of sentences/s and of hypothesis tokens/s (sentences x
beam x length per second), and the median of the per-round ratio to the baseline.

``--recompute VARIANT`` adds a row for that variant (same weights) whose decoder self-attentions keep
their layer input and recompute the whole prefix at every step (``Attention.recompute_prefix``): the
reference path the caches replace (capsule routing keeps its routing cube's rows; spec
capsule-routing.md section 8). Under the table: in how many sentences both paths chose the same best
hypothesis.

``--reorder-whole VARIANT`` adds a row for that variant (the same model) whose search copies the whole cache after
every step, the source side included (encoder output, its mask, cross-attention keys and values): the path before
the search left those in place while no sentence leaves a batch (``decoding.cache.reorder``, ``within_sentences``).
Beam 2 or more: with one beam the search reorders nothing until a sentence leaves, whichever the row.

    .venv/bin/python bench/decode_speed.py configs/compare/csan-table1-multi30k.yaml --threads 2 \\
        --recompute capsule --out results/csan-multi30k-decode-speed.md

Run it alone on the machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

import torch

import sanlab.decoding.search as search
from grid_speed import add_grid_arguments, bench_cells, provenance
from op_count import count_ops
from report import check_out, device_argument, run_main, whole_number, write_out
from sanlab.attention import Attention
from sanlab.data.batching import pad_batch
from sanlab.experiments.cells import prepare_synthetic
from sanlab.experiments.grid import Cell, load_grid
from sanlab.runs import make_task
from sanlab.training.logging import SilentLogger


@dataclass
class Decoder:
    """One variant ready to decode: its untrained model and its batches of source ids."""

    name: str
    model: torch.nn.Module
    batches: list[torch.Tensor]  # [B, S] source ids, padded
    pad: int
    bos: int
    eos: int
    twin: "Decoder | None" = None  # for a reference row: the same model decoding the usual way
    precision: str = "fp32"        # bf16: the search under autocast (on the model's device)
    reorder_whole: bool = False    # the search copies the whole cache after every step
    seconds: list[float] = field(default_factory=list)  # per round
    ops_per_step: float | None = None  # operators dispatched per decoding step (bench/op_count.py)
    best: list[list[int]] = field(default_factory=list)  # the best hypothesis of each sentence, last round

    def first_batch(self) -> "Decoder":
        """The same decoder over its first batch only, with timings of its own (warm-up, counting)."""
        return replace(self, batches=self.batches[:1], seconds=[], best=[])

    def run(self, *, beam: int, length: int) -> float:
        start, best = time.perf_counter(), []
        device = self.batches[0].device
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"), \
                whole_cache_reordered() if self.reorder_whole else contextlib.nullcontext():
            for src in self.batches:
                n = src.shape[0]
                hyps = search.beam_search(self.model.decode_step, self.model.start_decoding(src), batch_size=n,
                                          beam_size=beam, bos=self.bos, eos=self.eos, pad=self.pad,
                                          max_lengths=torch.full((n,), length, device=device),
                                          min_length=length - 1)
                best += [h[0].tokens for h in hyps]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        if any(len(tokens) != length - 1 for tokens in best):  # the workload must not depend on weights
            raise RuntimeError(f"{self.name}: a hypothesis stopped before {length} tokens")
        self.best = best
        return seconds


def prepare(cell: Cell, *, sentences: int, batch: int, device: torch.device, precision: str) -> Decoder:
    """The cell's model (untrained, its seed) and the first ``sentences`` validation sources, in batches."""
    config = cell.config
    torch.manual_seed(config.train.seed)
    task = make_task(config, cell.run_dir, SilentLogger(cell.run_dir))
    spm = task.spm
    ids = [spm.src.encode(s) + [spm.eos_id] for s, _ in task.valid_raw[:sentences]]
    ids.sort(key=len)  # similar lengths share a batch, as translate() does
    batches = [pad_batch(ids[i:i + batch], spm.pad_id)[0].to(device) for i in range(0, len(ids), batch)]
    return Decoder(cell.variant, task.model.eval().to(device), batches, pad=spm.pad_id, bos=spm.bos_id,
                   eos=spm.eos_id, precision=precision)


def recomputing(twin: Decoder) -> Decoder:
    """A copy of ``twin`` (same weights and batches) whose decoder self-attentions recompute their prefix."""
    model = copy.deepcopy(twin.model)
    selfs = [m for n, m in model.named_modules()
             if isinstance(m, Attention) and n.startswith("decoder.") and not n.endswith("cross_attention")]
    if not selfs:
        raise SystemExit(f"--recompute {twin.name}: its decoder has no self-attention to recompute")
    for attention in selfs:
        attention.recompute_prefix = True
    return Decoder(f"{twin.name} (prefix recomputed)", model, twin.batches, twin.pad, twin.bos, twin.eos, twin=twin,
                   precision=twin.precision)


def reordering_whole(twin: Decoder) -> Decoder:
    """``twin`` (the same model and batches) with a search that copies the whole cache after every step."""
    return Decoder(f"{twin.name} (whole cache reordered)", twin.model, twin.batches, twin.pad, twin.bos, twin.eos,
                   twin=twin, precision=twin.precision, reorder_whole=True)


@contextlib.contextmanager
def whole_cache_reordered():
    """The search's ``reorder`` told nothing of sentences, so it copies the beam-shared fields too."""
    real = search.reorder
    search.reorder = lambda cache, index, within_sentences=False: real(cache, index)
    try:
        yield
    finally:
        search.reorder = real


def table(decoders: list[Decoder], baseline: str, *, sentences: int, beam: int, length: int) -> list[str]:
    base = next(d for d in decoders if d.name == baseline)
    lines = ["| variant | sentences/s (median) | hypothesis tokens/s (median) | speed vs baseline (median of "
             "per-round ratios) | sentences/s per round | ops / step |",
             "|---|---:|---:|---:|---|---:|"]
    tokens = sentences * beam * length  # every beam of every sentence decodes ``length`` tokens a round
    for d in decoders:
        rates = [sentences / s for s in d.seconds]
        ratio = statistics.median(b / s for s, b in zip(d.seconds, base.seconds))
        name = d.name + (" (baseline)" if d is base else "")
        per_second = statistics.median(tokens / s for s in d.seconds)
        lines.append(f"| {name} | {statistics.median(rates):.2f} | {per_second:,.0f} | {ratio:.2f} | "
                     f"{' '.join(f'{r:.2f}' for r in rates)} | {d.ops_per_step:.0f} |")
    lines += ["", "ops / step: the operators one batch's decoding dispatches (its encoder pass included), per step: "
                  "on a GPU, where a step of a small model is bound by its launches, kernel launches "
                  "(bench/op_count.py)"]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_grid_arguments(p)
    p.add_argument("--recompute", action="append", default=[], metavar="VARIANT",
                   help="also time this variant recomputing its decoder self-attention prefix at every step")
    p.add_argument("--reorder-whole", action="append", default=[], metavar="VARIANT",
                   help="also time this variant with the whole cache, source side included, copied after every step")
    p.add_argument("--sentences", type=whole_number, default=40,
                   help="validation sentences decoded per variant and round")
    p.add_argument("--batch", type=whole_number, default=20, help="sentences per beam-search batch")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--length", type=int, default=25, help="tokens every hypothesis decodes, EOS included")
    p.add_argument("--rounds", type=whole_number, default=3)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: decode under autocast")
    p.add_argument("--out", help="also write the table to this Markdown file")
    args = p.parse_args()
    check_out(p, args.out, "decode_speed.py")
    args.device = device_argument(p, args.device)
    if args.length < 2:
        p.error("--length must be at least 2 (one token and EOS)")
    if args.reorder_whole and args.beam < 2:
        p.error("--reorder-whole needs --beam 2 or more: with one beam the search reorders nothing while no "
                "sentence leaves")

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="decode-speed-") as tmp:
        grid = load_grid(args.grid, overrides=args.set, runs_dir=tmp)  # never touches the grid's own cells
        prepare_synthetic(grid)
        cells = bench_cells(grid, args)
        if cells[0].config.task != "translation":
            p.error(f"{args.grid}: decoding speed needs a translation grid, this one is {cells[0].config.task}")
        too_short = [c.label for c in cells if c.config.model.max_positions < args.length]
        if too_short:  # found now, not after minutes of warm-up: the decoder has a position per token
            p.error(f"--length {args.length} is beyond model.max_positions of {', '.join(too_short)} "
                    f"({cells[0].config.model.max_positions})")
        for option, names in (("--recompute", args.recompute), ("--reorder-whole", args.reorder_whole)):
            unknown = sorted(set(names) - {c.variant for c in cells})
            if unknown:
                p.error(f"{option} names variants not timed here: {', '.join(unknown)}")
        decoders = []
        for cell in cells:
            print(f"preparing {cell.label} ...", file=sys.stderr, flush=True)
            decoders.append(prepare(cell, sentences=args.sentences, batch=args.batch,
                                    device=args.device, precision=args.precision))
            own = decoders[-1]
            if cell.variant in args.recompute:
                decoders.append(recomputing(own))
            if cell.variant in args.reorder_whole:
                decoders.append(reordering_whole(own))
        sentences = sum(b.shape[0] for b in decoders[0].batches)
        for d in decoders:  # warm-up: one batch, untimed
            d.first_batch().run(beam=args.beam, length=args.length)
        for r in range(args.rounds):
            shift = r % len(decoders)
            for d in decoders[shift:] + decoders[:shift]:  # rotate who goes first
                d.seconds.append(d.run(beam=args.beam, length=args.length))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        for d in decoders:  # counted after the rounds, apart: a dispatch mode slows what it watches
            first = d.first_batch()
            d.ops_per_step = count_ops(lambda: first.run(beam=args.beam, length=args.length)) / args.length

    where = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
    measured = (f"{where}, {args.precision}; {args.rounds} rounds, interleaved, rotating order; per variant and round {sentences} validation "
                f"sentences in batches of {args.batch}, beam {args.beam}, every hypothesis forced to {args.length} "
                f"tokens (EOS included); untrained models of each cell's config, seed {cells[0].seed}")
    header = [f"# Decoding speed per variant: {grid.spec.title or grid.name}", "",
              *provenance("decode_speed.py", grid, args, cells, measured)]
    rows = table(decoders, grid.baseline, sentences=sentences, beam=args.beam, length=args.length)
    for d in decoders:  # the reference path must decode what the usual path decodes
        if d.twin is not None:
            same = sum(a == b for a, b in zip(d.best, d.twin.best))
            speed = statistics.median(t / s for s, t in zip(d.seconds, d.twin.seconds))
            rows.append(f"\n{d.name}: the same best hypothesis as {d.twin.name} in {same} of {len(d.best)} "
                        f"sentences; speed {speed:.3f} of {d.twin.name}'s (median of per-round ratios).")
    text = "\n".join(header + rows) + "\n"
    print(text)
    if args.out:
        write_out(args.out, text)


if __name__ == "__main__":
    run_main(main)
