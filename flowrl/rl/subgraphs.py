"""Subgraphs that several algorithms compose: plain functions over a traced batch, role handles and the
algorithm's config.

Algorithms call these the way optax presets call chain(): GRPO, GSPO, CISPO,
DPPO and RLOO are one `critic_free_step` each, differing only in the
advantage stage and their config (which builds the loss, `cfg.loss()`); PPO
and PF-PPO are one `ppo_step` each.
"""

from __future__ import annotations

from typing import Any, Callable

from flowrl.engines.protocols import LossFn
from flowrl.graph.stage import Stage
from flowrl.rl import stages


def critic_free_step(batch: Any, actor: Any, rollout: Any, ref: Any, reward: Any, cfg: Any, *,
                     advantage: Stage | Callable[[Any], Any], loss: LossFn | None = None) -> Any:
    """Sample cfg.group_size responses per prompt, score them, compute advantages without a critic, update the
    actor with `loss` (default: `cfg.loss()`).

    The reference model runs only when the loss reads its logprobs (a KL term).
    """
    loss = cfg.loss() if loss is None else loss
    batch = rollout.generate(batch, n=cfg.group_size)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if "ref_logprobs" in loss.reads:
        batch = ref.logprobs(batch)
    batch = advantage(batch)
    return actor.update(batch, loss=loss)


def ppo_step(batch: Any, actor: Any, rollout: Any, ref: Any, critic: Any, reward: Any, cfg: Any, *,
             kl_ctrl: Any = None, resample: Stage | None = None, loss: LossFn | None = None) -> Any:
    """PPO's step: one response per prompt, scored; the critic's values; token rewards with the config's k1 KL
    penalty (`cfg.token_rewards`, adaptive through `kl_ctrl` when the config says so); GAE; `resample` (a
    stage that redraws rows, PF-PPO's); the critic's update with `cfg.value_loss()`, then the actor's with
    `loss` (default: `cfg.loss()`). The reference model runs only when cfg.kl_coef > 0.
    """
    batch = rollout.generate(batch)
    batch = reward.score(batch)
    batch = actor.logprobs(batch)
    if cfg.kl_coef > 0:
        batch = ref.logprobs(batch)
    batch = critic.values(batch)
    batch = cfg.token_rewards(batch, kl_ctrl)
    batch = stages.gae_advantage(batch, gamma=cfg.gamma, lam=cfg.lam)
    if resample is not None:
        batch = resample(batch)
    batch = critic.update(batch, loss=cfg.value_loss())
    return actor.update(batch, loss=cfg.loss() if loss is None else loss)
