"""Greedy evaluation on a fixed prompt set, itself a small graph over the run's roles.

Like verl's validation pass: the rollout decodes greedily with the actor's
current weights and the reward scores it; `eval/reward/mean` is the accuracy
on the arithmetic task. The prompts come from a seed the training stream never
uses, so the set stays the same across a run and its resumes.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict

import flowrl as fl
from flowrl.executor import Executor
from flowrl.planner import Placement, Plan, Pool, compile_plan
from flowrl.roles import ROLE_CLASSES

EVAL_SEED_OFFSET = 1_000_003


@fl.algorithm
def greedy_eval(batch, rollout, reward):
    batch = rollout.sync_weights(batch)
    batch = rollout.generate(batch, greedy=True)
    return reward.score(batch, metric="eval/reward")


def eval_plan(pool: Pool, task: Any) -> Plan:
    """The evaluation graph on the training run's rollout pool."""
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    placement = Placement(pools=[pool.model_copy(update={"roles": ["rollout"]})])
    return compile_plan(greedy_eval, placement, inputs, ROLE_CLASSES)


class Evaluator:
    """Scores greedy responses to a fixed prompt batch (this rank's share of the evaluation set).

    `executor` runs `eval_plan(...)` over the training run's roles (`Executor.for_plan`)."""

    def __init__(self, executor: Executor, prompts: TensorDict):
        self.executor = executor
        self.prompts = prompts

    def __call__(self, step: int) -> dict[str, float]:
        _, logged = self.executor.run_step(step, iter([self.prompts.clone()]))
        return {k: v for k, v in logged.items() if k.startswith("eval/")}
