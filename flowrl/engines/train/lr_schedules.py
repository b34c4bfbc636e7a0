"""Learning-rate schedules: linear warmup, then constant, linear or cosine decay to zero.

`lr_factor(step, ...)` is the multiplier of the base LR at optimizer step
`step` (from 0), the LambdaLR convention: during warmup (step + 1) / warmup;
after it, with progress p = (step - warmup) / (decay_steps - warmup) clipped to
[0, 1], `constant` keeps 1, `linear` gives 1 - p and `cosine` (1 + cos(pi p)) / 2,
as transformers' get_linear/cosine_schedule_with_warmup do.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, *, warmup_steps: int = 0, schedule: str = "constant", decay_steps: int = 0) -> float:
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, decay_steps - warmup_steps)))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"lr_schedule: unknown {schedule!r}; one of {list(SCHEDULES)}")


def check_schedule(schedule: str, warmup_steps: int, decay_steps: int, prefix: str = "") -> None:
    """ValueError naming the field when a decaying schedule has no decay steps past the warmup."""
    if schedule not in SCHEDULES:
        raise ValueError(f"{prefix}lr_schedule: unknown {schedule!r}; one of {list(SCHEDULES)}")
    if schedule != "constant" and decay_steps <= warmup_steps:
        raise ValueError(f"{prefix}lr_decay_steps: {schedule} decay needs lr_decay_steps (total optimizer steps) "
                         f"above warmup_steps={warmup_steps}, got {decay_steps}")
