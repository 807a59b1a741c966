"""The shared test helpers' spies (tests_helpers.spy_calls, spy_plans, spy_conv_algorithms) and perturb: the tests
that assert which plan or algorithm ran rely on them seeing what ran, passing results through and putting back
what they replaced."""

import types

import pytest
import torch

import sanlab.layers.dynamic_conv as dynamic_conv
import tests_helpers
from sanlab.attention import Attention, Positions, banded, flex, plans
from sanlab.attention.parts.window import build_window
from sanlab.attention.parts.window_config import WindowConfig
from sanlab.layers.dynamic_conv import DynamicConv, PredictedKernels
from sanlab.registry import BuildContext
from tests_helpers import FAST_PLANS, fast_plans, perturb, spy_calls, spy_conv_algorithms, spy_plans

ENCODER = BuildContext(dim=16, heads=4, layer_index=0, num_layers=1, side="encoder", max_len=32)


def _module():
    module = types.ModuleType("spied")
    module.double = lambda x, *, times=2: x * times
    return module


class _Base:
    def scaled(self, x):
        return x * self.factor

    @staticmethod
    def plus_one(x):
        return x + 1

    @classmethod
    def name(cls):
        return cls.__name__


class _Child(_Base):
    factor = 3


def test_spy_calls_records_the_arguments_and_passes_the_result_through():
    module = _module()
    with spy_calls(module, "double") as calls:
        assert module.double(4, times=3) == 12
        assert module.double(5) == 10
    assert [(c.args, c.kwargs, c.result) for c in calls] == [((4,), {"times": 3}, 12), ((5,), {}, 10)]
    module.double(6)
    assert len(calls) == 2  # nothing recorded after the block


def test_spy_calls_puts_the_original_back_after_an_exception():
    module = _module()
    real = module.double
    with pytest.raises(ZeroDivisionError), spy_calls(module, "double") as calls:
        module.double(1)
        1 / 0
    assert module.double is real and len(calls) == 1


def test_a_call_that_raises_is_recorded_and_its_exception_passes_through():
    module = _module()
    with spy_calls(module, "double") as calls, pytest.raises(TypeError):
        module.double(1, 2)  # times is keyword-only
    assert len(calls) == 1 and calls[0].args == (1, 2) and calls[0].result is None
    assert module.double(1) == 2


def test_spy_calls_on_methods_binds_as_before_and_leaves_inherited_ones_inherited():
    child = _Child()
    with spy_calls(_Child, "scaled") as on_class, spy_calls(_Child, "plus_one") as static, \
            spy_calls(_Child, "name") as on_cls:
        assert child.scaled(2) == 6 and _Child.plus_one(1) == 2 and child.plus_one(1) == 2
        assert _Child.name() == "_Child" and child.name() == "_Child"
    assert len(on_class) == 1 and on_class[0].args == (child, 2)
    assert len(static) == 2 and len(on_cls) == 2
    # inherited from _Base: deleted from _Child on exit, not left as a copy on the subclass
    assert not {"scaled", "plus_one", "name"} & set(vars(_Child))
    assert isinstance(vars(_Base)["plus_one"], staticmethod) and isinstance(vars(_Base)["name"], classmethod)
    with spy_calls(child, "scaled") as on_instance:
        assert child.scaled(5) == 15
    assert on_instance[0].args == (5,) and "scaled" not in vars(child)


def _window_attention(plan: str) -> Attention:
    torch.manual_seed(0)
    return Attention(dim=16, heads=4, parts=[build_window(WindowConfig(size=3), ENCODER)], plan=plan).eval()


@pytest.mark.parametrize("plan", ["dense", "sdpa", "banded"])
def test_spy_plans_sees_the_plan_that_ran_and_no_other(plan):
    attn = _window_attention(plan)
    with spy_plans() as ran:
        attn(torch.randn(2, 5, 16), positions=Positions.self_attention(None, length=5))
    assert ran == [plan]


def test_spy_plans_records_each_call_in_order_and_puts_the_plans_back():
    real = {name: getattr(obj, attr) for name, (obj, attr) in tests_helpers.PLAN_FUNCTIONS.items()}
    attn, x = _window_attention("auto"), torch.randn(1, 5, 16)
    positions = Positions.self_attention(None, length=5)
    with spy_plans() as ran:
        attn(x, positions=positions)  # auto, 5 keys: the fused plan
        attn(x, positions=positions, need_trace=True)  # a trace needs the dense matrix
    assert ran == ["sdpa", "dense"]
    assert (plans.dense, plans.sdpa, banded.attend, flex.attend) == tuple(real.values())
    with pytest.raises(ValueError, match="divisible"), spy_plans(), spy_conv_algorithms():
        Attention(dim=15, heads=4)  # an exception inside: the plans (and algorithms) are put back all the same
    assert (plans.dense, plans.sdpa, banded.attend, flex.attend) == tuple(real.values())


def test_fast_plans_are_the_runnable_plans_besides_dense():
    assert set(FAST_PLANS) == {"sdpa", "banded", "flex"}
    assert fast_plans(Attention(dim=16, heads=4)) == ["sdpa"]
    windowed = ["sdpa", "banded", *(["flex"] if flex.AVAILABLE else [])]
    assert fast_plans(_window_attention("auto")) == windowed


def test_spy_conv_algorithms_sees_the_algorithm_that_ran():
    x, real = torch.randn(1, 6, 8), (dynamic_conv.band_conv, dynamic_conv.unfold_conv)
    with spy_conv_algorithms() as ran:
        for algorithm in ("band", "unfold", "band"):
            conv = DynamicConv(kernels=PredictedKernels(dim=8, heads=2, kernel_size=3), causal=True,
                               algorithm=algorithm).eval()
            conv(x)
        conv(x[:, :1], use_cache=True)  # a cached step: neither
    assert ran == ["band", "unfold", "band"]
    assert (dynamic_conv.band_conv, dynamic_conv.unfold_conv) == real


def test_perturb_draws_its_noise_for_the_parameters_device_and_dtype():
    on_meta = perturb(torch.nn.Linear(3, 2, device="meta", dtype=torch.bfloat16))
    assert {(p.device.type, p.dtype) for p in on_meta.parameters()} == {("meta", torch.bfloat16)}
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2).double(), torch.nn.Linear(3, 2).double()
    b.load_state_dict(a.state_dict())
    before = a.weight.clone()
    perturb(a), perturb(b)
    assert not torch.equal(a.weight, before)
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=0)  # the same seed: the same noise
