"""The rollout role: samples responses with the actor's weights (synced before each step's first generation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import repeat_rows, response_lengths
from flowrl.engines.protocols import RolloutEngine, SamplingParams, WeightSync
from flowrl.errors import GraphError
from flowrl.graph.context import current_call
from flowrl.graph.role import graph_method, role
from flowrl.roles.context import BuildContext

GENERATED = ("response_ids", "response_mask", "loss_mask", "rollout_logprobs", "finish_reason", "policy_version",
             "group")


def _check_sampling(n: int = 1, **sampling: Any) -> None:
    if not isinstance(n, int) or n < 1:
        raise GraphError(f"rollout.generate: n must be an int >= 1, got {n!r}")
    unknown = sorted(set(sampling) - set(SamplingParams.__dataclass_fields__))
    if unknown:
        raise GraphError(f"rollout.generate: unknown sampling option {unknown[0]!r}; "
                         f"options are {sorted(SamplingParams.__dataclass_fields__)}")


@role("rollout", weights_from="actor")
@dataclass
class Rollout:
    engine: RolloutEngine
    params: SamplingParams
    source: Any = None  # the role whose weights this one follows, when it lives in this process
    weight_sync: WeightSync | None = None
    seed: int = 0
    synced_version: int = 0  # the source's update count this engine holds

    @classmethod
    def build(cls, ctx: BuildContext) -> "Rollout":
        source = ctx.roles.get("actor")
        share = source.engine if source is not None and ctx.name in ctx.shared else None
        config = ctx.engine("rollout")
        engine = config.build(ctx.model, tokenizer=ctx.tokenizer, device=ctx.device, share=share)
        sync = engine.weight_sync(source.engine) if source is not None else None
        return cls(engine=engine, params=config.sampling(), source=source, weight_sync=sync, seed=ctx.seed)

    @graph_method(reads=("prompt_ids", "prompt_mask", "uid"), writes=GENERATED, kind="rows", check=_check_sampling)
    def generate(self, batch: TensorDict, n: int = 1, **sampling: Any) -> TensorDict:
        """n responses per prompt row (adjacent); each row's `group` is its prompt's uid."""
        _check_sampling(n, **sampling)
        params = SamplingParams(**{**self.params.__dict__, **sampling})
        rows = repeat_rows(batch, n)
        call = current_call()
        seed = (self.seed * 1_000_003 + call.step * 1_009 + call.call) % (2**31)
        out = self.engine.generate(rows["prompt_ids"], rows["prompt_mask"], params, seed=seed)
        for key in ("response_ids", "response_mask", "rollout_logprobs", "finish_reason"):
            rows[key] = out[key]
        rows["loss_mask"] = out["response_mask"].clone()
        rows["policy_version"] = torch.full((rows.batch_size[0],), self.synced_version, dtype=torch.long)
        rows["group"] = rows["uid"].clone()
        lengths = response_lengths(rows).float()
        metrics.log("response_length/mean", lengths.mean())
        metrics.log("response_length/clip_ratio", (lengths >= params.max_new_tokens).float().mean())
        return rows

    @graph_method(kind="sync")
    def sync_weights(self, batch: TensorDict) -> TensorDict:
        """Hybrid engine: bring the source's latest weights into the rollout engine."""
        if self.source is not None and self.weight_sync is not None and self.synced_version != self.source.version:
            self.weight_sync(self.source.engine, self.engine)
            self.synced_version = self.source.version
        return batch

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Weights sent from the source's process (the executor syncs split pools this way)."""
        self.engine.load_weights(state_dict)
        self.synced_version = version
