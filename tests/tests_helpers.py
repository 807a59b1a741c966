"""Small builders shared by tests (imported as ``tests_helpers``; tests/ is on sys.path via conftest)."""

import torch

from sanlab.config import Seq2SeqConfig, StackConfig
from sanlab.models.builders import build_seq2seq


def tiny_seq2seq(*, dim=32, heads=4, layers=2, vocab=50, norm="pre", eos_bias=False, seed=0, **model_kw):
    stack = StackConfig(layers=layers, ffn_dim=2 * dim, attention={"heads": heads})
    cfg = Seq2SeqConfig(dim=dim, norm=norm, dropout=0.0, encoder=stack, decoder=stack, **model_kw)
    torch.manual_seed(seed)
    model = build_seq2seq(cfg, vocab_size=vocab, pad_id=0).eval()
    if eos_bias:  # make EOS likely enough that hypotheses end at different lengths
        with torch.no_grad():
            model.tgt_embed.weight[3] *= 4
    return model


def count_calls(monkeypatch, module, name: str) -> list:
    """Wrap ``module.name`` so each call appends 1 to the returned list (and still runs it): a test can
    then assert which code path ran, not only that two paths agree."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def perturb(module: torch.nn.Module, scale: float = 0.3, seed: int = 3) -> torch.nn.Module:
    """Move every parameter off its initial value: many parts start as the identity (temperatures 1,
    gates, biases 0), where a cached or fast path that dropped or doubled them would still match."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module
