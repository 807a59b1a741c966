"""Every registered attention part, mixer and pre-block, and the tagger's forms, resume bit-exactly.

Enrolled from the registries (PARTS, MIXERS, PRE_BLOCKS: each config's ``examples()``), so a new variant gets
this check for free. Each case trains a tiny model with every dropout on (residual, attention, and the part's
or mixer's own) and accum_steps 2 three ways: straight through 4 updates; killed during update 4, after the
step-2 checkpoint; then rerun, which goes back to step 2 and redoes updates 3 and 4. The rerun must end with
the straight run's weights, optimizer state and logged metrics, bit for bit: any state a variant keeps outside
its saved weights (a non-persistent buffer that training changes, a generator of its own, Python's or numpy's
random streams, a lazily made parameter) shows up here. The whole registry takes about a minute (marked slow);
one form of each kind stays in the default run.
"""

import json

import pytest
import torch

from sanlab.attention.registry import PARTS
from sanlab.config import validate
from sanlab.layers.mixers import MIXERS
from sanlab.layers.pre_blocks import PRE_BLOCKS
from sanlab.runs import train_run
from sanlab.training.checkpoint import load_state
from decoder_forms import CROSS_CAPABLE, DECODER_UNSAFE, ENCODER_ONLY_MIXERS
from training_fixtures import final_weights, write_reverse_corpus

import sanlab.config  # noqa: F401  (imports every mixer module, so the registry is complete)

# on the CPU in one thread: a GPU's atomic adds, or a sum split over other threads, round differently from run to run
TRAIN = dict(max_steps=4, valid_every=2, accum_steps=2, log_every=1, device="cpu", threads=1, seed=3, progress=False,
             keep_last=10, keep_best=10)
# one quick form of each kind stays in the default run; the rest of the registry is marked slow
FAST = {"part-window-0", "part-capsule-0", "mixer-dynamic_conv-0", "mixer-muse-0", "pre-conv-0",
        "tagger-default", "tagger-temperature-0"}


def _mark(case_id: str, *values):
    return pytest.param(*values, id=case_id, marks=() if case_id in FAST else pytest.mark.slow)


def _dumped(cfg) -> dict:
    """``cfg`` as config keys, with each of its own dropouts that is off turned on (their masks draw random
    numbers a resume must draw again)."""
    dumped = cfg.model_dump(mode="json")
    return {k: 0.1 if k.endswith("dropout") and v == 0 else v for k, v in dumped.items()}


PART_CASES = [_mark(f"part-{name}-{n}", _dumped(cfg))
              for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]
MIXER_CASES = [_mark(f"mixer-{name}-{n}", _dumped(cfg))
               for name in MIXERS.names() for n, cfg in enumerate(MIXERS.entry(name).config.examples())]
PRE_BLOCK_CASES = [_mark(f"pre-{name}-{n}", _dumped(cfg))
                   for name in PRE_BLOCKS.names() for n, cfg in enumerate(PRE_BLOCKS.entry(name).config.examples())]


def _translation(root, *, parts=(), mixer=None, pre_blocks=()):
    """A 2-layer translation model on the reverse corpus with ``parts`` in both self-attentions (the encoder's
    only, for a part without a causal form) and in the cross-attention (for a part with a cross form), ``mixer``
    on both sides (the encoder only, for a mixer without a causal form) and ``pre_blocks`` in the encoder."""
    if not (root / "train.src").exists():
        write_reverse_corpus(root, n=50)
    attention = {"heads": 4, "dropout": 0.1}
    encoder = {"layers": 2, "ffn_dim": 32, "attention": {**attention, "parts": list(parts)},
               "pre_blocks": list(pre_blocks)}
    decoder = {"layers": 2, "ffn_dim": 32,
               "attention": {**attention, "parts": [p for p in parts if p["type"] not in DECODER_UNSAFE]},
               "cross_attention": {"parts": [p for p in parts if p["type"] in CROSS_CAPABLE or p.get("cross")]}}
    if mixer is not None:
        encoder["mixer"] = mixer
        if mixer["type"] not in ENCODER_ONLY_MIXERS:
            decoder["mixer"] = mixer
    return validate({
        "task": "translation",
        "data": {"train": {"src": str(root / "train.src"), "tgt": str(root / "train.tgt")},
                 "valid": {"src": str(root / "valid.src"), "tgt": str(root / "valid.tgt")},
                 "subword": {"vocab_size": 40}, "max_len": 20},
        "model": {"dim": 16, "dropout": 0.2, "max_positions": 24, "encoder": encoder, "decoder": decoder},
        "train": {"max_tokens": 200, "warmup_steps": 4, **TRAIN},
        "decode": {"beam": 2, "max_len_b": 3},
    }, source="test")


def _tagging(root, **model):
    from sanlab.data.synthetic import write_tagging_corpus

    data = root / "tagging-data"
    if not (data / "train.conllu").exists():
        write_tagging_corpus(data, seed=2, sizes={"train": 20, "dev": 10, "test": 10})
    encoder = {"layers": 2, "attention": {"heads": 4, "dropout": 0.1}, **model.pop("encoder", {})}
    return validate({"task": "tagging", "data": {"train": str(data / "train.conllu"), "dev": str(data / "dev.conllu")},
                     "model": {"word_dim": 16, "char_dim": 8, "char_filters": 8, "char_layers": 1, "dropout": 0.2,
                               "encoder": encoder, **model},
                     "train": {"batch_size": 4, **TRAIN}}, source="test")


def _kill_during(update: int, monkeypatch):
    """Trainer.update raises KeyboardInterrupt when it is called for update ``update``."""
    from sanlab.training import loop

    real = loop.Trainer.update

    def killed(self, group):
        if self.progress.step == update - 1:
            raise KeyboardInterrupt("killed")
        return real(self, group)

    monkeypatch.setattr(loop.Trainer, "update", killed)


def _logged(run) -> list[dict]:
    """metrics.jsonl without what measures time."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.endswith("_per_s")}
            for r in records if r["split"] != "speed"]


def _optimizer(run) -> dict:
    latest = sorted((run / "checkpoints").glob("step-*"))[-1]
    return load_state(latest)["optimizer"]


def _assert_identical(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{where}: {m}")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for n, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{n}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _check_resume(tmp_path, config, monkeypatch):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    train_run(config, straight, quiet=True)
    with monkeypatch.context() as m:
        _kill_during(4, m)
        with pytest.raises(KeyboardInterrupt):
            train_run(config, crashed, quiet=True)
    assert [p.name for p in (crashed / "checkpoints").glob("step-*")] == ["step-00000002"]  # updates 3-4 redone
    assert train_run(config, crashed, quiet=True)["step"] == 4
    _assert_identical(dict(final_weights(straight)), dict(final_weights(crashed)), "weights")
    _assert_identical(_optimizer(straight), _optimizer(crashed), "optimizer")
    assert _logged(crashed) == _logged(straight)


@pytest.mark.parametrize("part", PART_CASES)
def test_a_translation_model_with_each_attention_part_resumes_exactly(tmp_path, monkeypatch, part):
    _check_resume(tmp_path, _translation(tmp_path, parts=[part]), monkeypatch)


@pytest.mark.parametrize("mixer", MIXER_CASES)
def test_a_translation_model_with_each_mixer_resumes_exactly(tmp_path, monkeypatch, mixer):
    _check_resume(tmp_path, _translation(tmp_path, mixer=mixer), monkeypatch)


@pytest.mark.parametrize("block", PRE_BLOCK_CASES)
def test_a_translation_model_with_each_pre_block_resumes_exactly(tmp_path, monkeypatch, block):
    _check_resume(tmp_path, _translation(tmp_path, pre_blocks=[block]), monkeypatch)


TAGGER_FORMS = [
    _mark("tagger-default", {}),
    _mark("tagger-reproduce", {"position": "concat", "position_dim": 8, "mask_padding": False, "train_pad_rows": True,
                               "classifier_sees_embedding": False, "dense_init": "glorot_uniform"}),
    _mark("tagger-transformer-layers", {"layer_style": "transformer", "norm": "post", "position": "none",
                                        "attention_init": "torch", "encoder": {"ffn_dim": 16}}),
    *[_mark(f"tagger-{case.id.removeprefix('part-')}", {"encoder": {"attention": {"heads": 4, "dropout": 0.1,
                                                                                  "parts": [case.values[0]]}}})
      for case in PART_CASES],
    *[_mark(f"tagger-{case.id}", {"encoder": {"mixer": case.values[0]}}) for case in MIXER_CASES],
    *[_mark(f"tagger-{case.id}", {"encoder": {"pre_blocks": [case.values[0]]}}) for case in PRE_BLOCK_CASES],
]


def test_the_quick_subset_names_cases_that_exist():
    """A misspelt id in FAST would quietly leave its kind to the slow run only."""
    ids = {case.id for case in [*PART_CASES, *MIXER_CASES, *PRE_BLOCK_CASES, *TAGGER_FORMS]}
    assert FAST <= ids, FAST - ids


@pytest.mark.parametrize("model", TAGGER_FORMS)
def test_a_tagger_in_each_form_resumes_exactly(tmp_path, monkeypatch, model):
    _check_resume(tmp_path, _tagging(tmp_path, **model), monkeypatch)
