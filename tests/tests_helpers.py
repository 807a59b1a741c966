"""Small builders shared by tests (imported as ``tests_helpers``; tests/ is on sys.path via conftest)."""

import contextlib
import dataclasses
import functools
import inspect
import typing

import torch

import sanlab.decoding.search as search
import sanlab.layers.dynamic_conv as dynamic_conv
from sanlab.attention import banded, flex, plans
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


@dataclasses.dataclass
class Call:
    """One call a spy saw: its arguments and what it returned (None while it runs, or if it raised)."""

    args: tuple
    kwargs: dict
    result: object = None


@contextlib.contextmanager
def _replaced(obj, name: str, make):
    """``obj.name`` replaced by ``make(real)`` inside the block and put back on exit, also after an exception.

    ``obj``: a module, a class or an instance. A name ``obj`` inherits (a class's method seen from an instance, a
    base class's from a subclass) is deleted on exit, so that the inherited one shows through again; a static or
    class method stays one (its replacement calls it bound as it was)."""
    raw = inspect.getattr_static(obj, name)  # the stored attribute, descriptor and all
    owned = name in vars(obj)
    real = getattr(obj, name)
    new = functools.wraps(real)(make(real))
    setattr(obj, name, staticmethod(new) if isinstance(raw, (staticmethod, classmethod)) else new)
    try:
        yield
    finally:
        if owned:
            setattr(obj, name, raw)
        else:
            delattr(obj, name)


@contextlib.contextmanager
def spy_calls(obj, name: str):
    """Inside the block, ``obj.name`` records each call as a ``Call`` in the list it yields, and still runs (the
    result passes through): a test can assert which code ran, not only that two paths agree.

    Only calls that look the name up on ``obj`` are seen (``module.f(...)``, not a copy made by ``from module import
    f`` before the block): spy on the attribute the code under test calls through."""
    calls: list[Call] = []

    def make(real):
        def spy(*args, **kwargs):
            call = Call(args, kwargs)
            calls.append(call)  # before running: a call that raises is recorded too
            call.result = real(*args, **kwargs)
            return call.result
        return spy

    with _replaced(obj, name, make):
        yield calls


@contextlib.contextmanager
def _spy_labelled(targets: dict[str, tuple[object, str]]):
    """Yields one list that receives the label of each target (label -> (obj, name)) as it is called, in order."""
    ran: list[str] = []

    def recorder(label):
        def make(real):
            def spy(*args, **kwargs):
                ran.append(label)
                return real(*args, **kwargs)
            return spy
        return make

    with contextlib.ExitStack() as stack:
        for label, (obj, name) in targets.items():
            stack.enter_context(_replaced(obj, name, recorder(label)))
        yield ran


# the function that runs each plan (what ``Attention._attend`` calls once ``plans.choose`` has picked)
PLAN_FUNCTIONS = {"dense": (plans, "dense"), "sdpa": (plans, "sdpa"), "banded": (banded, "attend"),
                  "flex": (flex, "attend")}
# a plan added to ``plans.Plan`` needs its function here, or spy_plans would not see it run
assert set(PLAN_FUNCTIONS) == set(typing.get_args(plans.Plan)), "tests_helpers.PLAN_FUNCTIONS lacks a plan"
# the plans besides the dense reference: each must equal dense, and a test of one must check that it ran
FAST_PLANS = tuple(plan for plan in typing.get_args(plans.Plan) if plan != "dense")


def spy_plans():
    """A context manager yielding the list of the attention plans that run inside it, one name per call of a plan
    (``"dense"``, ``"sdpa"``, ``"banded"``, ``"flex"``), in order: a test of a fast plan asserts it ran, where
    ``plans.choose`` falling back to dense would otherwise compare dense with itself."""
    return _spy_labelled(PLAN_FUNCTIONS)


def fast_plans(attention) -> list[str]:
    """The fast plans (``FAST_PLANS``) an ``Attention`` can run for its parts and heads, in ``plans.runnable``'s
    order; flex only where this torch has FlexAttention."""
    return [plan for plan in attention.runnable_plans if plan in FAST_PLANS]


def spy_conv_algorithms():
    """A context manager yielding the list of the dynamic/light convolution algorithms that run inside it
    (``"band"``, ``"unfold"``; one per full-sequence call, in order). Cached decoding steps weigh their windows
    directly, with neither."""
    return _spy_labelled({"band": (dynamic_conv, "band_conv"), "unfold": (dynamic_conv, "unfold_conv")})


def reorder_whole_caches(monkeypatch) -> None:
    """Make beam search copy its whole cache after every step, the beam-shared source side too (its behaviour
    before ``reorder(..., within_sentences=True)``): the reference the in-place source side must decode like."""
    real = search.reorder
    monkeypatch.setattr(search, "reorder", lambda cache, index, *, within_sentences=False: real(cache, index))


def perturb(module: torch.nn.Module, scale: float = 0.3, seed: int = 3) -> torch.nn.Module:
    """Move every parameter off its initial value: many parts start as the identity (temperatures 1,
    gates, biases 0), where a cached or fast path that dropped or doubled them would still match."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            # drawn on the CPU (the same noise whatever the device), then moved to the parameter's device
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device))
    return module


class HostReads(torch.overrides.TorchFunctionMode):
    """Records every operation that reads a tensor's value on the host, in order, with "step" markers.

    On a GPU each of these waits for the device's queue (a sync); on the CPU they are free, so this is
    how a CPU test sees them: ``bool(t)``, ``int(t)``, ``.item()``, ``.tolist()``, ``.cpu()``,
    ``.nonzero()``, ``masked_select`` and indexing with a boolean mask (its size depends on the values).
    """

    NAMES = frozenset({"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy",
                       "nonzero", "masked_select", "unique", "equal"})

    def __init__(self):
        super().__init__()
        self.events: list[str] = []
        self._ignoring = 0

    @contextlib.contextmanager
    def ignoring(self):
        """Record nothing inside (host-side work whose reads are of host tensors, which never wait on a GPU)."""
        self._ignoring += 1
        try:
            yield
        finally:
            self._ignoring -= 1

    def mark(self, label: str = "step") -> None:
        self.events.append(label)

    def reads(self) -> list[str]:
        return [e for e in self.events if e != "step"]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if not self._ignoring and (name in self.NAMES
                                   or (name in ("__getitem__", "__setitem__") and _has_bool_index(args))):
            self.events.append(name)
        return func(*args, **(kwargs or {}))


def _has_bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    index = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def assert_close_in_norm(actual: dict, expected: dict, *, rtol: float, what: str) -> None:
    """Each tensor of ``actual`` within ``rtol`` of ``expected``'s in norm: ||a - b|| <= rtol * ||b||. For gradients
    of weights, sums over every token of a batch: in bf16 their rounding noise grows with the sum while single
    entries can cancel to near zero, so an entrywise tolerance fails on those entries whatever their noise."""
    assert actual.keys() == expected.keys(), f"{what}: {sorted(actual)} vs {sorted(expected)}"
    for name, a in actual.items():
        b = expected[name]
        assert (a is None) == (b is None), f"{what}: {name} has a gradient in one run only"
        if a is None:
            continue
        error, scale = (a.float() - b.float()).norm().item(), b.float().norm().item()
        assert error <= rtol * scale, (f"{what}: {name} differs by {error:.3g} in norm "
                                       f"({error / max(scale, 1e-30):.3g} of its norm {scale:.3g}; allowed {rtol})")


def weight_grads(attention: torch.nn.Module) -> dict:
    """The gradients of an ``Attention``'s weights, less the key projection's bias where every key of a row shares
    it (no part extends the keys): softmax ignores such a bias, so its gradient is zero, and what a run computes
    for it is rounding noise. (2D-CSAN's head slots carry each their own head's bias: there it counts.)"""
    shared = not attention.stage_parts.extend
    return {n: p.grad for n, p in attention.named_parameters() if not (shared and n.endswith("k_proj.bias"))}
