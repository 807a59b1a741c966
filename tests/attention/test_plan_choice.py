"""``plans.choose``: the one place that picks the plan of a call, from the parts, the request, the device,
the number of keys and whether a trace is asked for; ``plans.check`` refuses impossible requests early."""

import pytest
import torch

from sanlab.attention import Attention, AttentionPart, Positions, banded, plans
from sanlab.attention.parts.csan2d import HeadArea
from sanlab.attention.parts.window import WindowMask
from sanlab.attention.plans import StageParts

CPU = torch.device("cpu")
SHORT, LONG = banded.MIN_KEYS - 1, banded.MIN_KEYS


class _Score(AttentionPart):
    def score(self, scores, ctx):
        return scores


def _choose(parts: list, requested: str, *, keys: int = SHORT, trace: bool = False) -> str:
    return plans.choose(StageParts.sort(parts), requested=requested, device=CPU, key_length=keys, need_trace=trace)


WINDOW, AREA = WindowMask(half_width=2), HeadArea(half_width=2, area=3, boundary="wrap")


@pytest.mark.parametrize("parts, requested, keys, trace, expected", [
    ([], "auto", SHORT, False, "sdpa"),            # plain attention: fused
    ([], "auto", LONG, False, "sdpa"),             # nothing to band
    ([], "auto", SHORT, True, "dense"),            # a trace needs the score matrix
    ([], "banded", LONG, False, "dense"),          # a layer without parts in a banded stack
    ([WINDOW], "auto", SHORT, False, "sdpa"),      # a mask part: fused below MIN_KEYS ...
    ([WINDOW], "auto", LONG, False, "banded"),     # ... banded from MIN_KEYS keys on
    ([WINDOW], "auto", LONG, True, "dense"),
    ([WINDOW], "banded", SHORT, False, "banded"),  # an explicit request ignores the length
    ([WINDOW], "banded", LONG, True, "dense"),     # but not a trace
    ([WINDOW], "dense", LONG, False, "dense"),
    ([WINDOW], "sdpa", LONG, False, "sdpa"),
    ([WINDOW], "sdpa", LONG, True, "sdpa"),        # an explicit 'sdpa' runs even with a trace (left empty)
    ([AREA], "auto", SHORT, False, "dense"),       # extend: no fused plan
    ([AREA], "auto", LONG, False, "banded"),
    ([WINDOW, AREA], "auto", LONG, False, "banded"),
    ([_Score()], "auto", LONG, False, "dense"),    # a score part: dense only
    ([_Score()], "dense", SHORT, False, "dense"),
])
def test_choose_picks_the_plan_for_parts_request_length_and_trace(parts, requested, keys, trace, expected):
    assert _choose(parts, requested, keys=keys, trace=trace) == expected


def test_runnable_lists_the_plans_equal_to_dense():
    assert plans.runnable(StageParts.sort([])) == ("dense", "sdpa")
    assert plans.runnable(StageParts.sort([WINDOW])) == ("dense", "sdpa", "banded")
    assert plans.runnable(StageParts.sort([AREA])) == ("dense", "banded")
    assert plans.runnable(StageParts.sort([WINDOW, _Score()])) == ("dense",)


def test_impossible_requests_are_refused_when_the_attention_is_built():
    with pytest.raises(ValueError, match="plan 'sdpa' cannot run parts that read the score matrix"):
        Attention(dim=16, heads=4, parts=[_Score()], plan="sdpa")
    with pytest.raises(ValueError, match="plan 'banded' needs window-local parts only.*got parts: _Score"):
        Attention(dim=16, heads=4, parts=[_Score()], plan="banded")
    with pytest.raises(ValueError, match="unknown attention plan 'flash'"):
        Attention(dim=16, heads=4, plan="flash")
    plans.check("banded", [])  # no parts: nothing to band, runs dense
    plans.check("sdpa", [WINDOW])


def test_every_call_asks_choose_with_the_keys_it_attends_to(monkeypatch):
    asked, real = [], plans.choose
    monkeypatch.setattr(plans, "choose", lambda parts, **kw: asked.append(kw) or real(parts, **kw))
    attn = Attention(dim=16, heads=4, parts=[WindowMask(half_width=1)]).eval()
    x = torch.randn(1, 4, 16)
    first = attn(x[:, :3], positions=Positions.self_attention(None, length=3, causal=True), use_cache=True)
    attn(x[:, 3:], positions=Positions.self_attention(None, length=1, offset=3, causal=True), cache=first.cache,
         use_cache=True, need_trace=True)
    assert [(kw["requested"], kw["key_length"], kw["need_trace"], kw["device"]) for kw in asked] == [
        ("auto", 3, False, CPU), ("auto", 4, True, CPU)]  # cached keys count
