"""The built-in roles, registered by name on import (flowrl.graph.role.ROLES).

actor, ref, critic, teacher (flowrl.roles.actor); rollout (flowrl.roles.rollout);
reward and reward_model (flowrl.roles.reward); kl_ctrl; conversations and
learned_reward; llm_judge. Importing this package registers them all (the
graph layer names no module above it); your own roles register the same way
with `@flowrl.role`.
"""

from flowrl.roles import conversations, judge, kl_controller  # noqa: F401 (they register their roles)
from flowrl.roles.actor import Actor, Critic, Ref, Teacher
from flowrl.roles.context import BuildContext, UpdateSettings
from flowrl.roles.reward import Reward, RewardModel, decode_responses
from flowrl.roles.rollout import Rollout

__all__ = ["Actor", "Critic", "Ref", "Teacher", "BuildContext", "UpdateSettings", "Reward", "RewardModel", "decode_responses",
           "Rollout"]
