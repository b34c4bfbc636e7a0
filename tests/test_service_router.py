"""The router (flowrl.engines.service.router): least loaded, affinity by key, pause/resume fanned out to every
replica, and results equal to one replica's."""

import asyncio

import pytest

from flowrl.engines.protocols import SamplingParams
from flowrl.engines.service.router import Router
from flowrl.engines.streaming.protocol import Request, Sample
from flowrl.engines.protocols import FinishReason

PARAMS = SamplingParams(max_new_tokens=4)


class Replica:
    """A StreamingEngine whose samples wait on `gate` (so requests stay in flight) and answer from the seed."""

    def __init__(self, name):
        self.name, self.version, self.gate = name, 0, asyncio.Event()
        self.served, self.paused_with, self.closed = [], [], False

    async def sample(self, request):
        self.served.append(request.key)
        await self.gate.wait()
        ids = [request.seed % 7, len(request.prompt_ids)]
        return Sample(request, ids, [-0.5, -0.25], [self.version] * 2, FinishReason.STOP)

    async def pause(self, abort=False):
        self.paused_with.append(abort)

    def resume(self, version):
        self.version = version

    def close(self):
        self.closed = True


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def request(key, seed=0):
    return Request((1, 2, 3), PARAMS, seed=seed, key=key)


def test_least_loaded_first_then_the_same_replica_for_a_key():
    async def go():
        replicas = [Replica(i) for i in range(3)]
        router = Router(replicas, slack=1)
        tasks = [asyncio.create_task(router.sample(request(key))) for key in ("a", "b", "c", "a", "b")]
        await asyncio.sleep(0.01)
        # a, b, c go to the three empty replicas (least loaded, ties to the lowest index); the second a and b
        # follow their key: their replica holds 1 in flight, the least loaded 1 too, within slack 1
        assert [r.served for r in replicas] == [["a", "a"], ["b", "b"], ["c"]]
        assert router.in_flight == [2, 2, 1]
        for r in replicas:
            r.gate.set()
        await asyncio.gather(*tasks)
        assert router.in_flight == [0, 0, 0] and router.routed == [2, 2, 1]
    run(go())


def test_a_key_moves_when_its_replica_is_more_than_slack_busier():
    async def go():
        replicas = [Replica(i) for i in range(2)]
        router = Router(replicas, slack=1)
        tasks = [asyncio.create_task(router.sample(request("k"))) for _ in range(4)]
        await asyncio.sleep(0.01)
        # k on 0 (0 vs 0), on 0 (1 <= 0 + 1), then 0 holds 2 > 0 + 1: to 1, whose key it becomes; then 1 (1 <= 2+1)
        assert [len(r.served) for r in replicas] == [2, 2]
        for r in replicas:
            r.gate.set()
        await asyncio.gather(*tasks)
    run(go())


def test_requests_without_a_key_spread_evenly():
    async def go():
        replicas = [Replica(i) for i in range(4)]
        router = Router(replicas)
        tasks = [asyncio.create_task(router.sample(request(None))) for _ in range(8)]
        await asyncio.sleep(0.01)
        assert [len(r.served) for r in replicas] == [2, 2, 2, 2]
        for r in replicas:
            r.gate.set()
        await asyncio.gather(*tasks)
    run(go())


def test_pause_resume_and_close_reach_every_replica_and_resume_forgets_keys():
    async def go():
        replicas = [Replica(i) for i in range(3)]
        for r in replicas:
            r.gate.set()
        router = Router(replicas)
        await router.sample(request("a"))
        assert router.keys == {"a": 0}
        await router.pause(abort=True)
        router.resume(5)
        assert [r.paused_with for r in replicas] == [[True]] * 3
        assert [r.version for r in replicas] == [5, 5, 5] and router.version == 5
        assert router.keys == {}
        sample = await router.sample(request("a", seed=9))
        assert sample.versions == [5, 5] and sample.response_ids == [2, 3]
        router.close()
        assert all(r.closed for r in replicas)
    run(go())


def test_bad_settings_are_one_line():
    with pytest.raises(ValueError, match="at least one replica"):
        Router([])
    with pytest.raises(ValueError, match="slack must be >= 0"):
        Router([Replica(0)], slack=-1)
