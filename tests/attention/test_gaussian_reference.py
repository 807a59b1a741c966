"""Neighbor, Local_Hard and Local_Soft inside the whole Attention against the papers' formulas (spec B.0, B.2-B.4).

``test_baselines.py`` checks ``part.score`` on hand-made cases; here the full module (projections, bias on
the last H_loc heads, masks, softmax, values, W_O) is compared with a reference written per sentence,
query and head, in values and in the gradients of the input, the memory and every parameter. The
Gaussian is written in the papers' sigma form, G_ij = -(j - P_i)^2 / (2 sigma_i^2) with sigma_i = D_i / 2
(Yang et al. 2018 Sec. 3; Luong et al. 2015 Eq. 10; Sperber et al. 2018 with sigma_h = s_h^2), and:

    L(i)        number of keys query i sees under padding and causality (the source length in cross-attention)
    p = sigmoid(U tanh(W q_i + c) + u)          q_i = x_i W_Q + b_Q, the full-width query (spec B.0)
    Neighbor    P = i,            D = L(i) p + 0.1        (csan)   or  sigma = s_h^2  (sperber)
    Local_Hard  P = (L(i) - 1) p, D = window              truncate: only |j - P| <= D; luong_exact: the
                                                          Gaussian scales the softmax, no renormalisation
    Local_Soft  P = (L(i) - 1) p, D = L(i) p' + 0.1       (query: p, p' from one predictor), or from the
                                                          mean visible key (layer), or fixed

The cross-attention rule is tested here too: a window centred on the query's own position (Neighbor) is
refused; a centre predicted from the query over the source length (Local_Hard, Local_Soft) is allowed.
"""

import math

import pytest
import torch

from sanlab.attention import Attention, Positions
from sanlab.attention.build import build_attention
from sanlab.attention.config import AttentionConfig
from sanlab.registry import BuildContext
from tests_helpers import perturb

HEADS, HEAD_DIM = 4, 3
DIM = HEADS * HEAD_DIM
LENGTHS = (7, 5, 2)          # real lengths of the (target / self-attention) batch rows, padded to 7
SOURCE_LENGTHS = (6, 9, 3)   # real lengths of the encoder memory rows, padded to 9


def _context(side: str) -> BuildContext:
    return BuildContext(dim=DIM, heads=HEADS, layer_index=0, num_layers=1, side=side, max_len=16)


def _build(part: dict, side: str) -> Attention:
    torch.manual_seed(0)
    attn = build_attention(AttentionConfig(heads=HEADS, parts=[{**part, "layers": None}]), _context(side))
    return perturb(attn.double())


def _predict(net, x: torch.Tensor) -> torch.Tensor:
    """sigmoid(U tanh(W x + c) + u) for one vector x -> [outputs]."""
    return torch.sigmoid(net.out.weight @ torch.tanh(net.hidden.weight @ x + net.hidden.bias) + net.out.bias)


def _centre_and_sigma(part: dict, module, *, i: int, length: int, query: torch.Tensor,
                      mean_key: torch.Tensor) -> tuple[list, list]:
    """P and sigma of each local head for query i (position i) seeing ``length`` keys: the table above."""
    kind, local = part["type"], module.local_heads
    if kind == "neighbor" and part.get("neighbor_mode") == "sperber":
        return [i] * local, [s ** 2 for s in module.sigma_param]
    p = _predict(module.predict, query)
    if kind == "neighbor":
        return [i] * local, [(length * p[h] + 0.1) / 2 for h in range(local)]
    centres = [(length - 1) * p[h] for h in range(local)]
    if kind == "local_hard":
        return centres, [part.get("window", 10.0) / 2] * local
    window = part.get("window", "query")
    if window == "query":
        return centres, [(length * p[local + h] + 0.1) / 2 for h in range(local)]
    if window == "layer":
        width = _predict(module.predict_width, mean_key)
        return centres, [(length * width[h] + 0.1) / 2 for h in range(local)]
    return centres, [part["fixed_window"] / 2] * local


def reference(attn: Attention, part: dict, x: torch.Tensor, lengths: tuple[int, ...], *, causal: bool,
              memory: torch.Tensor | None = None, memory_lengths: tuple[int, ...] | None = None) -> torch.Tensor:
    """The module's output by the formulas, one sentence, query and head at a time: x [b, i, dim] -> [b, i, dim]."""
    module, (b_size, length, _) = attn.parts[0], x.shape
    kv, kv_lengths = (x, lengths) if memory is None else (memory, memory_lengths)
    q_full, k_full, v_full = attn.q_proj(x), attn.k_proj(kv), attn.v_proj(kv)  # [b, i|j, h*d]
    split = lambda t: t.view(t.shape[0], t.shape[1], HEADS, HEAD_DIM)  # noqa: E731  [b, i|j, h, d]
    q, k, v = split(q_full), split(k_full), split(v_full)
    first_local = HEADS - module.local_heads  # the bias goes on the last H_loc heads
    rows = []
    for b in range(b_size):
        for i in range(length):
            if i >= lengths[b]:  # padded query: zero before W_O
                rows.append(x.new_zeros(DIM))
                continue
            keys = torch.arange(i + 1 if causal else kv_lengths[b])  # the keys query i sees
            n_keys = len(keys)
            centres, sigmas = _centre_and_sigma(part, module, i=i, length=n_keys, query=q_full[b, i],
                                                mean_key=k_full[b, keys].mean(0))
            heads_out = []
            for h in range(HEADS):
                energies = k[b, keys, h] @ q[b, i, h] / math.sqrt(HEAD_DIM)  # [keys]
                seen, gauss = keys, None
                if h >= first_local:
                    centre, sigma = centres[h - first_local], sigmas[h - first_local]
                    gauss = -(keys - centre) ** 2 / (2 * sigma ** 2)  # G_ij
                    if part.get("truncate"):  # Luong's window |j - P| <= D
                        inside = (keys - centre).abs() <= part["window"]
                        seen, energies, gauss = keys[inside], energies[inside], gauss[inside]
                if gauss is None:
                    alpha = torch.softmax(energies, 0)
                elif part.get("luong_exact"):
                    alpha = torch.softmax(energies, 0) * torch.exp(gauss)
                else:
                    alpha = torch.softmax(energies + gauss, 0)
                heads_out.append(alpha @ v[b, seen, h] if len(seen) else x.new_zeros(HEAD_DIM))
            rows.append(torch.cat(heads_out))  # [h*d]
    return attn.out_proj(torch.stack(rows).view(b_size, length, DIM))


def _padded(lengths: tuple[int, ...], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(len(lengths), max(lengths), DIM, generator=generator, dtype=torch.float64)
    return x, torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]  # [b, t, dim], [b, t]


def _assert_same_values_and_gradients(attn: Attention, expected_fn, actual_fn, inputs: list[torch.Tensor],
                                      probe: torch.Tensor) -> torch.Tensor:
    """Runs both functions of ``inputs`` and compares outputs and gradients wrt inputs and parameters."""
    names, params = zip(*attn.named_parameters())
    results = []
    for fn in (expected_fn, actual_fn):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        out = fn(*leaves)
        results.append((out, torch.autograd.grad((out * probe).sum(), (*leaves, *params))))
    (expected, expected_grads), (actual, actual_grads) = results
    torch.testing.assert_close(actual, expected)
    for name, got, want in zip(["input"] * len(inputs) + list(names), actual_grads, expected_grads):
        torch.testing.assert_close(got, want, msg=lambda msg: f"gradient of {name}: {msg}")
    return actual


PARTS = {
    "neighbor-csan-half": {"type": "neighbor"},
    "neighbor-csan-1": {"type": "neighbor", "local_heads": 1},
    "neighbor-sperber-3": {"type": "neighbor", "neighbor_mode": "sperber", "sigma_init": 1.5, "local_heads": 3},
    "local_hard": {"type": "local_hard"},
    "local_hard-truncate": {"type": "local_hard", "window": 2.0, "truncate": True, "local_heads": 3},
    "local_hard-luong": {"type": "local_hard", "window": 2.0, "luong_exact": True},
    "local_hard-truncate-luong": {"type": "local_hard", "window": 2.0, "truncate": True, "luong_exact": True},
    "local_soft-query-all": {"type": "local_soft"},
    "local_soft-layer-half": {"type": "local_soft", "window": "layer", "local_heads": "half"},
    "local_soft-fixed-1": {"type": "local_soft", "window": "fixed", "fixed_window": 3.0, "local_heads": 1},
}


def _vanilla_twin(attn: Attention) -> Attention:
    plain = Attention(dim=DIM, heads=HEADS).double()
    plain.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("parts.")})
    return plain


@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("name", PARTS)
def test_self_attention_equals_the_formula_in_values_and_gradients(name, side):
    part, causal = PARTS[name], side == "decoder"
    attn = _build(part, side)
    g = torch.Generator().manual_seed(len(name))
    x, valid = _padded(LENGTHS, g)
    probe = torch.randn(x.shape, generator=g, dtype=torch.float64)
    positions = Positions.self_attention(valid, length=x.shape[1], causal=causal)
    out = _assert_same_values_and_gradients(
        attn, lambda xi: reference(attn, part, xi, LENGTHS, causal=causal),
        lambda xi: attn(xi, positions=positions).output, [x], probe)
    # the locality term is not negligible here, so the comparison above did check it
    plain = _vanilla_twin(attn)(x, positions=positions).output
    assert (out - plain)[valid].abs().max() > 1e-3


CROSS_PARTS = [name for name in PARTS if not name.startswith("neighbor")]


@pytest.mark.parametrize("name", CROSS_PARTS)
def test_cross_attention_equals_the_formula_over_source_positions(name):
    """Luong's local-p (and Local_Soft's predicted centre) in its original setting: decoder query i, the
    centre predicted from it and scaled by the source length L = S_b, keys at source positions."""
    part = PARTS[name]
    attn = _build(part, "cross")
    g = torch.Generator().manual_seed(len(name))
    x, valid = _padded(LENGTHS, g)
    memory, memory_valid = _padded(SOURCE_LENGTHS, g)
    probe = torch.randn(x.shape, generator=g, dtype=torch.float64)
    query = Positions.self_attention(valid, length=x.shape[1], causal=True)
    positions = Positions.cross_attention(query, memory_valid, memory_length=memory.shape[1])
    out = _assert_same_values_and_gradients(
        attn, lambda xi, mi: reference(attn, part, xi, LENGTHS, causal=False, memory=mi,
                                       memory_lengths=SOURCE_LENGTHS),
        lambda xi, mi: attn(xi, positions=positions, memory=mi).output, [x, memory], probe)
    plain = _vanilla_twin(attn)(x, positions=positions, memory=memory).output
    assert torch.isfinite(out).all() and (out - plain)[valid].abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["local_hard", "local_soft"])
def test_cross_attention_centre_is_scaled_by_the_source_length(kind):
    """sigmoid fixed at 1/2 and q = k = 0: every decoder query's weights are the Gaussian around (S_b - 1) / 2
    over the S_b real source keys, whatever its own position and the target length; padded keys get 0."""
    attn = _build({"type": kind, "local_heads": "all", **({"window": "fixed", "fixed_window": 2.0}
                                                          if kind == "local_soft" else {"window": 2.0})}, "cross")
    with torch.no_grad():
        attn.q_proj.weight.zero_(), attn.q_proj.bias.zero_(), attn.k_proj.weight.zero_(), attn.k_proj.bias.zero_()
        attn.parts[0].predict.out.weight.zero_(), attn.parts[0].predict.out.bias.zero_()  # sigmoid(0) = 1/2
    x = torch.randn(3, 4, DIM, dtype=torch.float64)
    memory, memory_valid = _padded(SOURCE_LENGTHS, torch.Generator().manual_seed(0))
    query = Positions.self_attention(None, length=4, causal=True)
    positions = Positions.cross_attention(query, memory_valid, memory_length=memory.shape[1])
    weights = attn(x, positions=positions, memory=memory, need_trace=True).trace["weights"]  # [b, h, i, j]
    for b, source_length in enumerate(SOURCE_LENGTHS):
        keys = torch.arange(source_length, dtype=torch.float64)
        gauss = torch.exp(-(keys - (source_length - 1) / 2) ** 2 / (2 * 1.0 ** 2))  # sigma = D / 2 = 1
        expected = torch.zeros(memory.shape[1], dtype=torch.float64)
        expected[:source_length] = gauss / gauss.sum()
        torch.testing.assert_close(weights[b], expected.expand(HEADS, 4, -1))


@pytest.mark.parametrize("part", [{"type": "neighbor"}, {"type": "neighbor", "neighbor_mode": "sperber"}],
                         ids=["csan", "sperber"])
def test_neighbor_refuses_cross_attention(part):
    """Its centre is the query's own position, which says nothing about source positions."""
    with pytest.raises(ValueError, match=r"Neighbor .*centred on the query's position.*not defined for "
                                         r"cross-attention \(cross layer 0\)"):
        _build(part, "cross")


TINY_WIDTHS = {  # widths whose square leaves fp32 (0/0 at the centre, or every key's bias -inf)
    "neighbor-sperber": ({"type": "neighbor", "neighbor_mode": "sperber", "local_heads": "all"}, "sigma_init", 1e-20),
    "neighbor-sperber-linear": ({"type": "neighbor", "neighbor_mode": "sperber", "square_sigma": False,
                                 "local_heads": "all"}, "sigma_init", 1e-40),
    "local_hard": ({"type": "local_hard", "local_heads": "all"}, "window", 1e-30),
    "local_soft-fixed": ({"type": "local_soft", "window": "fixed"}, "fixed_window", 1e-30),
}


@pytest.mark.parametrize("name", TINY_WIDTHS)
def test_a_vanishing_width_attends_to_the_nearest_key_without_nan(name):
    """A width whose square underflows in fp32 (a learned s going to 0, or a configured D of 1e-30) gives what a
    small width gives -- all weight on the key nearest the centre -- with finite gradients, not NaN scores."""
    part, key, tiny = TINY_WIDTHS[name]
    g = torch.Generator().manual_seed(3)
    x, valid = _padded(LENGTHS, g)
    x = x.float()
    positions = Positions.self_attention(valid, length=x.shape[1], causal=False)
    outputs = []
    for width in (tiny, 1e-3):
        torch.manual_seed(0)
        attn = build_attention(AttentionConfig(heads=HEADS, parts=[{**part, key: width, "layers": None}]),
                               _context("encoder"))
        leaf = x.clone().requires_grad_(True)
        out = attn(leaf, positions=positions).output
        out[valid].sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(leaf.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)
        outputs.append(out.detach())
    torch.testing.assert_close(outputs[0][valid], outputs[1][valid])
