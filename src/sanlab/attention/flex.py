"""FlexAttention plan: masks and score biases of the parts inside one fused kernel (CUDA).

``torch.nn.attention.flex_attention`` (torch >= 2.6 here: see AVAILABLE) takes a ``mask_mod(b, h, q_idx, kv_idx) -> visible``,
from which ``create_block_mask`` builds a block-sparse mask (blocks of 128 x 128 that no key of the window
reaches are skipped: a window of M keys costs O(I * max(M, 128)), not O(I * J)), and a
``score_mod(score, b, h, q_idx, kv_idx) -> score`` applied to each scaled score before the softmax. Neither
the [b, h, i, j] mask nor the score matrix is ever formed.

A part offers itself to this plan with optional methods that return such functions for one call:

    flex_mask_mod(ctx)   the same visibility as its ``mask`` (1D-CSAN's window, Bi_Direct's per-head
                         directions, Local_Hard's truncated window around a centre per (b, h, i))
    flex_score_mod(ctx)  the same change as its ``score`` (the Gaussian biases of Neighbor/Local_Hard/Local_Soft)

``supports`` asks the parts (no type checks): every mask part must offer a mask_mod, every score part a
score_mod, and no part may extend keys or touch the weights or values (2D-CSAN mixes heads: banded; Rel_Pos,
convolved attention and capsule routing read the weights: dense). FlexAttention has no attention dropout,
so ``plans.choose`` never picks it when dropout is active. A row with no visible key is 0, as in ``dense``.

On CUDA the kernel is ``torch.compile(flex_attention)`` and the block mask's builder ``torch.compile(
create_block_mask)``, each compiled once per process (``_compiled``, ``_compiled_block_mask``). Elsewhere
(the CPU tests) it is torch's unfused reference of the same operator, which forms the score matrix and is
slow: ``plans.choose`` takes this plan on the CPU only when a config asks for it (``plan: flex``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from sanlab.attention import masks
from sanlab.attention.parts_base import AttentionContext, StageParts
from sanlab.compile_limits import raised_limit, uncompiled_past_limit
from sanlab.torch_release import TORCH

try:  # without it the plan is not offered (``supports`` is False)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - the project's torch has it
    create_block_mask = flex_attention = None

# From torch 2.6 only, although 2.5 has the module: 2.5's create_block_mask calls the mask_mod on indices
# rounded up to a multiple of 128, past the end of the position tensors our mods index (pytorch#137801),
# and refuses score_mod buffers that require grad (the Gaussian parts' predicted centres and widths).
FIRST_TORCH = (2, 6)
AVAILABLE = flex_attention is not None and TORCH >= FIRST_TORCH
# ``plans.choose`` takes this plan for ``auto`` on CUDA from this many keys on, for parts the banded plan cannot
# run (it was faster than this one at every length measured). Measured on an H200 (fp32, forward + backward,
# B 8, H 8, D 64, 1D window M 11; results/gpu.md): 3.7x slower than dense at I = 512, on par at 2048 (0.94),
# twice as fast at 4096 (0.45) and 8192 (0.25); against SDPA + mask 1.6x slower at 2048, 0.8 at 4096. The
# block mask is built in every call (padding and data-dependent windows change per batch): part of the cost.
MIN_KEYS = 4096


def supports(parts: StageParts) -> bool:
    """True if FlexAttention computes these parts exactly: masks and score biases only, each offered as a mod.
    Asked by ``plans.runnable`` only, so the plan choice stays in one place (``plans.choose``)."""
    if not AVAILABLE or parts.extend or parts.weights or parts.values or not (parts.mask or parts.score):
        return False
    return (all(callable(getattr(p, "flex_mask_mod", None)) for p in parts.mask)
            and all(callable(getattr(p, "flex_score_mod", None)) for p in parts.score))


def supports_head_dim(head_dim: int | None) -> bool:
    """torch before 2.7 runs FlexAttention only for head sizes that are powers of two ("NYI: non power of 2
    embedding dimension"); ``None``: not known here, asked again where the attention is built."""
    return head_dim is None or TORCH >= (2, 7) or (head_dim >= 2 and head_dim & (head_dim - 1) == 0)


def _mask_mod(ctx: AttentionContext, parts: StageParts):
    """AND of padding, causality and the parts' mask_mods; None when nothing is masked."""
    pos = ctx.positions
    mods = [masks.key_padding_mod(pos.key_valid) if pos.key_valid is not None else None,
            masks.causal_mod(pos.q_pos, pos.k_pos) if pos.causal else None,
            *(part.flex_mask_mod(ctx) for part in parts.mask)]
    mods = [m for m in mods if m is not None]
    if not mods:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        visible = mods[0](b, h, q_idx, kv_idx)
        for mod in mods[1:]:
            visible = visible & mod(b, h, q_idx, kv_idx)
        return visible

    return mask_mod


def _score_mod(ctx: AttentionContext, parts: StageParts):
    """The parts' score_mods applied in pipeline order; None when no part changes the scores."""
    mods = [m for m in (part.flex_score_mod(ctx) for part in parts.score) if m is not None]
    if not mods:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        for mod in mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score

    return score_mod


def _with_settings(fn, *, specialize_int: bool):
    """``torch.compile(fn)`` run with the recompile limit raised, its integers specialised or not.

    The kernel specialises them: integers the mods capture (a window's offsets) otherwise turn symbolic once their
    value changes between calls (an encoder's window and a decoder's differ), and inductor's flex lowering fails on
    a symbolic captured integer ("'ShapeAsConstantBuffer' object has no attribute 'dtype'", seen on an H200 with
    torch 2.11; the same failure on the CPU with 2.13 is the regression test). The batch size and lengths the
    block mask carries are such integers too: the kernel compiles once per (query length, key length). A decoder's
    one-query steps, a key more each, compiled one each (up to the limit), so ``plans.choose`` never runs this plan
    for a single query. The block-mask builder does not lower the mods that way and takes its batch size and lengths
    as integers: specialised, every new (batch size, length) compiled a graph of its own (14 for 20 Multi30k-like
    batches); left to torch's automatic dynamic shapes, a static graph and then a symbolic one. Past the limit
    torch runs the function uncompiled (the kernel forming the score matrix, the block mask the [b, h, i, j] mask),
    without an error, also where a compiled training made hitting the limit an error for its model (validation's
    decoding runs its encoder here, one source shape after another). Inside a compiled model the model's
    compilation decides (``training/compile.py``)."""
    compiled = torch.compile(fn)
    settings = {"specialize_int": specialize_int, **raised_limit(), **uncompiled_past_limit()}

    def run(*args, **kwargs):
        if torch.compiler.is_compiling():
            return compiled(*args, **kwargs)
        with torch._dynamo.config.patch(**settings):
            return compiled(*args, **kwargs)

    return run


@functools.cache
def _compiled():
    """The fused kernel: ``flex_attention`` compiled once per process (torch recompiles on new shapes)."""
    return _with_settings(flex_attention, specialize_int=True)


@functools.cache
def _compiled_block_mask():
    """``create_block_mask`` compiled once per process (CUDA): uncompiled it forms the whole [b, h, i, j] mask
    before reducing it to blocks. From torch 2.6 (the first this plan runs on) the ``_compile=True`` flag is
    deprecated (it warns, then calls ``torch.compile(create_block_mask)`` anew) in favour of compiling the
    function, which is done here once; batch size and lengths symbolic once they change (``_with_settings``)."""
    return _with_settings(create_block_mask, specialize_int=False)


def _reference(q: Tensor, k: Tensor, v: Tensor, score_mod, block_mask, scale: float) -> Tensor:
    """torch's unfused reference of ``flex_attention`` (what the function runs uncompiled) with its backward.

    The public function refuses a backward on the CPU; its reference operator (the higher-order op traced by
    dynamo with the eager backend, which lifts the tensors the mods capture so that they get gradients) has one.
    Private torch API, used by the CPU tests of this plan only; checked on torch 2.13. With autograd off (no_grad,
    as decoding runs) the operator runs eagerly: the same computation without a dynamo trace of the mods per call
    (about 0.1 s each on the CPU tests' tiny shapes). Not merely when q, k, v need no gradient: a tensor a mod
    captures (a Gaussian part's predicted centres) may need one, and run eagerly it would get none.
    """
    from torch._dynamo.utils import disable_cache_limit
    from torch._higher_order_ops.flex_attention import flex_attention as operator
    from torch.nn.attention.flex_attention import _apply_kernel_options, _create_empty_block_mask

    def call(*args):
        return operator(*args)

    options = _apply_kernel_options(q, k, v, False, None)
    block_mask = block_mask if block_mask is not None else _create_empty_block_mask(q, k)
    if not torch.is_grad_enabled():
        # no backward (decoding): the operator runs eagerly, without a dynamo trace per call
        return operator(q, k, v, score_mod or _identity, block_mask.as_tuple(), scale, options)[0]
    with disable_cache_limit():  # every call traces its own mods
        run = torch.compile(call, backend="eager", fullgraph=True)
        result = run(q, k, v, score_mod or _identity, block_mask.as_tuple(), scale, options)
    return result[0]  # (out, logsumexp[, max]) depending on the torch version


def _identity(score, b, h, q_idx, kv_idx):
    return score


def attend(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, *, parts: StageParts, scale: float,
           dropout: float, training: bool) -> Tensor:
    """Same contract as ``plans.dense``: q [b, h, i, d], k/v [b, h, j, d] -> [b, h, i, d]."""
    if dropout and training:
        raise ValueError("the flex plan has no attention dropout; plans.choose must not pick it here")
    b, h, i, _ = q.shape
    cuda = q.device.type == "cuda"
    mask_mod, score_mod = _mask_mod(ctx, parts), _score_mod(ctx, parts)
    # one block mask per call: padding and the data-dependent windows (Local_Hard) differ from batch to batch
    build = _compiled_block_mask() if cuda else create_block_mask
    block_mask = None if mask_mod is None else build(mask_mod, b, h, i, k.shape[2], device=q.device)
    if cuda:
        return _compiled()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return _reference(q, k, v, score_mod, block_mask, scale)
