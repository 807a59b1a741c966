from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass, field

import pytest
import torch

from sanlab.decoding.cache import expand_for_beams, reorder


@dataclass(frozen=True)
class KV:
    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class LayerState:
    name: str
    self_attn: KV
    conv: list
    step: int
    extra: object = None


@dataclass
class WithDerived:
    x: torch.Tensor
    rows: torch.Tensor = field(init=False)

    def __post_init__(self):
        self.rows = self.x.sum(1)


Pair = namedtuple("Pair", "first second")


def _nested(batch: int):
    rows = torch.arange(batch, dtype=torch.float)
    kv = KV(k=rows.view(batch, 1, 1, 1).expand(batch, 2, 3, 4).clone(), v=rows.view(batch, 1) * 10)
    layer = LayerState(name="layer0", self_attn=kv, conv=[rows.view(batch, 1) + 100, None, 7], step=3)
    return {
        "layers": [layer, layer],
        "memory": (rows.view(batch, 1, 1).expand(batch, 5, 2).clone(), "kept"),
        "pair": Pair(first=rows.long(), second=OrderedDict(a=rows * 2, b=None)),
    }


def test_reorder_selects_rows_of_every_tensor_and_keeps_other_leaves():
    cache = _nested(4)
    index = torch.tensor([3, 3, 0, 2])
    out = reorder(cache, index)
    expected_rows = index.float()

    layer = out["layers"][0]
    assert isinstance(layer, LayerState) and isinstance(layer.self_attn, KV)
    assert torch.equal(layer.self_attn.k[:, 1, 2, 3], expected_rows)
    assert torch.equal(layer.self_attn.v[:, 0], expected_rows * 10)
    assert torch.equal(layer.conv[0][:, 0], expected_rows + 100)
    assert layer.conv[1] is None and layer.conv[2] == 7
    assert layer.name == "layer0" and layer.step == 3 and layer.extra is None
    assert isinstance(out["memory"], tuple) and out["memory"][1] == "kept"
    assert torch.equal(out["memory"][0][:, 4, 1], expected_rows)
    assert isinstance(out["pair"], Pair) and isinstance(out["pair"].second, OrderedDict)
    assert torch.equal(out["pair"].first, index)
    assert torch.equal(out["pair"].second["a"], expected_rows * 2) and out["pair"].second["b"] is None


def test_reorder_leaves_the_input_untouched_and_can_drop_rows():
    cache = _nested(4)
    before = cache["layers"][0].self_attn.v.clone()
    out = reorder(cache, torch.tensor([1, 2]))
    assert torch.equal(cache["layers"][0].self_attn.v, before)
    assert torch.equal(out["layers"][0].self_attn.v, before[[1, 2]])
    assert torch.equal(out["memory"][0], cache["memory"][0][[1, 2]])


def test_reorder_handles_init_false_fields_and_plain_values():
    state = WithDerived(x=torch.arange(6.0).view(3, 2))
    out = reorder(state, torch.tensor([2, 0]))
    assert torch.equal(out.x, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    assert torch.equal(out.rows, torch.tensor([9.0, 1.0]))
    assert reorder(None, torch.tensor([0])) is None
    assert reorder("text", torch.tensor([0])) == "text"


def test_expand_for_beams_is_reorder_with_repeated_rows():
    cache = _nested(3)
    out = expand_for_beams(cache, 2)
    ref = reorder(cache, torch.arange(3).repeat_interleave(2))
    assert torch.equal(out["layers"][1].self_attn.k, ref["layers"][1].self_attn.k)
    assert torch.equal(out["pair"].first, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert expand_for_beams({"n": 1}, 4) == {"n": 1}


def test_expand_for_beams_refuses_tensors_without_a_common_batch():
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        expand_for_beams([torch.zeros(2), torch.zeros(3)], 2)
    with pytest.raises(ValueError, match="beam_size"):
        expand_for_beams([torch.zeros(2)], 0)


@dataclass(frozen=True)
class Source:
    """A cache whose ``memory`` (and the init=False ``lengths`` made from it) holds the same rows in every beam."""

    memory: torch.Tensor
    steps: KV
    lengths: torch.Tensor = field(init=False)
    beam_shared_fields = ("memory", "lengths")  # a plain class attribute: no annotation, so not a field

    def __post_init__(self):
        object.__setattr__(self, "lengths", self.memory.sum(1))


def test_reorder_within_sentences_keeps_the_beam_shared_fields_and_reorders_the_rest():
    k = 2
    memory = torch.arange(3.0).repeat_interleave(k).view(6, 1).expand(6, 4).clone()  # 3 sentences x 2 beams
    steps = KV(k=torch.arange(6.0).view(6, 1), v=torch.arange(6.0).view(6, 1) * 10)
    cache = [Source(memory=memory, steps=steps)]
    index = torch.tensor([1, 1, 2, 3, 5, 4])  # every row taken from its own sentence's rows
    within, full = reorder(cache, index, within_sentences=True)[0], reorder(cache, index)[0]
    assert within.memory is memory and within.lengths is cache[0].lengths  # kept, not copied
    assert torch.equal(within.memory, full.memory) and torch.equal(within.lengths, full.lengths)
    assert torch.equal(within.steps.k, index.float().view(6, 1)) and torch.equal(within.steps.v, full.steps.v)
    assert full.memory is not memory


def test_reorder_within_sentences_refuses_a_shared_field_name_that_is_no_field():
    @dataclass(frozen=True)
    class Misspelt:
        memory: torch.Tensor
        beam_shared_fields = ("memroy",)

    cache = Misspelt(torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"Misspelt.beam_shared_fields names \['memroy'\]"):
        reorder(cache, torch.tensor([0, 1]), within_sentences=True)
    assert reorder(cache, torch.tensor([1, 0])).memory.shape == (2, 3)  # a full reorder does not ask
