"""Dense vs banded local-window attention (1D-/2D-CSAN), forward + backward, on this CPU.

Times the attention core (scores -> mask -> softmax -> weighted values) from given q, k, v of
shape [B, H, I, D]; projections are the same for every plan and left out. Methods are run
interleaved (rotating order each repeat) and reported as medians with ratios to the dense
reference of the same length and the same run (docs/performance.md, "timing hygiene").

    .venv/bin/python bench/attention_window.py            # I in 64 128 512, 20 repeats
    .venv/bin/python bench/attention_window.py --quick    # 5 repeats: for a busy machine
    python3 bench/attention_window.py --device cuda --lengths 512 2048 4096 8192 --compile   # + FlexAttention,
                                                                                            # peak memory

On CUDA two FlexAttention rows: "1D flex" is a hand-built window whose block mask is made once, "1D flex plan"
the model's plan (``attention/flex.py``), which builds its block mask in every call; the two differ by that.
``--compile`` adds the banded plan under ``torch.compile`` (as a model with ``train.compile: true`` runs it),
compiled before the timed repeats.

The ops column counts the aten operators one forward + backward dispatches, views left out: in eager mode
each is a kernel launch on a GPU, so at the lengths where a plan's time hardly grows with I, the time is
mostly these launches (on an H200 the banded plan took 2.5 ms at I = 512 and 3.3 ms at 4096; results/gpu.md).
Not counted for compiled functions and FlexAttention, whose kernels are generated.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from dataclasses import replace

import torch

from op_count import count_ops
from sanlab.attention import banded, flex, plans
from sanlab.attention.parts.csan2d import HeadArea
from sanlab.attention.parts.window import WindowMask
from sanlab.attention.parts_base import AttentionContext, KeySet
from sanlab.attention.positions import Positions
from report import command, device_argument, machine, run_main, whole_number  # bench/report.py


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 512])
    p.add_argument("--batch", type=whole_number, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--size", type=int, default=11, help="window M (odd)")
    p.add_argument("--area", type=int, default=3, help="2D-CSAN heads N (odd)")
    p.add_argument("--block", type=int, default=banded.BLOCK, help="queries per block of the banded plan")
    p.add_argument("--threads", type=whole_number, default=2)
    p.add_argument("--repeats", type=whole_number, default=20)
    p.add_argument("--quick", action="store_true", help="5 repeats, 2 warm-ups")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (CUDA adds FlexAttention and peak memory)")
    p.add_argument("--compile", action="store_true", help="add the banded plan under torch.compile (1D and 2D)")
    args = p.parse_args()
    args.device = str(device_argument(p, args.device))  # (compared with "cpu" below)
    return args


def _method(name: str, part, *, block: int):
    """A function (q, k, v, positions) -> output running one plan over one window part."""
    parts = plans.StageParts.sort([part])

    def run(q, k, v, positions):
        ctx = AttentionContext(positions=positions, heads=q.shape[1], head_dim=q.shape[3], q=q, k=k)
        kw = dict(parts=parts, scale=q.shape[-1] ** -0.5, dropout=0.0, training=True)
        if name == "banded":
            return banded.attend(q, k, v, ctx, block=block, **kw)
        if name == "flex":
            return flex.attend(q, k, v, ctx, **kw)
        keys = KeySet(k, v, positions)
        for p in parts.extend:
            keys = p.extend(keys, ctx)
        k, v = keys.k, keys.v
        ctx = replace(ctx, k=k, positions=keys.positions, key_head=keys.key_head)
        if name == "sdpa":
            return plans.sdpa(q, k, v, ctx, **kw)
        return plans.dense(q, k, v, ctx, trace=None, **kw)

    return run


def _flex_window(half_width: int, valid: torch.Tensor):
    """FlexAttention over the same 1D window, built by hand: one block mask for every repeat, so the work grows
    with I*M, compiled as its docs require. None where this torch has no FlexAttention."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    compiled = torch.compile(flex_attention)
    length = valid.shape[1]

    def in_window(b, h, q_idx, kv_idx):
        return ((q_idx - kv_idx).abs() <= half_width) & valid[b, kv_idx]

    block_mask = create_block_mask(in_window, B=valid.shape[0], H=None, Q_LEN=length, KV_LEN=length,
                                   device=valid.device)
    return lambda q, k, v, positions: compiled(q, k, v, block_mask=block_mask)


def _ops(run, tensors, positions) -> int:
    """Operators of one forward + backward, the reduction to a scalar and its seed gradient left out."""
    for t in tensors:
        t.grad = None
    outputs = []
    forward = count_ops(lambda: outputs.append(run(*tensors, positions)))
    total = outputs[0].sum()
    seed = torch.ones_like(total)
    return forward + count_ops(lambda: total.backward(seed))  # (the sum's backward is an expand: a view)


def _time(run, tensors, positions) -> float:
    for t in tensors:
        t.grad = None
    cuda = tensors[0].is_cuda
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    run(*tensors, positions).sum().backward()
    if cuda:
        torch.cuda.synchronize()  # a GPU runs asynchronously: time the work, not its launch
    return time.perf_counter() - start


def bench_length(args, length: int) -> list[tuple[str, float]]:
    m = (args.size - 1) // 2
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(length)
    shape = (args.batch, args.heads, length, args.head_dim)
    tensors = [torch.randn(shape, generator=g).to(device).requires_grad_(True) for _ in range(3)]
    valid = torch.ones(args.batch, length, dtype=torch.bool, device=device)
    valid[0, length - length // 4:] = False  # some padding, as in a real batch
    positions = Positions.self_attention(valid, length=length, device=device)
    one_d, two_d = WindowMask(half_width=m), HeadArea(half_width=m, area=args.area, boundary="wrap")
    methods = {"1D dense": _method("dense", one_d, block=args.block),
               "1D sdpa+mask": _method("sdpa", one_d, block=args.block),
               "1D banded": _method("banded", one_d, block=args.block),
               "2D dense": _method("dense", two_d, block=args.block),
               "2D banded": _method("banded", two_d, block=args.block)}
    if args.compile:  # a fresh compiled function per length: each compiles for its shapes in the warm-ups
        methods["1D banded compiled"] = torch.compile(methods["1D banded"], dynamic=False)
        methods["2D banded compiled"] = torch.compile(methods["2D banded"], dynamic=False)
    hand_flex = _flex_window(m, valid) if device.type == "cuda" else None  # (no backward on this CPU build)
    if hand_flex is not None:
        methods["1D flex"] = hand_flex
        methods["1D flex plan"] = _method("flex", one_d, block=args.block)
    # the cost a window must beat: global attention through SDPA's fused kernels (flash / memory-efficient on
    # CUDA), no mask at all; issue 24's target is the window plan >= 10x faster than this at I = 4096
    methods["global sdpa"] = lambda q, k, v, positions: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    names = list(methods)
    warmups, repeats = (2, 5) if args.quick else (3, args.repeats)
    times: dict[str, list[float]] = {n: [] for n in names}
    failed: dict[str, str] = {}
    for r in range(warmups + repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:  # rotate the order every repeat
            if n in failed:
                continue
            try:
                elapsed = _time(methods[n], tensors, positions)
            except torch.cuda.OutOfMemoryError:  # dense [B, H, I, I] at large I: a row that says so, not a crash
                failed[n] = "out of memory"
                torch.cuda.empty_cache()
                continue
            except Exception as e:  # (a compiler failure on a GPU lease): the row says so, the other rows run
                traceback.print_exc()
                failed[n] = f"failed: {type(e).__name__}"
                continue
            if r >= warmups:
                times[n].append(elapsed)
    peaks = ({n: _unless_failed(_peak_mib, methods[n], tensors, positions) for n in names if n not in failed}
             if device.type == "cuda" else {})
    ops = {n: _unless_failed(_ops, methods[n], tensors, positions) for n in names
           if n not in failed and "compiled" not in n and "flex" not in n}
    return [(n, statistics.median(times[n]) if n not in failed else failed[n], peaks.get(n), ops.get(n))
            for n in names]


def _unless_failed(measure, run, tensors, positions):
    """``measure(run, ...)``, or None (the row says "—") where it fails: the timed rows stand without it."""
    try:
        return measure(run, tensors, positions)
    except Exception:  # (out of memory in a second pass, a compiler failure): named on stderr
        traceback.print_exc()
        return None


def _peak_mib(run, tensors, positions) -> float:
    """Peak CUDA memory of one forward+backward, beyond what was allocated before it (MiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _time(run, tensors, positions)
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> None:
    args = _parse()
    torch.set_num_threads(args.threads)
    print(f"- command: `{command('attention_window.py')}`\n- machine: {machine(torch.device(args.device))}")
    print(f"forward+backward, B={args.batch} H={args.heads} D={args.head_dim} M={args.size} N={args.area} "
          f"block={args.block} threads={args.threads} torch={torch.__version__} "
          f"repeats={5 if args.quick else args.repeats}; median ms (ratio to dense of the same window; "
          f"global sdpa: to 1D dense)")
    if args.device != "cpu":
        print(f"device {torch.cuda.get_device_name(torch.device(args.device))}; peak: extra CUDA memory of one step")
    cuda = args.device != "cpu"
    print(f"{'I':>5}  {'method':<19} {'ms':>9} {'ratio':>7}" + (f" {'peak MiB':>9}" if cuda else "") + f" {'ops':>5}")
    for length in args.lengths:
        rows = {name: (seconds, peak, ops) for name, seconds, peak, ops in bench_length(args, length)}
        for name, (seconds, peak, ops) in rows.items():
            if isinstance(seconds, str):  # the reason it has no time (out of memory, a failure)
                print(f"{length:>5}  {name:<19} {seconds:>17}")
                continue
            ref = rows["2D dense" if name.startswith("2D") else "1D dense"][0]
            ratio = f"{seconds / ref:>7.2f}" if not isinstance(ref, str) else f"{'—':>7}"
            memory = "" if not cuda else f" {peak:>9.1f}" if peak is not None else f" {'—':>9}"
            count = ops if ops is not None else "—"
            print(f"{length:>5}  {name:<19} {seconds * 1e3:>9.2f} {ratio}{memory} {count:>5}", flush=True)
        global_s = rows["global sdpa"][0]
        window = [rows[n][0] for n in ("1D flex plan", "1D banded") if n in rows and not isinstance(rows[n][0], str)]
        if window and not isinstance(global_s, str):
            print(f"{length:>5}  global sdpa / fastest 1D window plan: {global_s / min(window):.2f}x")
        compiled = rows.get("1D banded compiled", (None,))[0]
        if compiled is not None and not isinstance(compiled, str) and not isinstance(global_s, str):
            print(f"{length:>5}  global sdpa / 1D banded compiled: {global_s / compiled:.2f}x")


if __name__ == "__main__":
    run_main(main)
