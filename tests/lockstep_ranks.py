"""One rank of test_lockstep's run (python -m torch.distributed.run --nproc-per-node N THIS OUT): N gloo ranks
at tensor parallel 2, so N / 2 replicas (ranks 0-1, 2-3, ...), each a SteppedStreamer over a recording ScriptCore on
its rank 0 and a Follower on its rank 1. Each leader: 3 requests and a refused one; once a few tokens are out,
one caller gives up; then a partial weight update: pause(abort=True), an all-reduce over the world standing for
the weights moving (no rank listens on the replica group then), a caller giving up on a parked request in the
middle of it, resume at version 1; the rest finish. Each rank writes its core's calls (and a leader its
samples) to OUT/rank<r>.json."""

import asyncio
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from fake_cores import ScriptCore
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.streaming.lockstep import Channel, Follower, LeaderCore, replica_group
from flowrl.engines.streaming.protocol import Request
from flowrl.engines.streaming.stepped import SteppedStreamer

DEADLINE_S = 60.0
TOKENS = 40  # a request runs 40 steps of 5 ms or more: none finishes before the update's pause


class SlowCore(ScriptCore):
    def step(self):
        import time
        time.sleep(0.005)  # a few steps pass while the leader's caller looks
        return super().step()


def weights_move(version: int) -> None:
    """The weight update between pause and resume: a collective of the whole world on its default group."""
    total = torch.tensor([float(version)])
    dist.all_reduce(total)
    assert total.item() == version * dist.get_world_size()


async def lead(streamer: SteppedStreamer, rank: int) -> dict:
    params = SamplingParams(max_new_tokens=TOKENS)
    streamer.resume(0)
    prompts = [(rank + 1, 2, 3), (rank + 4, 5), (rank + 6,)]
    tasks = [asyncio.create_task(streamer.sample(Request(p, params, seed=i))) for i, p in enumerate(prompts)]
    tasks.append(asyncio.create_task(streamer.sample(Request(tuple(range(2000)), params))))  # refused
    given_up = asyncio.create_task(streamer.sample(Request((9, 9), params, seed=7)))
    while sum(len(live.ids) for live in list(streamer.live.values())) < 8:
        await asyncio.sleep(0.001)
    given_up.cancel()
    await asyncio.sleep(0.02)
    parked = asyncio.create_task(streamer.sample(Request((8,), params, seed=5)))
    await asyncio.sleep(0.02)
    await streamer.pause(abort=True)  # the update starts: what runs stops with its prefix
    assert not streamer.core.listening
    parked.cancel()  # a caller gives up in the middle of the update
    weights_move(1)
    streamer.resume(1)
    samples = await asyncio.gather(*tasks[:3])
    refused = await asyncio.gather(tasks[3], return_exceptions=True)
    await streamer.pause()
    return {"samples": [dict(ids=s.response_ids, versions=s.versions, aborts=s.aborts, prompt=s.request.prompt_ids,
                             seed=s.request.seed) for s in samples], "refused": str(refused[0])}


async def follow(follower: Follower) -> dict:
    follower.resume(0)
    await follower.pause()
    assert not follower.listening  # no receive on the replica group while the weights move
    weights_move(1)
    follower.resume(1)
    await follower.pause()
    try:
        await follower.sample(Request((1,), SamplingParams()))
    except RuntimeError as err:
        return {"sample": str(err)}
    return {"sample": "returned"}


def calls(core: ScriptCore) -> list:
    return [[c[0], c[1], list(c[2]), c[3].max_new_tokens, c[4]] if c[0] == "add" else [c[0], *map(list, c[1:])]
            for c in core.calls]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    channel = Channel(replica_group(2, "cpu"))
    core = SlowCore()
    if channel.leader:
        streamer = SteppedStreamer(LeaderCore(core, channel, beat_s=0.05), paused=True)
        result = asyncio.run(asyncio.wait_for(lead(streamer, rank), DEADLINE_S))
        streamer.close()
    else:
        follower = Follower(core, channel, pause_timeout_s=DEADLINE_S, close_timeout_s=DEADLINE_S, record=True)
        result = asyncio.run(asyncio.wait_for(follow(follower), DEADLINE_S))
        follower.close()
        result["messages"] = len(follower.steps)
    result.update(calls=calls(core), leader=channel.leader, src=channel.src)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
