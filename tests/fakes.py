"""Fake engines and a fake task: graph logic on CPU with no model."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from flowrl.engines.protocols import FinishReason, SamplingParams
import flowrl.roles  # noqa: F401 (registers the built-in roles)
from flowrl.graph.role import ROLES, RoleSpec

ROLE_CLASSES = {name: ROLES.get(name).cls for name in ("actor", "rollout", "ref", "critic", "reward")}


class FakeTokenizer:
    """Token id = digit + 1; 0 is pad, 11 is eos."""

    pad_token_id, eos_token_id = 0, 11

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(c) + 1 if c.isdigit() else 10 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(str(i - 1) if 1 <= i <= 10 else "+" for i in ids)


class FakeTrainEngine:
    """logprobs = -0.1 * response token id, values 0.5, any other output 0.25; update records what it was given."""

    def __init__(self) -> None:
        self.updates: list[tuple[TensorDict, object]] = []
        self.model = torch.nn.Linear(1, 1)
        self.saved: list[str] = []

    def forward(self, batch, *, temperature=1.0, micro_batch_size=8, outputs=None):
        mask = batch["response_mask"].float()
        out = {"logprobs": -0.1 * batch["response_ids"].float() * mask, "values": 0.5 * mask}
        return {**out, **{name: 0.25 * mask for name in outputs or () if name not in out}}

    def update(self, batch, loss_fn, *, temperature=1.0, mini_batch_size=8, micro_batch_size=8, epochs=1,
               shuffle_seed=None, old_logprobs_from_current=False):
        self.updates.append((batch.clone(), loss_fn))
        self.old_from_current = old_logprobs_from_current
        return {"pg_loss": float(len(self.updates))}

    def full_state_dict(self):
        return {}

    def named_full_tensors(self):
        return iter(())

    def weight_shards(self):
        return None  # a split pool's sync falls back to the broadcast of named_full_tensors

    def save(self, path):
        self.saved.append(path)
        import os
        os.makedirs(path, exist_ok=True)

    def load(self, path):
        pass


class FakeRolloutEngine:
    """Response = (sum of prompt tokens + seed + row) % 10 as a digit, then eos."""

    def __init__(self) -> None:
        self.calls, self.tp_ranks = 0, 1

    def generate(self, prompt_ids_BP, prompt_mask_BP, params: SamplingParams, *, seed=None):
        self.calls += 1
        rows = prompt_ids_BP.shape[0]
        digit = (prompt_ids_BP.sum(-1) + (seed or 0) + torch.arange(rows)) % 10
        ids = torch.stack([digit + 1, torch.full((rows,), 11)], dim=1)
        return TensorDict({"response_ids": ids, "response_mask": torch.ones_like(ids),
                           "rollout_logprobs": -0.1 * ids.float(),
                           "finish_reason": torch.full((rows,), int(FinishReason.STOP))}, batch_size=[rows])

    def load_weights(self, state_dict):
        pass

    def load_weight_stream(self, named_tensors):
        return sum(1 for _ in named_tensors)

    def weight_sync(self, train, timeout_s=600.0):
        return lambda train, rollout: None

    def close(self):
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
    needs = ("logprobs",)
    combine = "mean"

    def __call__(self, out, mb):
        mask = mb["response_mask"].float()
        loss = -(out["logprobs"] * mask).sum() / mask.sum()
        return loss, {"loss": loss.item()}

    def weight(self, mb):
        return float(mb["response_mask"].sum())


class TokenSumNLL(TokenMeanNLL):
    """TokenMeanNLL's token-sum: the negative logprobs summed; the engine adds micro-batches' losses."""

    combine = "sum"

    def __call__(self, out, mb):
        loss = -(out["logprobs"] * mb["response_mask"].float()).sum()
        return loss, {"loss": loss.item()}

    def weight(self, mb):
        return float(mb["response_mask"].any())


class SleepyTrainEngine(FakeTrainEngine):
    """A FakeTrainEngine whose forward takes `seconds`: shows whether two forwards overlap."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, batch, **kwargs):
        import time
        time.sleep(self.seconds)
        return super().forward(batch, **kwargs)


class ExitingTrainEngine(FakeTrainEngine):
    """A FakeTrainEngine whose process ends in forward (a worker that dies)."""

    def forward(self, batch, **kwargs):
        import os
        os._exit(3)


class SleepyRolloutEngine(FakeRolloutEngine):
    """A FakeRolloutEngine whose generate takes `seconds` (a slow sampler: generation the bottleneck)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def generate(self, *args, **kwargs):
        import time
        time.sleep(self.seconds)
        return super().generate(*args, **kwargs)


class SlowUpdateEngine(SleepyTrainEngine):
    """A SleepyTrainEngine whose update takes `update_s` too."""

    def __init__(self, seconds: float, update_s: float) -> None:
        super().__init__(seconds)
        self.update_s = update_s

    def update(self, *args, **kwargs):
        import time
        time.sleep(self.update_s)
        return super().update(*args, **kwargs)


def fake_specs(forward_s: float = 0.0, ref_exits: bool = False, generate_s: float = 0.0,
               update_s: float = 0.0, rollout: dict[str, Any] | None = None) -> dict[str, RoleSpec]:
    """The built-in roles' registrations with classes that build over fakes (for a RoleFactory's `specs`);
    `ref_exits`: the reference's worker process ends in its first forward; `generate_s` / `update_s`: how long
    each generation / actor update takes; `rollout`: Rollout fields to set (partial, make_streamer: a
    ThreadedStreamer by default)."""
    from flowrl.engines.streaming.thread_streamer import ThreadedStreamer
    from flowrl.roles import Actor, Ref, Reward, Rollout

    class FakeActor(Actor):
        @classmethod
        def build(cls, ctx):
            return Actor(engine=SlowUpdateEngine(forward_s, update_s))

    class FakeRef(Ref):
        @classmethod
        def build(cls, ctx):
            return Ref(engine=ExitingTrainEngine() if ref_exits else SleepyTrainEngine(forward_s))

    class FakeRollout(Rollout):
        @classmethod
        def build(cls, ctx):
            return Rollout(engine=SleepyRolloutEngine(generate_s), params=SamplingParams(max_new_tokens=2),
                           source=ctx.roles.get("actor"), weight_sync=lambda train, rollout: None,
                           **{"make_streamer": ThreadedStreamer, **(rollout or {})})

    class FakeReward(Reward):
        @classmethod
        def build(cls, ctx):
            return Reward(fn=ctx.task.reward, tokenizer=FakeTokenizer(), meta_keys=ctx.task.meta_keys)

    fakes = {"actor": FakeActor, "ref": FakeRef, "rollout": FakeRollout, "reward": FakeReward}
    return {name: RoleSpec(name, cls, **{k: getattr(ROLES.get(name), k) for k in
                                         ("trainable", "exported", "on_driver", "weights_from")})
            for name, cls in fakes.items()}
