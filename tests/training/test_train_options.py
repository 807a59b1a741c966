"""The train.* options as docs/config.md defines them, checked against the formulas fairseq and OpenNMT-py users
know: the learning-rate schedule value by value, label smoothing on a hand example, and gradient accumulation
against one batch holding the same sentences."""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sanlab.config import TrainConfig
from sanlab.training.schedule import learning_rate


def test_inverse_sqrt_warms_up_from_the_start_value_and_peaks_at_update_warmup_steps():
    """Update n runs at the rate at n (1-based): fairseq's inverse_sqrt values at 1, warmup and 2 x warmup."""
    lr, init, warmup = 7e-4, 1e-7, 4000
    rate = lambda step, w=warmup: learning_rate(step, kind="inverse_sqrt", lr=lr, warmup_steps=w,
                                                warmup_init_lr=init)
    assert rate(1) == pytest.approx(init + (lr - init) / warmup, rel=1e-12)
    assert rate(warmup - 1) == pytest.approx(init + (lr - init) * (warmup - 1) / warmup, rel=1e-12)
    assert rate(warmup) == pytest.approx(lr, rel=1e-12)
    assert rate(2 * warmup) == pytest.approx(lr / math.sqrt(2), rel=1e-12)
    assert [rate(s, 0) for s in (1, 4)] == pytest.approx([lr, lr / 2], rel=1e-12)  # warmup 0: lr / sqrt(step)
    constant = [learning_rate(s, kind="constant", lr=lr, warmup_steps=4, warmup_init_lr=0.0) for s in (1, 4, 400)]
    assert constant == pytest.approx([lr / 4, lr, lr], rel=1e-12)


def test_label_smoothing_is_pytorchs_and_differs_from_fairseqs_by_the_documented_term():
    """The translation loss on fixed logits: PyTorch's smoothing (eps/V on every class), padding left out; fairseq's
    label_smoothed_cross_entropy exceeds it by eps/(V-1) x (mean -log p over the classes - the target's -log p)."""
    from sanlab.tasks.translation import Batch, TranslationTask

    V, eps, pad = 6, 0.1, 0
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0, 1.5, -0.5], [0.1, 3.0, 0.2, -2.0, 0.0, 1.0],
                            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]]])  # [1, 3, V]
    target = torch.tensor([[4, 2, pad]])  # the last position is padding
    batch = Batch(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long), target, tokens=2)
    model = nn.Module()
    model.forward = lambda src, tgt_in: logits
    model.anchor = nn.Parameter(torch.zeros(1))  # (model_device reads a parameter)
    task = SimpleNamespace(config=SimpleNamespace(train=SimpleNamespace(label_smoothing=eps)),
                           spm=SimpleNamespace(pad_id=pad))
    loss = float(TranslationTask.loss(task, batch, model=model))

    lp = logits[0, :2].double().log_softmax(-1)
    nll = -lp[torch.arange(2), target[0, :2]]
    everyone = -lp.sum(-1)
    assert loss == pytest.approx(float(((1 - eps) * nll + eps / V * everyone).sum()), rel=1e-6)
    fairseq = float(((1 - eps - eps / (V - 1)) * nll + eps / (V - 1) * everyone).sum())
    assert fairseq - loss == pytest.approx(float((eps / (V - 1) * (everyone / V - nll)).sum()), rel=1e-4)
    assert fairseq != pytest.approx(loss, rel=1e-4)  # the two do differ, by that term


class _ToyTask:
    """A linear classifier whose batches are (features, classes); -1 is padding."""

    metric, higher_is_better = "loss", False

    def __init__(self, batches):
        torch.manual_seed(0)
        self.model, self.batches = nn.Linear(3, 4), batches

    def epoch_batches(self, epoch):
        return self.batches

    def batch_tokens(self, batch):
        return int(batch[1].ne(-1).sum())

    def loss(self, batch, *, model=None):
        return F.cross_entropy((model or self.model)(batch[0]), batch[1], ignore_index=-1, reduction="sum")

    def validate(self):
        return {"loss": 1.0}


def _trained(tmp_path: Path, batches, **train) -> nn.Module:
    from sanlab.training.logging import SilentLogger
    from sanlab.training.loop import Trainer

    run = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    config = TrainConfig(progress=False, lr=0.1, schedule="constant", warmup_steps=0, valid_every=0, max_epochs=2,
                         **train)
    trainer = Trainer(task=_ToyTask(batches), config=config, run_dir=run, logger=SilentLogger(run))
    trainer.fit()
    return trainer.model


def test_accumulated_batches_update_as_one_batch_holding_them_an_epochs_short_last_group_too(tmp_path):
    """accum_steps 2 over 5 batches (groups of 2, 2 and 1 per epoch) against the same sentences joined into 3
    batches: the loss is normalised by each group's tokens, so the weights agree up to rounding."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(n, 3, generator=g), torch.randint(0, 4, (n,), generator=g)) for n in (2, 5, 3, 7, 4)]
    batches[1][1][:2] = -1  # padding changes the token count, not the sentence count
    joined = [tuple(torch.cat(parts) for parts in zip(*batches[k:k + 2])) for k in (0, 2, 4)]
    accumulated = _trained(tmp_path, batches, accum_steps=2)
    one = _trained(tmp_path, joined)
    for a, b in zip(accumulated.parameters(), one.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(_trained(tmp_path, batches).weight, one.weight)  # (accumulation changes the result)


@pytest.mark.parametrize("optimizer", ["adam", "rmsprop"])
def test_weight_decay_reaches_biases_layernorm_and_embeddings_too(optimizer):
    """As fairseq's --weight-decay: no parameter is exempted (Hugging Face's recipes exempt biases and LayerNorm)."""
    from sanlab.training.loop import build_optimizer

    model = nn.Sequential(nn.Embedding(5, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    opt = build_optimizer(model, TrainConfig(optimizer=optimizer, weight_decay=0.01))
    decayed = {id(p) for group in opt.param_groups if group["weight_decay"] == 0.01 for p in group["params"]}
    assert decayed == {id(p) for p in model.parameters()}
