"""The adaptive KL controller: a driver role whose KL-in-reward coefficient follows a target KL across steps.

verl's `algorithm.kl_ctrl.type=adaptive` (Ziegler et al., arXiv:1909.08593):
each step the token rewards are the score on the last token minus coef * KL
per token, and then coef moves toward the target by
flowrl.rl.ops.kl.adaptive_kl_coef. The coefficient is state that outlives a
step, so the role is registered `trainable`: checkpoints save and load its
`.engine` (a small JSON file), and a resumed run continues from the saved
coefficient exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines.models.folders import atomic_dir
from flowrl.graph.role import graph_method, role
from flowrl.rl.ops import kl as kl_ops
from flowrl.rl.ops import rewards as reward_ops
from flowrl.rl.ops.masked import masked_mean

STATE_FILE = "kl_ctrl.json"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclass
class KLCoefState:
    """The controller's coefficient (None until its first step), saved and loaded as checkpoints do engines."""

    coef: float | None = None

    def save(self, path: str) -> None:
        if _distributed() and dist.get_rank() != 0:
            return
        with atomic_dir(path) as tmp:
            (tmp / STATE_FILE).write_text(json.dumps({"coef": self.coef}))

    def load(self, path: str) -> None:
        file = Path(path) / STATE_FILE
        if not file.is_file():
            raise ValueError(f"path {path!r} holds no {STATE_FILE} (not a KL controller checkpoint)")
        self.coef = json.loads(file.read_text())["coef"]


@role("kl_ctrl", trainable=True, on_driver=True)
@dataclass
class KLController:
    engine: KLCoefState = field(default_factory=KLCoefState)

    @graph_method(reads=("scores", "response_mask", "old_logprobs", "ref_logprobs"), writes=("token_rewards",))
    def token_rewards(self, batch: TensorDict, *, init_coef: float, target_kl: float, horizon: int,
                      kl_kind: str = "k1") -> TensorDict:
        """Token rewards with the current coefficient (init_coef on the first step), then one controller update
        from the batch's KL: the mean over rows of each row's mean KL, over all ranks, counting rows as steps."""
        coef = init_coef if self.engine.coef is None else self.engine.coef
        mask = batch["response_mask"]
        kl = torch.where(mask.bool(), kl_ops.kl_penalty(batch["old_logprobs"], batch["ref_logprobs"], kl_kind), 0)
        batch["token_rewards"] = reward_ops.kl_in_reward(reward_ops.token_rewards(batch["scores"], mask), kl, coef)
        totals = torch.tensor([float(masked_mean(kl, mask, dim=-1).sum()), float(mask.shape[0])], dtype=torch.float64)
        if _distributed():
            dist.all_reduce(totals)
        current_kl, rows = float(totals[0] / totals[1].clamp(min=1)), int(totals[1])
        self.engine.coef = kl_ops.adaptive_kl_coef(coef, current_kl, target_kl, horizon, rows)
        metrics.log("reward/kl", current_kl)
        metrics.log("kl_ctrl/coef", coef)
        return batch
