"""Which attention parts have which decoder-side forms. Pinned here, so that a regression refusing a side fails a
test instead of skipping it, and tests that build every part on every side skip exactly the refused forms."""

import pytest

from sanlab.errors import ConfigError

# no causal form: refused in decoder self-attention (built causal_safe=False, refused by build_attention)
DECODER_UNSAFE = {"bi_direct"}
# a cross-attention form (rel_pos has one too, with cross: true)
CROSS_CAPABLE = {"abs_position", "local_hard", "local_soft", "rel_position", "temperature"}
# mixers without a causal form: refused on the decoder side (tests/layers/test_mixer_contracts.py checks it)
ENCODER_ONLY_MIXERS = {"block"}


def refused(decoder: dict) -> bool:
    """Whether a decoder stack with ``decoder`` (``StackConfig`` keys) holds a part on a side it has no form for."""
    for side in ("attention", "cross_attention"):
        for part in (decoder.get(side) or {}).get("parts") or []:
            if side == "attention" and part["type"] in DECODER_UNSAFE:
                return True
            if side == "cross_attention" and not (part["type"] in CROSS_CAPABLE or part.get("cross")):
                return True
    return False


def build_or_skip_refused(build, decoder: dict):
    """``build(decoder)``; for a refused form, check that building it fails with a clear error, then skip."""
    if not refused(decoder):
        return build(decoder)
    with pytest.raises((ValueError, ConfigError)) as err:
        build(decoder)
    pytest.skip(f"refused, as it must be: {err.value}")
