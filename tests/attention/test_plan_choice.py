"""``plans.choose``: the one place that picks the plan of a call, from the parts, the request, the device,
the number of keys, whether a trace is asked for and whether attention dropout is active; ``plans.check``
refuses impossible requests early. The CUDA cases only ask for a decision: ``choose`` never touches the device."""

import pytest
import torch

from sanlab.attention import Attention, AttentionPart, Positions, banded, flex, plans
from sanlab.attention.parts.csan2d import HeadArea
from sanlab.attention.parts.directional import DirectionalHeads
from sanlab.attention.parts.gaussian import LocalHard, NeighborSperber
from sanlab.attention.parts.window import WindowMask
from sanlab.attention.plans import StageParts
from sanlab.errors import ConfigError
from tests_helpers import spy_calls, spy_plans

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SHORT, LONG = banded.MIN_KEYS - 1, banded.MIN_KEYS
FLEX_SHORT, FLEX_LONG = flex.MIN_KEYS - 1, flex.MIN_KEYS
CUDA_BAND = banded.CUDA_MIN_KEYS


class _Score(AttentionPart):
    def score(self, scores, ctx):
        return scores


def _choose(parts: list, requested: str, *, keys: int = SHORT, trace: bool = False, device=CPU,
            dropout: bool = False, queries: int = 2) -> str:
    return plans.choose(StageParts.sort(parts), requested=requested, device=device, key_length=keys,
                        query_length=queries, need_trace=trace, dropout=dropout)


WINDOW, AREA = WindowMask(half_width=2), HeadArea(half_width=2, area=3, boundary="wrap")
DIRECTIONS = DirectionalHeads(heads=4, pairs=1)
GAUSS = NeighborSperber(heads=4, local_heads=2, sigma_init=2.0, square=False)
TRUNCATED = LocalHard(dim=16, heads=4, local_heads=2, head_dim=4, window=2.0, truncate=True)
LUONG = LocalHard(dim=16, heads=4, local_heads=2, head_dim=4, window=2.0, luong_exact=True)


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


@pytest.mark.parametrize("parts", [[WINDOW], [DIRECTIONS], [GAUSS], [TRUNCATED], [WINDOW, GAUSS]])
@pytest.mark.parametrize("requested", ["auto", "dense", "sdpa", "banded", "flex"])
@pytest.mark.parametrize("keys", [SHORT, LONG, FLEX_LONG])
def test_flexattention_changes_nothing_on_the_cpu_unless_asked_for(parts, requested, keys):
    """What every call chose before the flex plan existed, for parts it can run: flex only when requested."""
    can = plans.runnable(StageParts.sort(parts))
    try:  # what plans.check refuses never reaches choose (e.g. 'flex' on torch 2.5, 'sdpa' for a score part)
        plans.check(requested, parts)
    except ValueError as refused:
        # and it refuses only that: a fused plan that cannot run these parts, or flex on a torch without it
        assert (requested in ("sdpa", "banded") and requested not in can) or (
            requested == "flex" and not flex.AVAILABLE), f"plans.check refused {requested!r}: {refused}"
        pytest.skip(f"refused at construction on torch {torch.__version__}: {refused}")
    banded_ok, sdpa_ok = "banded" in can, "sdpa" in can
    before = ("banded" if banded_ok and (requested == "banded" or (requested == "auto" and keys >= banded.MIN_KEYS))
              else "sdpa" if requested == "sdpa" or (requested == "auto" and sdpa_ok) else "dense")
    assert _choose(parts, requested, keys=keys) == ("flex" if requested == "flex" else before)


@pytest.mark.skipif(not flex.AVAILABLE, reason="this torch has no FlexAttention")
@pytest.mark.parametrize("parts, requested, keys, trace, dropout, expected", [
    ([], "auto", FLEX_LONG, False, False, "sdpa"),               # global attention: the fused kernel, no mask
    ([], "flex", FLEX_LONG, False, False, "sdpa"),               # a layer without parts in a flex stack
    ([WINDOW], "auto", CUDA_BAND - 1, False, False, "sdpa"),     # a short window: SDPA + mask ...
    ([WINDOW], "auto", CUDA_BAND, False, False, "banded"),       # ... banded from CUDA_MIN_KEYS on
    ([WINDOW], "auto", FLEX_LONG, False, False, "banded"),       # banded, not FlexAttention (measured faster)
    ([WINDOW], "auto", FLEX_LONG, True, False, "dense"),         # a trace needs the score matrix
    ([WINDOW], "auto", FLEX_LONG, False, True, "banded"),        # attention dropout
    ([WINDOW], "banded", 3, False, False, "banded"),             # an explicit request is kept
    ([WINDOW], "sdpa", FLEX_LONG, False, False, "sdpa"),
    ([WINDOW], "flex", 3, False, False, "flex"),                 # and ignores the length
    ([DIRECTIONS], "auto", FLEX_SHORT, False, False, "sdpa"),    # per-head masks: SDPA + mask when short ...
    ([DIRECTIONS], "auto", FLEX_LONG, False, False, "flex"),     # ... FlexAttention from flex.MIN_KEYS on
    ([DIRECTIONS], "auto", FLEX_LONG, False, True, "sdpa"),      # FlexAttention has no attention dropout
    ([GAUSS], "auto", FLEX_SHORT, False, False, "dense"),        # a score part: dense when short ...
    ([GAUSS], "auto", FLEX_LONG, False, False, "flex"),          # ... its bias as a score_mod when long
    ([TRUNCATED], "auto", FLEX_LONG, False, False, "flex"),      # a data-dependent window and its bias
    ([LUONG], "auto", FLEX_LONG, False, False, "dense"),         # scales the weights: dense only
    ([AREA], "auto", SHORT, False, False, "dense"),              # 2D-CSAN mixes heads: no SDPA, so it
    ([AREA], "auto", LONG, False, False, "banded"),              # bands from banded.MIN_KEYS, as on the CPU
    ([_Score()], "auto", FLEX_LONG, False, False, "dense"),      # a score part that offers no score_mod
])
def test_choose_on_cuda(parts, requested, keys, trace, dropout, expected):
    assert _choose(parts, requested, keys=keys, trace=trace, device=CUDA, dropout=dropout) == expected


@pytest.mark.skipif(not flex.AVAILABLE, reason="this torch has no FlexAttention")
def test_deterministic_algorithms_keep_score_parts_off_flexattention_on_cuda():
    """FlexAttention's backward adds the gradients of a score_mod's learned inputs atomically on CUDA: under
    deterministic algorithms ``auto`` runs score parts dense there, and an explicit ``flex`` is refused; masks alone
    (no learned input) and the CPU's reference operator stay as they were."""
    torch.use_deterministic_algorithms(True)
    try:
        for gaussian in (GAUSS, TRUNCATED):
            assert _choose([gaussian], "auto", keys=FLEX_LONG, device=CUDA) == "dense"
            with pytest.raises(ConfigError, match="plan 'flex' cannot run the score parts .* train.deterministic"):
                _choose([gaussian], "flex", keys=FLEX_LONG, device=CUDA)
            assert _choose([gaussian], "flex", keys=FLEX_LONG, trace=True, device=CUDA) == "dense"
            assert _choose([gaussian], "flex", keys=FLEX_LONG) == "flex"  # the CPU
        assert _choose([DIRECTIONS], "auto", keys=FLEX_LONG, device=CUDA) == "flex"
        assert _choose([WINDOW], "flex", keys=3, device=CUDA) == "flex"
    finally:
        torch.use_deterministic_algorithms(False)
    assert _choose([GAUSS], "auto", keys=FLEX_LONG, device=CUDA) == "flex"


@pytest.mark.skipif(not flex.AVAILABLE, reason="this torch has no FlexAttention")
@pytest.mark.parametrize("device", [CPU, CUDA], ids=["cpu", "cuda"])
@pytest.mark.parametrize("parts, keys, expected", [
    ([WINDOW], 3, "sdpa"),                   # what auto runs for the step: SDPA + mask when short ...
    ([WINDOW], FLEX_LONG, "banded"),         # ... banded when long
    ([DIRECTIONS], FLEX_LONG, "sdpa"),       # auto would take flex here on CUDA, but not for one query
    ([GAUSS], 3, "dense"),                   # a score part: dense
    ([TRUNCATED], FLEX_LONG, "dense"),
])
def test_a_single_query_never_runs_flexattention(parts, keys, expected, device):
    """A decoding step has one query and one key more than the last: FlexAttention's compiled kernel, made for one
    (query length, key length), compiled anew at every step (up to the recompile limit). One query against J keys
    costs O(J) in every plan, so such a call runs what ``auto`` runs without flex, also where ``flex`` is asked."""
    for requested in ("flex", "auto"):
        assert _choose(parts, requested, keys=keys, device=device, queries=1) == expected
    assert _choose(parts, "flex", keys=keys, device=device, queries=2) == "flex"  # a prompt keeps it


def test_runnable_lists_the_plans_equal_to_dense():
    flex_too = ("flex",) if flex.AVAILABLE else ()
    assert plans.runnable(StageParts.sort([])) == ("dense", "sdpa")
    assert plans.runnable(StageParts.sort([WINDOW])) == ("dense", "sdpa", "banded", *flex_too)
    assert plans.runnable(StageParts.sort([AREA])) == ("dense", "banded")
    assert plans.runnable(StageParts.sort([WINDOW, _Score()])) == ("dense",)
    assert plans.runnable(StageParts.sort([GAUSS])) == ("dense", *flex_too)
    assert plans.runnable(StageParts.sort([LUONG])) == ("dense",)


def test_impossible_requests_are_refused_when_the_attention_is_built():
    with pytest.raises(ValueError, match="plan 'sdpa' cannot run parts that read the score matrix"):
        Attention(dim=16, heads=4, parts=[_Score()], plan="sdpa")
    with pytest.raises(ValueError, match="plan 'banded' needs window-local parts only.*got parts: _Score"):
        Attention(dim=16, heads=4, parts=[_Score()], plan="banded")
    with pytest.raises(ValueError, match="unknown attention plan 'flash'"):
        Attention(dim=16, heads=4, plan="flash")
    plans.check("banded", [])  # no parts: nothing to band, runs dense
    plans.check("sdpa", [WINDOW])


def test_every_call_asks_choose_with_the_keys_it_attends_to():
    attn = Attention(dim=16, heads=4, parts=[WindowMask(half_width=1)]).eval()
    x = torch.randn(1, 4, 16)
    with spy_calls(plans, "choose") as asked, spy_plans() as ran:
        first = attn(x[:, :3], positions=Positions.self_attention(None, length=3, causal=True), use_cache=True)
        attn(x[:, 3:], positions=Positions.self_attention(None, length=1, offset=3, causal=True), cache=first.cache,
             use_cache=True, need_trace=True)
    assert [(c.kwargs["requested"], c.kwargs["key_length"], c.kwargs["query_length"], c.kwargs["need_trace"],
             c.kwargs["device"], c.kwargs["dropout"]) for c in asked] == [
        ("auto", 3, 3, False, CPU, False), ("auto", 4, 1, True, CPU, False)]  # cached keys count
    assert [c.result for c in asked] == ran == ["sdpa", "dense"]  # what it chose ran


def test_attention_dropout_is_active_only_in_training():
    attn = Attention(dim=16, heads=4, dropout=0.1)
    positions = Positions.self_attention(None, length=3)
    with spy_calls(plans, "choose") as asked:
        attn.train()(torch.randn(1, 3, 16), positions=positions)
        attn.eval()(torch.randn(1, 3, 16), positions=positions)
    assert [c.kwargs["dropout"] for c in asked] == [True, False]
