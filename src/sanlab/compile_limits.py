"""torch.compile's recompile limit, shared by whole-model compilation (``training/compile.py``) and the
FlexAttention kernel (``attention/flex.py``): torch's default (8 graphs per compiled function) is soon spent
by varying batch shapes or a model's several windows, and past it torch runs the function uncompiled."""

from __future__ import annotations

RECOMPILE_LIMIT = 64
# the names of torch's settings changed in 2.7 (cache_size_limit -> recompile_limit); the first one found
LIMIT_SETTINGS = ("recompile_limit", "cache_size_limit")


def raised_limit() -> dict[str, int]:
    """``{setting: value}`` raising this torch's recompile limit to ``RECOMPILE_LIMIT`` (never lowering it)."""
    import torch._dynamo

    for name in LIMIT_SETTINGS:
        if hasattr(torch._dynamo.config, name):
            return {name: max(getattr(torch._dynamo.config, name), RECOMPILE_LIMIT)}
    return {}


# torch's switch that makes hitting the limit an error, by this torch's name for it: training turns it on in its
# process while it trains (``training/compile.configure_dynamo``: never a silent fall-back to eager for the model;
# ``dynamo_settings_restored`` gives it back after)
FAIL_SETTINGS = ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit")


def dynamo_settings() -> dict:
    """A copy of this torch's dynamo settings, by name (which names exist differs between releases)."""
    import torch._dynamo

    return torch._dynamo.config.get_config_copy()


def uncompiled_past_limit() -> dict[str, bool]:
    """``{setting: False}`` for this torch's ``FAIL_SETTINGS``: a function compiled with it runs uncompiled past the
    limit, whatever a compiled training in the same process set (the FlexAttention kernel in validation)."""
    known = dynamo_settings()
    return {name: False for name in FAIL_SETTINGS if name in known}
