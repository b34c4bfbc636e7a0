"""Roles whose results do not depend on how rows lie over ranks, and a torchrun entry point that trains with them.

`UidSeededRollout` samples each prompt's group on its own, seeded by the prompt's uid, so a prompt's samples
are the same whichever rank draws it and whatever else that rank samples (the built-in rollout samples a
rank's whole batch from one seed). `RowsActor` logs the batch sizes each rank trains with. A module, so
torchrun's ranks and Ray workers import the same classes.

    python -m torch.distributed.run --nproc-per-node 2 rank_parity.py OUT.json '{"name": ["train.steps=3"]}'
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from quick_imports import collector_off

with collector_off():  # a torchrun rank's imports (tests/quick_imports.py)
    from tensordict import TensorDict

    import flowrl as fl
    from flowrl.data.batch import concat, response_lengths
    from flowrl.engines.streaming.thread_streamer import ThreadedStreamer
    from flowrl.graph.context import CallInfo
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


@fl.role("sample_seeded_rollout", weights_from="actor")
class SampleSeededRollout(Rollout):
    """A deterministic engine for streamed rollouts: every sample is generated alone (one request at a time,
    ThreadedStreamer(max_batch=1)), seeded by the run's seed, its prompt's uid and its place in the group only;
    so which replica samples a prompt, and when, changes no token."""

    def sample_seed(self, uid: int, j: int) -> int:
        return (self.seed * 1_000_003 + 7_919 * uid + j) % (2**31)

    def requests(self, batch: TensorDict, info: CallInfo, n: int = 1, **sampling):
        rows, requests = Rollout.requests(self, batch, info, n, **sampling)
        uids = rows["uid"].tolist()
        return rows, [dataclasses.replace(r, seed=self.sample_seed(uid, k % n))
                      for k, (r, uid) in enumerate(zip(requests, uids))]

    def streaming_engine(self):
        if self.streamer is None:
            self.streamer = ThreadedStreamer(self.engine, max_batch=1, pad_id=self.pad_id)
        return self.streamer


@fl.role("tp2_sample_seeded_rollout", weights_from="actor")
class TwoRankReplicaRollout(SampleSeededRollout):
    """SampleSeededRollout's samples from replicas of 2 ranks each (tensor parallel 2, flowrl.engines.streaming.
    lockstep): the replica's rank 0 leads a SteppedStreamer over a GenerateCore (tests/fake_cores.py: one
    `generate` call per sample, seeded as ThreadedStreamer(max_batch=1) seeds it), its rank 1 follows with a
    GenerateCore of its own, stepping the same requests. Each group built logs its leader's pool rank."""

    def __init__(self, *args, **kwargs):
        import torch.distributed as dist

        from flowrl.engines.streaming.lockstep import replica_group

        super().__init__(*args, **kwargs)
        self.engine.tp_ranks = 2  # what the Ray executor reads (PoolWorker.tensor_ranks)
        self.group = replica_group(2, "cpu") if dist.is_initialized() else None

    def streaming_engine(self):
        from fake_cores import GenerateCore
        from flowrl.engines.streaming.lockstep import Channel, Follower, LeaderCore
        from flowrl.engines.streaming.stepped import SteppedStreamer

        if self.streamer is None:
            channel = Channel(self.group)
            core = GenerateCore(self.engine)
            self.streamer = SteppedStreamer(LeaderCore(core, channel), paused=True) if channel.leader else \
                Follower(core, channel)
        return self.streamer

    def streamed(self, rows, samples):
        import torch.distributed as dist

        fl.metrics.log("rollout/leader_rank", dist.get_rank())
        return SampleSeededRollout.streamed(self, rows, samples)


@fl.role("sample_seeded_generate", weights_from="actor")
class SampleSeededGenerate(SampleSeededRollout):
    """The same samples from `generate` (on any rank): each a call of one row, seeded as its streamed request."""

    def generate(self, batch: TensorDict, n: int = 1, **sampling) -> TensorDict:
        out = []
        for i in range(batch.batch_size[0]):
            for j in range(n):
                params, rows, _ = self._start(batch[i:i + 1], 1, sampling)
                sample = self.engine.generate(rows["prompt_ids"], rows["prompt_mask"], params,
                                              seed=self.sample_seed(int(rows["uid"][0]), j))
                sample["loss_mask"] = sample["response_mask"].clone()
                out.append(self._finish(rows, sample, params))
        rows = concat(out, self.pad_id)
        fl.metrics.log("response_length/clip_ratio", (response_lengths(rows) >= params.max_new_tokens).float().mean())
        return rows

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

    with collector_off():
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


def launch(folder: Path, runs: dict[str, list[str]]) -> dict[str, list[dict] | str]:
    """`runs` (name -> config overrides, without train.output_dir) trained in one launch of two gloo ranks, each
    in folder/NAME; what main wrote, by name."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(here), os.environ.get("PYTHONPATH")))),
           "OMP_NUM_THREADS": "1"}
    named = {name: [*overrides, f"train.output_dir={folder / name}"] for name, overrides in runs.items()}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(here / "rank_parity.py"),
           str(folder / "runs.json"), json.dumps(named)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "runs.json").read_text())


if __name__ == "__main__":
    main(*sys.argv[1:])
