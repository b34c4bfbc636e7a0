"""Evaluation on a fixed prompt set, itself a small graph over the run's roles.

Like verl's validation pass: the rollout decodes greedily with the actor's
current weights and the reward scores it; `eval/reward/mean` is the accuracy
on the arithmetic task. A run that plays multi-turn episodes
(`rollout.interact`) is evaluated in greedy episodes, scored by the
environment. The prompts come from a seed the training stream never
uses (or are data.val_files' rows), so the set stays the same across a run and
its resumes. Rows with a `data_source` add `eval/<source>/greedy`; with
eval.samples = k, k sampled responses per prompt add mean@k and pass@k
(flowrl.data.scoring.eval_metrics).
"""

from __future__ import annotations

import warnings
from typing import Any

from tensordict import TensorDict

from flowrl.data.batch import column
from flowrl.data.scoring.eval_metrics import greedy_metrics, sampled_metrics
from flowrl.graph.algorithm import Algorithm, algorithm
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


@algorithm
def greedy_episode_eval(batch, rollout):
    batch = rollout.sync_weights(batch)
    return rollout.interact(batch, greedy=True, metric="eval/reward")


def sampled_eval(k: int, episodes: bool = False) -> Algorithm:
    """k responses (or episodes in roles.rollout.env) per prompt at the rollout's temperature."""
    def sampled_eval(batch, rollout, reward):
        batch = rollout.sync_weights(batch)
        batch = rollout.generate(batch, n=k)
        return reward.score(batch, metric="eval/sampled")

    def sampled_episode_eval(batch, rollout):
        batch = rollout.sync_weights(batch)
        return rollout.interact(batch, n=k, metric="eval/sampled")

    return algorithm(sampled_episode_eval if episodes else sampled_eval)


def plays_episodes(plan: Plan) -> bool:
    """The training graph rolls out multi-turn episodes (rollout.interact): evaluate it the same way."""
    return any(node.method == "interact" for node in plan.nodes)


def eval_plan(train: Plan, task: Any, role_classes: dict[str, type] | None = None,
              graph: Algorithm | None = None) -> Plan | None:
    """The evaluation graph (by default greedy, in episodes when training plays them) on the training run's
    pools, or None when the run places none of its model roles."""
    graph = graph or (greedy_episode_eval if plays_episodes(train) else greedy_eval)
    needed = [r for r in graph.roles if not role_spec(r, (role_classes or {}).get(r)).on_driver]
    if any(r not in train.pools for r in needed):
        return None
    pools = {train.pools[r].name: train.pools[r] for r in needed}
    placement = Placement(pools=[pool.model_copy(update={"roles": [r for r in needed if train.pools[r] is pool]})
                                 for pool in pools.values()])
    inputs = {"prompt_ids", "prompt_mask", "uid", *task.meta_keys}
    return compile_plan(graph, placement, inputs, role_classes, None)


def sample_count(k: int, eval_set: int) -> int:
    """eval.samples, at most the evaluation set's size (one warning line says so): 100000 samples per
    prompt would run for hours without a word."""
    if k > eval_set:
        warnings.warn(f"eval.samples={k} is more than the {eval_set} prompts of the evaluation set; using "
                      f"{eval_set} samples per prompt", stacklevel=2)
        return eval_set
    return k


class Evaluator:
    """Scores greedy responses to a fixed prompt batch (this rank's share of the evaluation set).

    `executor` runs `eval_plan(...)` over the training run's roles (`Executor.for_plan`)."""

    def __init__(self, executor: Executor, prompts: TensorDict, sampled: Executor | None = None, k: int = 0):
        self.executor, self.prompts, self.sampled, self.k = executor, prompts, sampled, k
        self.last_batch: TensorDict | None = None

    @classmethod
    def build(cls, executor: Executor, evaluation: Plan, prompts: TensorDict, k: int, task: Any,
              role_classes: dict[str, type] | None = None) -> "Evaluator":
        """Greedy evaluation, and with k > 0 the k-sample one, over the training executor's roles."""
        graph = sampled_eval(k, plays_episodes(executor.plan)) if k else None
        sampled = eval_plan(executor.plan, task, role_classes, graph) if k else None
        return cls(executor.for_plan(evaluation), prompts, executor.for_plan(sampled) if sampled else None, k)

    def __call__(self, step: int) -> dict[str, float]:
        batch, logged = self.executor.run_step(step, iter([self.prompts.clone()]))
        self.last_batch = batch  # the greedy pass's rows (debug.dump_eval writes them)
        out = {k: v for k, v in logged.items() if k.startswith("eval/")}
        if "data_source" in batch.keys():
            out.update(greedy_metrics(batch["scores"].tolist(), column(batch, "data_source")))
        if self.sampled is not None:
            batch, logged = self.sampled.run_step(step, iter([self.prompts.clone()]))
            out.update({k: v for k, v in logged.items() if k.startswith("eval/")})
            sources = column(batch, "data_source") if "data_source" in batch.keys() else None
            out.update(sampled_metrics(batch["scores"].tolist(), batch["group"].tolist(), sources, self.k))
        return out
