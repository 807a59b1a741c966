"""The torch release this process runs, as (major, minor), for the few places whose behaviour depends on it
(FlexAttention from 2.6 and its head sizes before 2.7; gloo's teardown before 2.8). pyproject admits torch >= 2.5."""

from __future__ import annotations

import torch

TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
