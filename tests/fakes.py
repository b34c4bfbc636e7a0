"""Fake engines and a fake task: graph logic on CPU with no model."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from flowrl.engines.protocols import SamplingParams


class FakeTokenizer:
    """Token id = digit + 1; 0 is pad, 11 is eos."""

    pad_token_id, eos_token_id = 0, 11

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(c) + 1 if c.isdigit() else 10 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(str(i - 1) if 1 <= i <= 10 else "+" for i in ids)


class FakeTrainEngine:
    """logprobs = -0.1 * response token id; update records what it was given."""

    def __init__(self) -> None:
        self.updates: list[tuple[TensorDict, object]] = []
        self.model = torch.nn.Linear(1, 1)
        self.saved: list[str] = []

    def forward(self, batch, *, temperature=1.0, micro_batch_size=8, with_entropy=False):
        mask = batch["response_mask"].float()
        return {"logprobs": -0.1 * batch["response_ids"].float() * mask, "values": 0.5 * mask}

    def update(self, batch, loss_fn, *, temperature=1.0, mini_batch_size=8, micro_batch_size=8, epochs=1,
               shuffle_seed=None, old_logprobs_from_current=False):
        self.updates.append((batch.clone(), loss_fn))
        self.old_from_current = old_logprobs_from_current
        return {"pg_loss": float(len(self.updates))}

    def full_state_dict(self):
        return {}

    def save(self, path):
        self.saved.append(path)
        import os
        os.makedirs(path, exist_ok=True)

    def load(self, path):
        pass


class FakeRolloutEngine:
    """Response = (sum of prompt tokens + seed + row) % 10 as a digit, then eos."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, prompt_ids_BP, prompt_mask_BP, params: SamplingParams, *, seed=None):
        self.calls += 1
        rows = prompt_ids_BP.shape[0]
        digit = (prompt_ids_BP.sum(-1) + (seed or 0) + torch.arange(rows)) % 10
        ids = torch.stack([digit + 1, torch.full((rows,), 11)], dim=1)
        return TensorDict({"response_ids": ids, "response_mask": torch.ones_like(ids)}, batch_size=[rows])

    def load_weights(self, state_dict):
        pass


class ParityTask:
    """Reward 1 when the response digit is even."""

    meta_keys = ("answer",)
    chars = "0123456789+="

    def example(self, seed: int, index: int):
        return f"{index % 10}+{seed % 10}=", {"answer": str(index % 10 + seed % 10)}

    def reward(self, responses, meta):
        return [1.0 if r and r[0].isdigit() and int(r[0]) % 2 == 0 else 0.0 for r in responses]


class TokenMeanNLL:
    """Supervised LossFn: mean negative logprob over valid response tokens."""

    reads = ("response_mask",)
    needs_entropy = False

    def __call__(self, out, mb):
        mask = mb["response_mask"].float()
        loss = -(out["logprobs"] * mask).sum() / mask.sum()
        return loss, {"loss": loss.item()}

    def weight(self, mb):
        return float(mb["response_mask"].sum())


class SleepyTrainEngine(FakeTrainEngine):
    """A FakeTrainEngine whose forward takes `seconds`: shows whether two forwards overlap."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, batch, **kwargs):
        import time
        time.sleep(self.seconds)
        return super().forward(batch, **kwargs)


def build_fake_roles(cfg, names, shares_actor_module, task, path, forward_s=0.0):
    """flowrl.runtime.factory.build_subset's contract over fakes (for RayExecutor's `builder`)."""
    from flowrl.roles import Actor, Ref, Reward, Rollout

    roles = {}
    if "reward" in names:
        roles["reward"] = Reward(fn=task.reward, tokenizer=FakeTokenizer(), meta_keys=task.meta_keys)
    if "actor" in names:
        roles["actor"] = Actor(engine=SleepyTrainEngine(forward_s))
    if "ref" in names:
        roles["ref"] = Ref(engine=SleepyTrainEngine(forward_s))
    if "rollout" in names:
        roles["rollout"] = Rollout(engine=FakeRolloutEngine(), params=SamplingParams(max_new_tokens=2),
                                   actor=roles.get("actor"), weight_sync=lambda train, rollout: None)
    return roles
