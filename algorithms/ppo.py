"""PPO (Ouyang et al.): a critic, GAE, KL to the reference in the reward (fixed or adaptive weight), dual-clip
policy loss."""

import flowrl as fl
from flowrl.rl.algorithm_configs import PPOConfig
from flowrl.rl.subgraphs import ppo_step

__all__ = ["PPOConfig", "ppo"]


@fl.algorithm(config=PPOConfig)
def ppo(batch, actor, rollout, ref, critic, reward, kl_ctrl, cfg):
    return ppo_step(batch, actor, rollout, ref, critic, reward, cfg, kl_ctrl=kl_ctrl)
