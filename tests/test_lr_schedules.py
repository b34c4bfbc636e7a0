"""LR schedules: warmup, then constant, linear or cosine decay; the HF engine and its config use them."""

import math

import pytest
import torch

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.config import load_run_config
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.train.lr_schedules import lr_factor


def test_factors_by_hand():
    # warmup 2, decay over steps 2..6 (decay_steps=6): progress p = (s - 2) / 4
    f = {name: [lr_factor(s, warmup_steps=2, schedule=name, decay_steps=6) for s in range(8)]
         for name in ("constant", "linear", "cosine")}
    assert f["constant"] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert f["linear"] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    # cos(pi/4) = 0.7071: (1 + 0.7071) / 2 = 0.8536; cos(3pi/4) = -0.7071: 0.1464
    assert f["cosine"] == pytest.approx([0.5, 1.0, 1.0, 0.853553, 0.5, 0.146447, 0.0, 0.0], abs=1e-6)
    assert lr_factor(3) == 1.0 and lr_factor(0, warmup_steps=4) == 0.25


def test_the_engine_steps_its_lr_along_the_schedule():
    engine = HFTrainEngine(torch.nn.Linear(2, 1), HFTrainConfig(lr=0.1, lr_schedule="cosine", lr_decay_steps=4), kind="actor")
    lrs = []
    for _ in range(5):
        lrs.append(engine.scheduler.get_last_lr()[0])
        engine.optimizer.step()
        engine.scheduler.step()
    # p = s / 4: 0.1 * (1 + cos(pi p)) / 2
    assert lrs == pytest.approx([0.1, 0.1 * (1 + math.cos(math.pi / 4)) / 2, 0.05,
                                 0.1 * (1 - math.cos(math.pi / 4)) / 2, 0.0], abs=1e-9)
    state = engine.scheduler.state_dict()
    again = HFTrainEngine(torch.nn.Linear(2, 1), HFTrainConfig(lr=0.1, lr_schedule="cosine", lr_decay_steps=4), kind="actor")
    again.scheduler.load_state_dict(state)
    assert again.scheduler.last_epoch == 5


def test_config_names_the_missing_decay_steps():
    assert load_run_config(None, ["roles.actor.lr_schedule=linear", "roles.actor.lr_decay_steps=100"]).actor.lr_schedule == "linear"
    with pytest.raises(ValueError, match=r"actor: .*lr_decay_steps: linear decay needs lr_decay_steps"):
        load_run_config(None, ["roles.actor.lr_schedule=linear", "roles.actor.warmup_steps=5", "roles.actor.lr_decay_steps=5"])
    with pytest.raises(ValueError, match=r"actor.lr_schedule: Input should be 'constant', 'linear' or 'cosine'"):
        load_run_config(None, ["roles.actor.lr_schedule=step"])
