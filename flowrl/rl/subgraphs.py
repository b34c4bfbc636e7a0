"""Subgraphs that several algorithms compose: plain functions over a traced batch and role handles.

Algorithms call these the way optax presets call chain(): GRPO, GSPO, CISPO,
DPPO and RLOO are one `critic_free_step` each, differing only in the
advantage stage and the loss they pass.
"""

from __future__ import annotations

from typing import Any

from flowrl.engines.protocols import LossFn
from flowrl.graph.stage import Stage


def critic_free_step(batch: Any, actor: Any, rollout: Any, ref: Any, reward: Any, *, n: int,
                     advantage: Stage, loss: LossFn) -> Any:
    """Sample n responses per prompt, score them, compute advantages without a critic, update the actor.

    The reference model runs only when the loss reads its logprobs (a KL term).
    """
    batch = rollout.generate(batch, n=n)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if "ref_logprobs" in loss.reads:
        batch = ref.logprobs(batch)
    batch = advantage(batch)
    return actor.update(batch, loss=loss)
