"""roles.<name>.forward_micro_batch_size: the rows of each no-grad forward pass (old and reference logprobs,
values, scores), apart from the backward passes' roles.<name>.micro_batch_size."""
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.roles import Ref
from flowrl.runtime.factory import make_factory
from fakes import ROLE_CLASSES, FakeTrainEngine, ParityTask

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}


class RecordingEngine(FakeTrainEngine):
    def __init__(self):
        super().__init__()
        self.forward_rows: list[int] = []

    def forward(self, batch, *, micro_batch_size=8, **kwargs):
        self.forward_rows.append(micro_batch_size)
        return super().forward(batch, micro_batch_size=micro_batch_size, **kwargs)


def settings(*sets: str, world_size: int = 1):
    cfg = load_run_config(None, list(sets))
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    factory = make_factory(cfg, plan, ParityTask(), Path("unused"))
    pool = fl.Pool(name="p", roles=["actor", "ref"], world_size=world_size)
    return factory.for_pool(pool).context.role_settings["ref"]  # the actor's sizes: its section sets none


def test_forward_passes_take_their_own_micro_batch():
    s = settings("roles.actor.micro_batch_size=4", "roles.actor.forward_micro_batch_size=16")
    assert (s.micro_batch_size, s.forward_rows) == (4, 16)
    engine = RecordingEngine()
    ids = torch.ones(2, 3, dtype=torch.long)
    batch = TensorDict(prompt_ids=ids, prompt_mask=ids, response_ids=ids, response_mask=ids, batch_size=[2])
    Ref(engine, s).logprobs(batch)
    assert engine.forward_rows == [16]


def test_forward_micro_batch_defaults_to_micro_and_splits_over_ranks():
    assert settings("roles.actor.micro_batch_size=8").forward_rows == 8
    assert settings("roles.actor.micro_batch_size=8", "roles.actor.forward_micro_batch_size=32", world_size=2).forward_rows == 16
    with pytest.raises(ValueError, match="roles.actor.forward_micro_batch_size=3 must be divisible"):
        settings("roles.actor.micro_batch_size=8", "roles.actor.forward_micro_batch_size=3", world_size=2)
