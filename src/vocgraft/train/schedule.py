"""The learning-rate schedule of a LAPT phase: linear warmup, then cosine decay to 0 over the phase's updates.

Warmup is ``min(warmup_steps, 10% of the phase's updates)`` and never 0: a run of fewer than ``10 x warmup_steps``
updates warms up over its first tenth (the papers' 100 updates need a run of 1,000), and even a 5-update run takes
its first update below the peak rate. The ramp gives update ``s`` (0-based) ``(s + 1) / (warmup + 1)`` of the peak,
so no update is spent at rate 0 (transformers' ramp starts at 0) and the peak comes right after warmup.
"""

from __future__ import annotations

import math
from functools import partial

import torch

WARMUP_SHARE = 0.1  # of a phase's updates: the cap on warmup for short runs


def warmup_for(phase_steps: int, warmup_steps: int) -> int:
    """Warmup updates of a phase of ``phase_steps`` updates when ``warmup_steps`` are asked for: at least 1 (0 for
    a phase with no updates: a 1-update two-stage run has no second phase)."""
    if phase_steps <= 0:
        return 0
    return max(1, min(warmup_steps, int(phase_steps * WARMUP_SHARE)))


def lr_factor(step: int, *, warmup: int, total: int) -> float:
    """The share of the peak learning rate that update ``step`` (0-based) of ``total`` takes."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    done = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * done)))


def cosine_with_warmup(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler stepped once per update; a partial (not a lambda) so its state dict saves and loads."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, warmup=warmup, total=total))
