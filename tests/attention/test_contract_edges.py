"""Contracts at the edges of shape and configuration, for every registered attention part (beside
``test_contracts.py``, whose cases and helpers these share; a file of their own so that pytest-xdist's
``--dist loadfile`` runs them beside it, not after it): one-token sentences alone and beside full ones, one head,
windows of one position and wider than any sentence, Gaussian centres and widths saturated at the edges."""

import pytest
import torch

from sanlab.attention import Attention, Positions, banded
from sanlab.attention.registry import PARTS
from sanlab.registry import BuildContext
from decoder_forms import CROSS_CAPABLE, DECODER_UNSAFE
from attention_cases import (CASES, DIM, HEADS, MAX_LEN, SIDES, assert_plans_agree as _assert_plans_agree,
                             inputs as _inputs, positions as _positions)
from tests_helpers import fast_plans, perturb


# ----------------------------------------------------------------------------- edges of shape and configuration
def _edge_cases() -> list:
    """Configurations at the edges of their ranges, beside every example: windows of one position and windows
    wider than any test sentence, a Luong window of 1 and of 100 (truncated), a fixed Gaussian width of 1,
    one routing iteration, a clipping distance past every offset."""
    window, csan2d = PARTS.entry("window").config, PARTS.entry("csan2d").config
    local_hard, local_soft = PARTS.entry("local_hard").config, PARTS.entry("local_soft").config
    forms = {
        "window-size1": window(size=1, layers=None), "window-size31": window(size=31, layers=None),
        "window-size31-full": window(size=31, causal_window="full", layers=None),
        "csan2d-size1": csan2d(size=1, layers=None), "csan2d-size31": csan2d(size=31, layers=None),
        "local_hard-window1": local_hard(window=1.0, truncate=True, layers=None),
        "local_hard-window100": local_hard(window=100.0, truncate=True, luong_exact=True, layers=None),
        "local_soft-fixed1": local_soft(window="fixed", fixed_window=1.0, layers=None),
        "capsule-1-iteration": PARTS.entry("capsule").config(routing_iters=1),
        "rel_pos-k100": PARTS.entry("rel_pos").config(max_distance=100, cross=True),
    }
    return [pytest.param(cfg, id=name) for name, cfg in forms.items()]


EDGE_LENGTHS = (1, 9)  # a one-token sentence batched with a full one (all but one position of row 0 is padding)


# Gaussian localness: the parts whose centre (or width) is a sigmoid of the query, scaled by the sentence length
GAUSSIAN = {"local_hard", "local_soft", "neighbor"}


def _later_gaussian_example(case) -> bool:
    """A Gaussian part's example after its first: its flex plan traces mods of its own on the CPU (~0.3-2 s of
    dynamo each), so its edge cases run in the slow suite only; the first example of each part stays in the fast
    one, and test_contracts.py checks every example's plans against dense there."""
    name, _, n = case.id.rpartition("-")
    return name in GAUSSIAN and n != "0"


# Later examples whose fast edge case (decoder, one head) reaches no line of sanlab that an earlier example of the
# same part does not (traced line by line on 2026-12-02): slow only, as the later Gaussian examples.
SAME_LINES_AS_AN_EARLIER_EXAMPLE = {"bi_direct-1", "capsule-1", "capsule-3", "csan2d-1", "csan2d-2", "rel_pos-1",
                                    "rel_pos-2", "window-1"}


def _edge_params() -> list:
    """Every form x side x head count; one of them (one head on the decoder side: the causal cache and the head
    checks) runs in the fast suite, the rest (~1-4 s each, 180 in all) are slow, and so do the later examples of
    the Gaussian parts (``_later_gaussian_example``) and those in ``SAME_LINES_AS_AN_EARLIER_EXAMPLE``."""
    params = []
    for case in CASES + _edge_cases():
        for side in (*SIDES, "cross"):
            for heads in (1, HEADS):
                fast = (side == "decoder" and heads == 1 and not _later_gaussian_example(case)
                        and case.id not in SAME_LINES_AS_AN_EARLIER_EXAMPLE)
                params.append(pytest.param(case.values[0], side, heads, id=f"{case.id}-{side}-{heads}",
                                           marks=() if fast else pytest.mark.slow))
    return params


@pytest.mark.parametrize(("cfg", "side", "heads"), _edge_params())
def test_one_token_sentences_one_head_and_edge_configurations(cfg, side, heads, monkeypatch):
    """A batch of one sentence of one token, and a one-token sentence beside a full one: finite values and
    gradients; every row equals that sentence alone, unpadded, under every plan the part allows; on the decoder
    side, decoding one token at a time from the first equals the causal forward. A form the side or the head
    count cannot take is refused with a clear error (2D-CSAN's head area above one head, Bi-Direct's pairs of heads)."""
    if side == "decoder" and cfg.type in DECODER_UNSAFE:
        pytest.skip("no decoder form (the causal_safe contract checks the refusal)")
    if side == "cross" and not (cfg.type in CROSS_CAPABLE or getattr(cfg, "cross", False)):
        pytest.skip("no cross-attention form (the cached cross-attention contract checks the refusal)")
    monkeypatch.setattr(banded, "BLOCK", 4)
    layer = cfg.layers[0] if cfg.layers else 0
    ctx = BuildContext(dim=DIM, heads=heads, layer_index=layer, num_layers=layer + 2, side=side, max_len=MAX_LEN)
    if cfg.type == "csan2d" and cfg.heads_area > heads:
        with pytest.raises(ValueError, match=f"heads_area N = {cfg.heads_area} exceeds the {heads} heads"):
            PARTS.build(cfg, ctx)
        return
    if cfg.type == "bi_direct" and heads < 2:  # (not "pairs must be between 1 and 0")
        with pytest.raises(ValueError, match=r"^bi_direct needs at least 2 heads \(a forward and a backward one\); "
                                             r"the attention of layer 0 \(encoder\) has 1$"):
            PARTS.build(cfg, ctx)
        return

    def build(plan: str) -> Attention:
        torch.manual_seed(0)
        return perturb(Attention(dim=DIM, heads=heads, parts=[PARTS.build(cfg, ctx)], plan=plan).double().eval())

    def run(attn: Attention, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        positions = Positions.self_attention(valid, length=valid.shape[1], causal=side != "encoder")
        if side != "cross":
            return attn(x, positions=positions).output
        # the memory: as long as each query sentence (one token for the one-token one), from the same rows
        memory = x.detach().flip(-1)
        return attn(x, positions=Positions.cross_attention(positions, valid, memory_length=valid.shape[1]),
                    memory=memory).output

    dense = build("dense")
    g = torch.Generator().manual_seed(3)
    for lengths in ((1,), EDGE_LENGTHS):
        x = torch.randn(len(lengths), max(lengths), DIM, generator=g, dtype=torch.float64)
        valid = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
        results = []
        for plan in ["dense", *fast_plans(dense)]:
            attn = build(plan)
            attn.load_state_dict(dense.state_dict())
            xi = x.clone().requires_grad_(True)
            out = run(attn, xi, valid)
            assert torch.isfinite(out).all(), f"plan {plan}, lengths {lengths}"
            out.pow(2).sum().backward()
            assert torch.isfinite(xi.grad).all(), f"plan {plan}, lengths {lengths}"
            assert [n for n, p in attn.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()
                    ] == [], f"plan {plan}, lengths {lengths}"
            for row, n in enumerate(lengths):
                with torch.no_grad():
                    alone = run(attn, x[row:row + 1, :n], torch.ones(1, n, dtype=torch.bool))
                torch.testing.assert_close(out[row, :n].detach(), alone[0],
                                           msg=lambda m: f"plan {plan}, row {row} of {lengths} against alone: {m}")
            results.append((plan, out.detach(), xi.grad, [p.grad for p in attn.parameters()]))
        _assert_plans_agree(results, side)
    if side == "decoder":  # one token at a time from the very first, with the one-token row padded after it
        x = torch.randn(len(EDGE_LENGTHS), max(EDGE_LENGTHS), DIM, generator=g, dtype=torch.float64)
        valid = torch.arange(max(EDGE_LENGTHS))[None, :] < torch.tensor(EDGE_LENGTHS)[:, None]
        full = dense(x, positions=Positions.self_attention(valid, length=valid.shape[1], causal=True)).output
        cache, outs = None, []
        for t in range(x.shape[1]):
            step = Positions.self_attention(valid[:, :t + 1], length=1, offset=t, causal=True)
            result = dense(x[:, t:t + 1], positions=step, cache=cache, use_cache=True)
            cache = result.cache
            outs.append(result.output)
        torch.testing.assert_close(torch.cat(outs, dim=1), full)


# each Gaussian part's later examples: slow only (their flex plans trace mods of their own, see above)
GAUSSIAN_CASES = [pytest.param(*c.values, id=c.id, marks=pytest.mark.slow if _later_gaussian_example(c) else ())
                  for c in CASES if c.values[0].type in GAUSSIAN]


@pytest.mark.parametrize("edge", [-60.0, 60.0], ids=["first-position", "last-position"])
@pytest.mark.parametrize("side", [*SIDES, "cross"])
@pytest.mark.parametrize("cfg", GAUSSIAN_CASES)
def test_gaussian_centres_and_widths_saturated_at_the_edges(cfg, side, edge):
    """Every predicted sigmoid saturated (centre (L - 1) sigmoid at 0 or at L - 1, widths at 0.1 or L + 0.1):
    finite values and gradients, also for a one-token sentence of the batch, and every plan equal to dense
    (Sperber's neighbour form has a learned width, no predictor: it is checked with its initial one)."""
    if side == "cross" and cfg.type not in CROSS_CAPABLE:
        pytest.skip("no cross-attention form")
    layer = cfg.layers[0] if cfg.layers else 0
    ctx = BuildContext(dim=DIM, heads=HEADS, layer_index=layer, num_layers=layer + 2, side=side, max_len=MAX_LEN)

    def build(plan: str) -> Attention:
        torch.manual_seed(0)
        attn = perturb(Attention(dim=DIM, heads=HEADS, parts=[PARTS.build(cfg, ctx)], plan=plan).double().eval())
        predictors = [m for m in attn.modules() if type(m).__name__ == "Predictor"]
        with torch.no_grad():
            for predictor in predictors:
                predictor.out.weight.zero_()
                predictor.out.bias.fill_(edge)
        return attn

    dense = build("dense")
    sperber = getattr(cfg, "neighbor_mode", "") == "sperber"
    assert sperber or any(type(m).__name__ == "Predictor" for m in dense.modules())
    x, valid = _inputs()
    valid[2, 1:] = False  # a one-token sentence too
    query = _positions(valid, "decoder" if side != "encoder" else "encoder")
    positions = Positions.cross_attention(query, valid, memory_length=valid.shape[1]) if side == "cross" else query
    memory = x.flip(-1) if side == "cross" else None
    results = []
    for plan in ["dense", *fast_plans(dense)]:
        attn = build(plan)
        xi = x.clone().requires_grad_(True)
        out = attn(xi, positions=positions, memory=memory).output
        assert torch.isfinite(out).all(), plan
        out.pow(2).sum().backward()
        assert torch.isfinite(xi.grad).all(), plan
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None), plan
        results.append((plan, out.detach(), xi.grad, [p.grad for p in attn.parameters()]))
    _assert_plans_agree(results, side)
