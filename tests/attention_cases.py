"""The cases and helpers the attention-part contracts share (tests/attention/test_contracts.py and
test_contract_edges.py; tests/ is on sys.path via conftest): every registered part x each of its config's
``examples()``, built in a tiny float64 ``Attention`` (width 16, 4 heads) over a padded batch of odd lengths."""

import pytest
import torch

from sanlab.attention import Positions
from sanlab.attention.registry import PARTS

DIM, HEADS = 16, 4
LENGTHS = (9, 6, 3)        # real lengths of the batch rows; the padded length is 9 (odd)
MAX_LEN = 16               # >= every test sequence (9 + 4 of padding appended), for parts sized by max_len

CASES = [pytest.param(cfg, id=f"{name}-{n}")
         for name in PARTS.names() for n, cfg in enumerate(PARTS.entry(name).config.examples())]
SIDES = ("encoder", "decoder")


def inputs(length: int = max(LENGTHS), seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(LENGTHS), length, DIM, generator=g, dtype=torch.float64)  # [b, i, dim]
    valid = torch.arange(length)[None, :] < torch.tensor(LENGTHS)[:, None]  # [b, i]
    return x, valid


def positions(valid: torch.Tensor, side: str) -> Positions:
    return Positions.self_attention(valid, length=valid.shape[1], causal=side == "decoder")


def assert_plans_agree(results: list, side: str) -> None:
    """results: (plan, output, input gradient, parameter gradients) per plan, dense first."""
    _, ref_out, ref_dx, ref_dp = results[0]
    for plan, out, dx, dp in results[1:]:
        torch.testing.assert_close(out, ref_out, msg=lambda m: f"{side}, plan {plan} values: {m}")
        torch.testing.assert_close(dx, ref_dx, msg=lambda m: f"{side}, plan {plan} input gradient: {m}")
        assert len(dp) == len(ref_dp)
        for g, ref in zip(dp, ref_dp):
            if ref is None:
                assert g is None or torch.all(g == 0)
            else:
                torch.testing.assert_close(g, ref, msg=lambda m: f"{side}, plan {plan} parameter gradient: {m}")
