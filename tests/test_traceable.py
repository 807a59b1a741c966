"""``sanlab.traceable.replace``: what ``dataclasses.replace`` gives, in a form torch.compile traces on torch 2.5 and
2.6 too (whose dynamo breaks the graph at the standard library's; ``tests/training/test_compile.py`` counts the
breaks of every recipe)."""

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch

from sanlab.attention.positions import Positions
from sanlab.traceable import replace, replaceable


@replaceable
@dataclass(frozen=True)
class _Record:
    a: torch.Tensor
    b: int = 1
    shared: list = field(default_factory=list)
    derived: int = field(init=False, default=0)

    def __post_init__(self):
        object.__setattr__(self, "derived", self.b * 10)


def _same(x, y) -> bool:
    """Field by field, tensors by identity: what the generated ``__eq__`` did before Python 3.13 (a tuple compare,
    identity first); 3.13's compares each field with ``==``, and a tensor's ``==`` has no single truth value."""
    def equal(a, b):
        return a is b or (not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and a == b)
    return type(x) is type(y) and all(equal(getattr(x, f.name), getattr(y, f.name)) for f in dataclasses.fields(x))


def test_replace_equals_the_standard_librarys():
    record = _Record(torch.ones(2), b=2)
    mine, theirs = replace(record, b=3), dataclasses.replace(record, b=3)
    assert _same(mine, theirs) and mine.derived == 30          # __post_init__ ran again, as replace's does
    assert mine.a is record.a and mine.shared is record.shared  # unchanged fields are the same objects
    assert _same(replace(record), record) and replace(record) is not record


def test_replace_refuses_what_the_class_does_not_take():
    record = _Record(torch.ones(2))
    for bad in ({"c": 1}, {"derived": 5}):
        with pytest.raises(TypeError):
            replace(record, **bad)
    with pytest.raises(TypeError, match="not @replaceable"):
        replace(dataclasses.make_dataclass("Plain", ["x"])(1), x=2)


def test_replace_on_the_models_own_dataclasses():
    pos, longer = Positions(q_pos=torch.arange(4), k_pos=torch.arange(4), causal=True), torch.arange(5)
    assert _same(replace(pos, k_pos=longer), dataclasses.replace(pos, k_pos=longer))


def test_torch_compile_traces_it_in_one_graph():
    import torch._dynamo

    def step(x):
        record = replace(_Record(x), a=x * 2)
        return record.a + record.b

    torch._dynamo.reset()
    found = torch._dynamo.explain(step)(torch.ones(3))
    assert found.graph_count == 1 and not found.break_reasons, found.break_reasons
    torch._dynamo.reset()
