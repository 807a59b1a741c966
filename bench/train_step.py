"""One training update of our vanilla Seq2Seq vs torch.nn.Transformer at the same size (CPU).

Setting of docs/performance.md: d=256, 4 heads, 3+3 layers, FFN 1024, vocabulary 8000, about
3,840 target tokens per update (B=128, source and target length 30), Adam, label-smoothed loss.
Methods run interleaved; medians and the ratio to nn.Transformer from the same run.

    .venv/bin/python bench/train_step.py --threads 2 --repeats 10
    python3 bench/train_step.py --device cuda --precision bf16 --batch 512   # on a GPU (scripts/gpu_check.sh)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.models.builders import build_seq2seq
from report import command, device_argument, machine, run_main, whole_number  # bench/report.py

D, HEADS, LAYERS, FFN, VOCAB = 256, 4, 3, 1024, 8000


class TorchTransformer(nn.Module):
    """The reference: nn.Transformer with shared embeddings, sinusoid-free learned positions, tied output."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D, padding_idx=0)
        self.pos = nn.Embedding(512, D)
        self.core = nn.Transformer(D, HEADS, LAYERS, LAYERS, FFN, dropout=0.1, batch_first=True, norm_first=True)

    def forward(self, src, tgt):
        pos = lambda t: self.pos(torch.arange(t.shape[1], device=t.device))[None]  # noqa: E731
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        h = self.core(self.embed(src) + pos(src), self.embed(tgt) + pos(tgt), tgt_mask=mask, tgt_is_causal=True,
                      src_key_padding_mask=src.eq(0), memory_key_padding_mask=src.eq(0),
                      tgt_key_padding_mask=tgt.eq(0))
        return h @ self.embed.weight.T


def ours() -> nn.Module:
    stack = StackConfig(layers=LAYERS, ffn_dim=FFN, attention={"heads": HEADS})
    return build_seq2seq(Seq2SeqConfig(dim=D, norm="pre", dropout=0.1, encoder=stack, decoder=stack),
                         vocab_size=VOCAB, pad_id=0)


def step(model, opt, src, tgt_in, tgt_out, precision: str = "fp32") -> None:
    with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(src, tgt_in)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=0, label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=whole_number, default=2)
    p.add_argument("--repeats", type=whole_number, default=10)
    p.add_argument("--batch", type=whole_number, default=128)
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = p.parse_args()
    args.device = device_argument(p, args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = args.device
    src = torch.randint(4, VOCAB, (args.batch, args.length), device=device)
    tgt = torch.randint(4, VOCAB, (args.batch, args.length + 1), device=device)
    models = {"nn.Transformer": TorchTransformer().to(device), "sanlab Seq2Seq": ours().to(device)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    opts = {k: torch.optim.Adam(m.parameters(), lr=1e-4) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    for r in range(args.repeats + 2):
        for name in (list(models) if r % 2 == 0 else list(models)[::-1]):  # interleave, rotate order
            sync()
            t0 = time.perf_counter()
            step(models[name], opts[name], src, tgt[:, :-1], tgt[:, 1:], args.precision)
            sync()  # a GPU runs asynchronously: time the work, not its launch
            if r >= 2:  # warm-up
                times[name].append(time.perf_counter() - t0)
    tokens = args.batch * args.length
    ref = statistics.median(times["nn.Transformer"])
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"threads {args.threads}"
    print(f"- command: `{command('train_step.py')}`\n- machine: {machine(device)}")
    print(f"{where}, {args.precision}, torch {torch.__version__}, {tokens} target tokens per update, "
          f"{args.repeats} repeats (medians)")
    print("| model | ms / update | target tokens / s | time vs nn.Transformer |\n|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med * 1e3:.0f} | {tokens / med:.0f} | {med / ref:.2f} |")


if __name__ == "__main__":
    run_main(main)
