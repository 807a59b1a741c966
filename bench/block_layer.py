"""One Bi-BloSA layer (the Block mixer's core), forward + backward, by path: the reference (each direction's
``BlockDirection.forward``, which was the layer's code before 2026-12-01), the CPU's fast path (each direction
alone, fewer passes over the [.., p, q, c] tensors) and the accelerator's (both directions as one computation).

Reported per shape: median ms and the speed ratio to the reference (its time over the path's) paired by round (paths interleaved, the order
rotating), the operators each dispatches (``op_count.py``: kernel launches on a GPU), and how many of them read or
write, weighted by the size of the largest pair tensor ([.., k, k, c]) each touches, in units of both
directions' intra-block pair tensors: passes over them, what the layer's time is on a GPU. Random input, d = 512 (d_h = 256), sentences of random lengths in [I/2, I].

    .venv/bin/python bench/block_layer.py --threads 2 --shape 40 40 5 --shape 64 64 6 --shape 16 128 7
    python bench/block_layer.py --device cuda --shape 400 64 6       # on a GPU: ~25k tokens, the WMT grid's r
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from op_count import count_ops
from sanlab.layers import block_attention
from sanlab.layers.block_attention import BiBloSA, split_blocks
from report import command, device_argument, machine, run_main, whole_number  # bench/report.py

DIM = 512


def reference(core: BiBloSA, x: torch.Tensor, valid: torch.Tensor, block_len: int) -> torch.Tensor:
    blocks, block_valid = split_blocks(x, valid, block_len)
    out = torch.cat([direction(blocks, block_valid) for direction in core.directions], dim=-1)
    return out.flatten(1, 2)[:, :x.shape[1]]


def layer(core: BiBloSA, x: torch.Tensor, valid: torch.Tensor, block_len: int) -> torch.Tensor:
    return core(x, valid, block_len=block_len)


# name -> (the function, whether the layer takes both directions at once: None for the reference)
PATHS = {"reference (per direction)": (reference, None),
         "fast, one direction after the other (CPU)": (layer, False),
         "fast, both directions at once (accelerator)": (layer, True)}


class PairPasses(TorchDispatchMode):
    """Sums, over the operators dispatched, the largest pair tensor each reads or writes (the feature-wise attention's
    logits, weights and their gradients: [.., m, r, r, c] within blocks, [.., b, m, m, c] between them), in units of
    ``unit`` elements. Matched by shape: a shape with m == r or b == m is refused (other tensors would match)."""

    def __init__(self, *, b: int, m: int, r: int, c: int, unit: int):
        super().__init__()
        if m == r or b == m:
            raise SystemExit(f"B {b}, {m} blocks of {r}: pick a shape with blocks != block length != B "
                             "(the pair tensors are told apart by shape)")
        self.shapes, self.unit, self.passes = {(m, r, r, c), (b, m, m, c)}, unit, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        pairs = [t.numel() for t in (*args, *(out if isinstance(out, (tuple, list)) else (out,)))
                 if isinstance(t, torch.Tensor) and tuple(t.shape[-4:]) in self.shapes]
        if not func.is_view and pairs:
            self.passes += max(pairs) / self.unit
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs=3, type=whole_number, action="append", metavar=("B", "I", "R"),
                        help="batch, length, block length (repeatable)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: under autocast")
    parser.add_argument("--threads", type=whole_number, default=2)
    parser.add_argument("--rounds", type=whole_number, default=3)
    parser.add_argument("--repeats", type=whole_number, default=10)
    args = parser.parse_args()
    args.device = device_argument(parser, args.device)
    torch.set_num_threads(args.threads)
    device = args.device
    print(f"- command: `{command('block_layer.py')}`\n"
          f"- machine: {machine(device)}, {args.threads} threads, device {device}; {args.precision}; rounds {args.rounds} x {args.repeats} repeats\n")
    print("| B, I, r | path | ms (median) | speed vs reference | ops | passes over the pair tensors |")
    print("|---|---|---:|---:|---:|---:|")
    for b, i, r in args.shape or [(40, 40, 5)]:
        torch.manual_seed(0)
        core = BiBloSA(dim=DIM).to(device)
        x = torch.randn(b, i, DIM, device=device, requires_grad=True)
        lengths = torch.randint(i // 2, i + 1, (b,)); lengths[0] = i
        valid = (torch.arange(i)[None] < lengths[:, None]).to(device)
        m = -(-i // r)
        counter = dict(b=b, m=m, r=r, c=DIM // 2, unit=b * m * r * r * DIM)  # unit: both directions' intra pairs

        def work(forward):
            core.zero_grad(set_to_none=True)  # as an optimizer's zero_grad leaves them: each update's count
            x.grad = None
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                out = forward(core, x, valid, r)
            out.float().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        times = {name: [] for name in PATHS}
        for round_ in range(args.rounds):
            names = list(PATHS)[round_ % len(PATHS):] + list(PATHS)[:round_ % len(PATHS)]
            for name in names:
                forward, together = PATHS[name]
                with mock.patch.object(block_attention, "directions_together", lambda device: together):
                    work(forward)  # warm-up
                    start = time.perf_counter()
                    for _ in range(args.repeats):
                        work(forward)
                    times[name].append((time.perf_counter() - start) / args.repeats)
        base = times["reference (per direction)"]
        for name, (forward, together) in PATHS.items():
            with mock.patch.object(block_attention, "directions_together", lambda device: together):
                with PairPasses(**counter) as passes:
                    work(forward)
                ops = count_ops(lambda: work(forward))
            ratio = statistics.median(s / t for s, t in zip(base, times[name]))
            print(f"| {b}, {i}, {r} | {name} | {statistics.median(times[name]) * 1e3:.1f} | {ratio:.2f} | "
                  f"{ops} | {passes.passes:.1f} |")


if __name__ == "__main__":
    run_main(main)
