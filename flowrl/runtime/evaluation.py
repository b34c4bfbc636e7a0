"""Greedy evaluation on a fixed prompt set, itself a small graph over the run's roles.

Like verl's validation pass: the rollout decodes greedily with the actor's
current weights and the reward scores it; `eval/reward/mean` is the accuracy
on the arithmetic task. The prompts come from a seed the training stream never
uses, so the set stays the same across a run and its resumes.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict

from flowrl.graph.algorithm import algorithm
from flowrl.graph.role import role_spec
from flowrl.plan.placement import Placement
from flowrl.plan.planner import Plan, compile_plan
from flowrl.runtime.executor import Executor

EVAL_SEED_OFFSET = 1_000_003


@algorithm
def greedy_eval(batch, rollout, reward):
    batch = rollout.sync_weights(batch)
    batch = rollout.generate(batch, greedy=True)
    return reward.score(batch, metric="eval/reward")


def eval_plan(train: Plan, task: Any, role_classes: dict[str, type] | None = None) -> Plan | None:
    """The evaluation graph on the training run's pools, or None when the run places none of its model roles."""
    needed = [r for r in greedy_eval.roles if not role_spec(r, (role_classes or {}).get(r)).on_driver]
    if any(r not in train.pools for r in needed):
        return None
    pools = {train.pools[r].name: train.pools[r] for r in needed}
    placement = Placement(pools=[pool.model_copy(update={"roles": [r for r in needed if train.pools[r] is pool]})
                                 for pool in pools.values()])
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    return compile_plan(greedy_eval, placement, inputs, role_classes, None)


class Evaluator:
    """Scores greedy responses to a fixed prompt batch (this rank's share of the evaluation set).

    `executor` runs `eval_plan(...)` over the training run's roles (`Executor.for_plan`)."""

    def __init__(self, executor: Executor, prompts: TensorDict):
        self.executor = executor
        self.prompts = prompts

    def __call__(self, step: int) -> dict[str, float]:
        _, logged = self.executor.run_step(step, iter([self.prompts.clone()]))
        return {k: v for k, v in logged.items() if k.startswith("eval/")}
