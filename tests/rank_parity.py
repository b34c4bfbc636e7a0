"""Roles whose results do not depend on how rows lie over ranks, and a torchrun entry point that trains with them.

`UidSeededRollout` samples each prompt's group on its own, seeded by the prompt's uid, so a prompt's samples
are the same whichever rank draws it and whatever else that rank samples (the built-in rollout samples a
rank's whole batch from one seed). `RowsActor` logs the batch sizes each rank trains with. A module, so
torchrun's ranks and Ray workers import the same classes.

    python -m torch.distributed.run --nproc-per-node 2 rank_parity.py OUT.json '{"name": ["train.steps=3"]}'
"""

from __future__ import annotations

import json
import sys

from tensordict import TensorDict

import flowrl as fl
from flowrl.data.batch import concat
from flowrl.roles import Actor, Rollout
from flowrl.graph.role import SPEC_ATTR

ROLES = ["roles={\"rollout\": \"uid_seeded_rollout\", \"actor\": \"rows_actor\"}"]


def _same_spec(method, as_method):
    """`method` as a graph node with the spec of the method it overrides."""
    setattr(method, SPEC_ATTR, getattr(as_method, SPEC_ATTR))
    return method


@fl.role("uid_seeded_rollout", weights_from="actor")
class UidSeededRollout(Rollout):
    def generate(self, batch: TensorDict, n: int = 1, **sampling) -> TensorDict:
        """Each prompt's n samples, from the call's seed plus the prompt's uid."""
        return concat([Rollout.generate(self, batch[i:i + 1], n, **sampling) for i in range(batch.batch_size[0])])

    def _start(self, batch, n, sampling):
        params, rows, seed = super()._start(batch, n, sampling)
        return params, rows, (seed + 7919 * int(batch["uid"][0])) % (2**31)

    generate = _same_spec(generate, Rollout.generate)


@fl.role("rows_actor", trainable=True, exported=True)
class RowsActor(Actor):
    def update(self, batch: TensorDict, **kwargs) -> TensorDict:
        """The built-in update (which a one-step update's old logprobs are folded into); logs the batch sizes
        this rank was given (the same on every rank)."""
        s = self.settings
        fl.metrics.log("rank/rows", batch.batch_size[0])
        fl.metrics.log("rank/forward_micro_batch_size", s.forward_micro_batch_size or s.micro_batch_size)
        fl.metrics.log("rank/mini_batch_size", s.mini_batch_size)
        fl.metrics.log("rank/micro_batch_size", s.micro_batch_size)
        return Actor.update(self, batch, **kwargs)

    update = _same_spec(update, Actor.update)


def main(out: str, runs: str) -> None:
    """Each run of `runs` (JSON: name -> config overrides) trained in turn; rank 0 writes {name: its metric rows,
    or its error line}."""
    import torch.distributed as dist

    from flowrl.config import load_run_config
    from flowrl.runtime.trainer import train

    results = {}
    for name, overrides in json.loads(runs).items():
        try:
            results[name] = train(load_run_config(None, [*ROLES, *overrides]), progress=False)
        except ValueError as err:  # also fl.PlanError: a refused run
            results[name] = str(err)
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
