"""ThreadedStreamer (flowrl.engines.streaming.thread_streamer): requests one by one over a batch engine, pause/resume, abort."""

import asyncio
import threading

import pytest

from flowrl.engines.hf.configs import HFRolloutConfig, HFStaticRolloutConfig
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.hf.static import StaticCacheRolloutEngine
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.streaming.protocol import Request
from flowrl.engines.streaming.thread_streamer import ThreadedStreamer
from fake_streamer import unpadded
from fakes import FakeRolloutEngine

PROMPTS = ["12+3=", "7*8=", "9-4=", "1+1=", "22+22=", "5="]
GREEDY = SamplingParams(max_new_tokens=8, greedy=True)
FULL = SamplingParams(max_new_tokens=8, greedy=True, ignore_eos=True)
DEADLINE = 20.0  # every await in these tests


@pytest.fixture(scope="module")
def hf(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    return HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig()), [tokenizer.encode(t) for t in PROMPTS]


class Gated:
    """Wraps an engine: generate() announces itself (`entered`) and waits for `gate` before generating."""

    def __init__(self, inner):
        self.inner, self.entered, self.gate = inner, threading.Event(), threading.Event()

    def generate(self, *args, **kwargs):
        self.entered.set()
        assert self.gate.wait(DEADLINE)
        return self.inner.generate(*args, **kwargs)


class GatedInterruptible(Gated):
    @property
    def stop(self):
        return self.inner.stop


def batch(engine, rows, params):
    """[(ids, logprobs)] of the batch engine's responses."""
    return [(ids, logprobs) for ids, logprobs, _ in unpadded(engine, rows, params)]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


async def one_by_one(streamer, requests):
    tasks = []
    for request in requests:
        tasks.append(asyncio.create_task(streamer.sample(request)))
        await asyncio.sleep(0.001)
    return await asyncio.gather(*tasks)


@pytest.mark.parametrize("chunk_tokens", [None, 3])
def test_streamed_greedy_equals_the_batch_generate(hf, chunk_tokens):
    engine, rows = hf
    streamer = ThreadedStreamer(engine, max_batch=4, chunk_tokens=chunk_tokens)
    try:
        samples = run(one_by_one(streamer, [Request(tuple(r), GREEDY) for r in rows]))
    finally:
        streamer.close()
    expected = batch(engine, rows, GREEDY)
    for sample, (ids, logprobs) in zip(samples, expected):
        assert sample.response_ids == ids and sample.versions == [0] * len(ids) and sample.aborts == 0
        assert sample.logprobs == pytest.approx(logprobs, abs=1e-5)
        assert sample.finish == (FinishReason.STOP if ids[-1] == engine.eos_id else FinishReason.LENGTH)


def test_a_short_request_resolves_before_a_long_one(hf):
    engine, rows = hf
    streamer = ThreadedStreamer(engine, chunk_tokens=2)

    async def main():
        order = []
        long = Request(tuple(rows[0]), SamplingParams(max_new_tokens=12, greedy=True, ignore_eos=True))
        short = Request(tuple(rows[1]), SamplingParams(max_new_tokens=2, greedy=True, ignore_eos=True))
        tasks = [asyncio.create_task(streamer.sample(r)) for r in (long, short)]
        for done in asyncio.as_completed(tasks):
            order.append(len((await done).response_ids))
        return order

    try:
        assert run(main()) == [2, 12]
    finally:
        streamer.close()


def test_pause_lets_in_flight_requests_finish_under_the_old_version(hf):
    engine, rows = hf
    gated = Gated(engine)
    streamer = ThreadedStreamer(gated, max_batch=2)

    async def main():
        first = [asyncio.create_task(streamer.sample(Request(tuple(r), FULL))) for r in rows[:2]]
        assert await asyncio.to_thread(gated.entered.wait, DEADLINE)
        pause = asyncio.create_task(streamer.pause(abort=False))
        await asyncio.sleep(0.01)
        late = asyncio.create_task(streamer.sample(Request(tuple(rows[2]), FULL)))
        gated.gate.set()
        await pause
        assert all(task.done() for task in first) and not late.done()  # the late one waits for resume
        streamer.resume(1)
        return [await task for task in first], await late

    try:
        first, late = run(main())
    finally:
        streamer.close()
    assert [s.versions for s in first] == [[0] * 8] * 2 and late.versions == [1] * 8
    assert [s.response_ids for s in (*first, late)] == [ids for ids, _ in batch(engine, rows[:3], FULL)]


@pytest.mark.parametrize("static", [False, True])
def test_abort_resumes_from_the_prefix_under_the_new_version(hf, tiny_model_path, static):
    engine, rows = hf
    if static:
        engine = StaticCacheRolloutEngine(load_causal_lm(tiny_model_path), engine.tokenizer, HFStaticRolloutConfig(compile=False))
    gated = GatedInterruptible(engine)
    streamer = ThreadedStreamer(gated)

    async def main():
        task = asyncio.create_task(streamer.sample(Request(tuple(rows[0]), FULL)))
        assert await asyncio.to_thread(gated.entered.wait, DEADLINE)
        pause = asyncio.create_task(streamer.pause(abort=True))
        await asyncio.sleep(0.01)  # the stop is set before generate runs: it samples one token and stops
        gated.gate.set()
        await pause
        assert not task.done()
        streamer.resume(1)
        return await task

    try:
        sample = run(main())
    finally:
        streamer.close()
    (ids, logprobs), = batch(engine, rows[:1], FULL)
    assert sample.aborts == 1 and sample.versions == [0] + [1] * 7  # one token before the abort, 7 after
    assert sample.response_ids == ids and len(ids) == FULL.max_new_tokens  # continuity; the budget holds
    assert sample.logprobs == pytest.approx(logprobs, abs=1e-5)
    assert not engine.stop.is_set()  # cleared for the engine's own batch calls


def test_abort_on_an_engine_without_the_hook_finishes_the_batch():
    gated = Gated(FakeRolloutEngine())
    streamer = ThreadedStreamer(gated)

    async def main():
        task = asyncio.create_task(streamer.sample(Request((3, 4), SamplingParams(max_new_tokens=4))))
        assert await asyncio.to_thread(gated.entered.wait, DEADLINE)
        pause = asyncio.create_task(streamer.pause(abort=True))
        await asyncio.sleep(0.01)
        gated.gate.set()
        await pause
        return task.result()  # done before pause returned

    try:
        sample = run(main())
    finally:
        streamer.close()
    assert sample.response_ids == [8, 11] and sample.versions == [0, 0] and sample.aborts == 0  # fakes: (3+4)%10+1
    assert sample.finish == FinishReason.STOP


def test_failures_and_close_reach_the_callers():
    class Broken(FakeRolloutEngine):
        def generate(self, *args, **kwargs):
            raise OSError("disk gone")

    streamer = ThreadedStreamer(Broken())
    with pytest.raises(OSError, match="disk gone"):
        run(streamer.sample(Request((1,), GREEDY)))
    with pytest.raises(RuntimeError, match="worker failed"):
        run(streamer.sample(Request((1,), GREEDY)))
    streamer.close()
    paused = ThreadedStreamer(FakeRolloutEngine())

    async def waits_then_closes():
        await paused.pause()
        task = asyncio.create_task(paused.sample(Request((1,), GREEDY)))
        await asyncio.sleep(0.01)
        paused.close()
        return await task

    with pytest.raises(RuntimeError, match="closed before this request finished"):
        run(waits_then_closes())
    assert not paused.thread.is_alive()
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        ThreadedStreamer(FakeRolloutEngine(), max_batch=0)
