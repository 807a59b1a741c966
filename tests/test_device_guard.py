"""A CPU guard against device bugs: no tensor is created on the default device when it should follow its inputs.

On a GPU, a tensor made without ``device=`` (``torch.arange(n)``, ``torch.zeros(...)``, ``torch.tensor(...)``)
lands on the CPU while the model is on CUDA, and the step fails, or silently copies to the host every step.
Here the model and its inputs live on the CPU while the default device for new tensors is ``meta``
(``with torch.device("meta")``): a tensor created without ``device=`` is a meta tensor, and mixing it with
the CPU tensors raises. Every registered attention part (in the encoder, the decoder and cross-attention
where it has those forms), every mixer and pre-block, and both models are run forward, backward and
through a few beam-search steps this way.

The parts run through every plan that can run them (``plan`` forced: ``auto`` takes the banded plan only from
128 keys on and FlexAttention only on CUDA, and these sentences are short).

Each of those runs is made twice: as a run is by default, and under deterministic algorithms
(``train.deterministic``, ``torch.use_deterministic_algorithms``), where every operator dispatched is recorded: none
may be one that CUDA refuses to run deterministically (``CUDA_HAS_NO_DETERMINISTIC_FORM``), or a deterministic
GPU run would stop at it (the CPU has a deterministic form of each, so running them here proves nothing).

What it cannot reach: code that only runs on a GPU (the flex plan's compiled kernel and compiled block mask,
``flex.attend``'s CUDA branch: on the CPU the same mods run through torch's reference operator), tensors created
from Python data and then moved with ``.to(x.device)`` (correct, and not flagged), host syncs (``.item()``,
``.tolist()``: correct on every device, only slow on a GPU), and the data loaders and training loop, which build
their batches on the CPU by design and move them once.
"""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sanlab.attention import Attention
from sanlab.attention.registry import PARTS
from sanlab.config import Seq2SeqConfig, StackConfig, TaggerConfig
from sanlab.decoding.search import beam_search
from sanlab.errors import ConfigError
from sanlab.layers.mixers import MIXERS
from sanlab.layers.pre_blocks import PRE_BLOCKS
from sanlab.models.builders import build_seq2seq, build_tagger
from sanlab.registry import BuildContext
from tests_helpers import fast_plans, spy_plans

DIM, HEADS, VOCAB = 16, 4, 30


def _seq2seq(encoder: dict, decoder: dict) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Seq2SeqConfig(dim=DIM, dropout=0.1, encoder=StackConfig(layers=2, ffn_dim=32, **encoder),
                        decoder=StackConfig(layers=2, ffn_dim=32, **decoder), max_positions=16)
    return build_seq2seq(cfg, vocab_size=VOCAB, pad_id=0)


def _source_target() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, VOCAB, (3, 9), generator=g), torch.randint(4, VOCAB, (3, 7), generator=g)
    src[1, 6:], tgt[2, 4:] = 0, 0
    return src, tgt


# The operators ``torch.use_deterministic_algorithms`` says CUDA has no deterministic form of (torch 2.13's list:
# they raise under it on CUDA; and kthvalue, whose CUDA kernel raises too), by aten name, every overload; cumsum only
# for floating-point values.
CUDA_HAS_NO_DETERMINISTIC_FORM = {
    "aten::avg_pool3d_backward", "aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward",
    "aten::adaptive_max_pool2d_backward", "aten::fractional_max_pool2d_backward",
    "aten::fractional_max_pool3d_backward", "aten::max_unpool2d", "aten::max_unpool3d",
    "aten::upsample_linear1d_backward", "aten::upsample_bilinear2d_backward", "aten::upsample_bicubic2d_backward",
    "aten::upsample_trilinear3d_backward", "aten::reflection_pad1d_backward", "aten::reflection_pad2d_backward",
    "aten::reflection_pad3d_backward", "aten::nll_loss2d_forward", "aten::_ctc_loss_backward",
    "aten::_embedding_bag_backward", "aten::put_", "aten::put", "aten::histc", "aten::bincount", "aten::median",
    "aten::nanmedian", "aten::kthvalue", "aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward",
    "aten::cumsum", "aten::cumsum_", "aten::scatter_reduce", "aten::scatter_reduce_",
}


class _Refused(TorchDispatchMode):
    """Records the operators dispatched that CUDA would refuse under deterministic algorithms."""

    def __init__(self):
        super().__init__()
        self.found = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split(".")[0]  # aten::median.dim -> aten::median
        if name in CUDA_HAS_NO_DETERMINISTIC_FORM and (not name.startswith("aten::cumsum") or args[0].is_floating_point()):
            self.found.add(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _deterministic_and_watched(*, watch: bool = True):
    """Deterministic algorithms inside, and (``watch``) the operators dispatched checked against CUDA's refusals.
    Not watched: the flex plan, whose kernel is generated code on CUDA (its CPU reference is traced by dynamo,
    which takes no dispatch mode)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with _Refused() if watch else contextlib.nullcontext() as refused:
            yield
    finally:
        torch.use_deterministic_algorithms(before)
    assert not watch or not refused.found, f"CUDA has no deterministic form of {sorted(refused.found)}"


def _run_seq2seq_on_meta_default(model: torch.nn.Module, *, watch: bool = True) -> None:
    """The guard's run (see the module's docstring): once as by default, once under deterministic algorithms."""
    _run_seq2seq_once(model)
    model.zero_grad(set_to_none=True)
    with _deterministic_and_watched(watch=watch):
        _run_seq2seq_once(model)


def _run_seq2seq_once(model: torch.nn.Module) -> None:
    src, tgt = _source_target()
    with torch.device("meta"):
        model.train()
        model(src, tgt).sum().backward()
        model.eval()
        with torch.no_grad():
            beam_search(model.decode_step, model.start_decoding(src), batch_size=3, beam_size=2, bos=2, eos=3,
                        pad=0, max_lengths=torch.full((3,), 4, device="cpu"), length_penalty=1.0, n_best=1)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.device.type == "cpu" for g in grads)


# Later examples whose guarded runs reach no line of sanlab that an earlier example of the same part does not
# (traced line by line on 2026-12-02): they run in make test, not make test-fast.
SAME_LINES_AS_AN_EARLIER_EXAMPLE = {"bi_direct-1", "capsule-3", "local_hard-2", "local_hard-3", "rel_pos-1",
                                    "rel_pos-2", "window-1"}


def _fast_unless_same_lines(case_id: str) -> tuple:
    return (pytest.mark.slow,) if case_id in SAME_LINES_AS_AN_EARLIER_EXAMPLE else ()


PART_CASES = [pytest.param(cfg, id=f"{name}-{n}", marks=_fast_unless_same_lines(f"{name}-{n}"))
              for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]


@pytest.mark.parametrize("cfg", PART_CASES)
def test_attention_part_creates_no_tensor_on_the_default_device(cfg):
    part = cfg.model_dump()
    attention = {"heads": HEADS, "parts": [part]}
    model = _seq2seq({"attention": attention}, {"attention": {"heads": HEADS}})
    _run_seq2seq_on_meta_default(model)
    plain = {"heads": HEADS}
    for decoder in ({"attention": attention}, {"attention": plain, "cross_attention": attention}):
        try:  # the decoder and cross forms, where the part has them (refusals are the contracts' subject)
            model = _seq2seq({"attention": plain}, decoder)
        except (ValueError, ConfigError):
            continue
        _run_seq2seq_on_meta_default(model)


def test_rel_pos_relation_tables_create_no_tensor_on_the_default_device(monkeypatch):
    """CUDA runs Rel_Pos's relation tables, the CPU (where this guard runs the model) its distance buckets: the
    tables forced here, so the guard and its deterministic-operator check see the form CUDA runs."""
    from sanlab.attention.parts import rel_pos

    monkeypatch.setattr(rel_pos, "relation_tables_pay", lambda **sizes: True)
    test_attention_part_creates_no_tensor_on_the_default_device(PARTS.entry("rel_pos").config.examples()[0])


def _plans_besides_dense(part: dict) -> list[str]:
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=2, side="encoder", max_len=16)
    try:
        built = PARTS.build(PARTS.parse(part), ctx)
    except (ValueError, ConfigError):
        return []
    return fast_plans(Attention(dim=DIM, heads=HEADS, parts=[built]))


PLAN_CASES = [pytest.param(cfg, plan, id=f"{name}-{n}-{plan}",  # flex on the CPU traces its mods at every call
                           marks=[pytest.mark.slow] if plan == "flex" else _fast_unless_same_lines(f"{name}-{n}"))
              for name in PARTS.names()
              for n, cfg in enumerate(PARTS.entry(name).config.examples())
              for plan in _plans_besides_dense(cfg.model_dump())]


@pytest.mark.parametrize("cfg, plan", PLAN_CASES)
def test_every_plan_of_a_part_creates_no_tensor_on_the_default_device(cfg, plan):
    attention = {"heads": HEADS, "parts": [cfg.model_dump()], "plan": plan}
    plain = {"heads": HEADS}
    ran = 0
    for encoder, decoder in (({"attention": attention}, {"attention": plain}),
                             ({"attention": plain}, {"attention": attention})):
        try:  # the decoder form (cached steps through the plan), where the part has one
            model = _seq2seq(encoder, decoder)
        except (ValueError, ConfigError):
            continue
        with spy_plans() as plans_run:
            _run_seq2seq_on_meta_default(model, watch=plan != "flex")
        # the plan guarded ran (the other attentions run theirs): the guard did not watch dense in its place
        assert plan in plans_run, f"plan {plan} never ran; these did: {sorted(set(plans_run))}"
        ran += 1
    assert ran  # (every case has at least its encoder form)


MIXER_NAMES = [name for name in MIXERS.names() if name != "attention"]


@pytest.mark.parametrize("name", MIXER_NAMES)
def test_mixer_creates_no_tensor_on_the_default_device(name):
    mixer = {"type": name}
    decoder = {"mixer": mixer} if name != "block" else {}
    _run_seq2seq_on_meta_default(_seq2seq({"mixer": mixer}, decoder))


@pytest.mark.parametrize("name", PRE_BLOCKS.names())
def test_pre_block_creates_no_tensor_on_the_default_device(name):
    _run_seq2seq_on_meta_default(_seq2seq({"pre_blocks": [{"type": name}]}, {}))


@pytest.mark.parametrize("position,parts", [
    ("add", []), ("concat", []), ("none", [{"type": "abs_position"}, {"type": "rel_position"}]),
    ("add", [{"type": "temperature"}]), ("add", [{"type": "conv_attention", "dims": 2}]),
])
def test_tagger_creates_no_tensor_on_the_default_device(position, parts):
    config = TaggerConfig(word_dim=8, char_dim=4, char_filters=4, char_width=3, char_layers=1, position=position,
                          position_dim=4, max_len=10, encoder=dict(layers=2, ffn_dim=0, attention=dict(
                              heads=2, bias=False, out_proj=False, parts=parts)))
    torch.manual_seed(0)
    model = build_tagger(config, vocab_size=30, num_chars=10, num_tags=5)
    g = torch.Generator().manual_seed(1)
    words, chars = torch.randint(2, 30, (4, 10), generator=g), torch.randint(1, 10, (4, 10, 5), generator=g)
    words[1, 7:] = 0
    for watched in (contextlib.nullcontext, _deterministic_and_watched):
        model.zero_grad(set_to_none=True)
        with watched(), torch.device("meta"):
            model(words, chars).sum().backward()
        assert all(p.grad.device.type == "cpu" for p in model.parameters() if p.grad is not None)


def test_the_guard_catches_what_cuda_refuses_under_deterministic_algorithms_in_every_overload():
    x = torch.randn(4, 5)
    for refused in (lambda: x.cumsum(1), lambda: x.median(dim=1), lambda: x.kthvalue(2, dim=1),
                    lambda: x.scatter_reduce(1, torch.zeros(4, 5, dtype=torch.long), x, reduce="prod")):
        with pytest.raises(AssertionError, match="CUDA has no deterministic form of"), _deterministic_and_watched():
            refused()
    with _deterministic_and_watched():  # an integer cumsum (the beam search's slots) has one
        torch.arange(5).cumsum(0)


def test_the_guard_catches_a_tensor_made_without_device():
    """The mechanism itself: under the meta default, an arange without device= cannot meet a CPU tensor."""
    x = torch.ones(3)
    with torch.device("meta"), pytest.raises((RuntimeError, NotImplementedError)):
        _ = x + torch.arange(3)
    with torch.device("meta"):
        assert (x + torch.arange(3, device=x.device)).tolist() == [1.0, 2.0, 3.0]
