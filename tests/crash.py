"""Stopping a training run part-way, as a kill would, for resume tests."""

import pytest

from flowrl.runtime.trainer import train


class Crash(Exception):
    """Raised from the step callback: the run ends there with its checkpoints on disk."""


def train_until_crash(cfg, step: int, **kwargs) -> None:
    """Trains `cfg` and stops it right after step `step` (before that step's checkpoint, if one is due)."""

    def crash(done: int, logged: dict) -> None:
        if done == step:
            raise Crash

    with pytest.raises(Crash):
        train(cfg, progress=False, on_step=crash, **kwargs)
