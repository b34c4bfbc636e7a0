"""roles.rollout.engine=vllm_server (flowrl.engines.vllm.server): a replica that is vLLM's own OpenAI server process,
behind the same Router and endpoint as in-process replicas; its samples and weight updates against the HF model.

vLLM's server takes one to three minutes to start on this 2-core CPU machine (importing vLLM, its engine core
process, profiling), past what CI spends on one test: the tests that start one run only with
FLOWRL_VLLM_SERVER_TESTS=1 (proved once with `FLOWRL_VLLM_SERVER_TESTS=1 python -m pytest tests/test_vllm_server.py`;
docs/async.md). The start-up deadline and the clean-up after it run always.
"""

import asyncio
import json
import os
import urllib.request

import pytest
import torch

pytest.importorskip("vllm")

from flowrl.data.builtin.arithmetic import ArithmeticTask  # noqa: E402
from flowrl.engines.configs import ROLLOUT_ENGINES, STREAMERS, ModelSource  # noqa: E402
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer  # noqa: E402
from flowrl.engines.models.tiny_model import build_tiny_model  # noqa: E402
from flowrl.engines.hf.configs import HFRolloutConfig  # noqa: E402
from flowrl.engines.hf.rollout import HFRolloutEngine  # noqa: E402
from flowrl.engines.protocols import FinishReason, SamplingParams  # noqa: E402
from flowrl.engines.service.endpoint import Endpoint  # noqa: E402
from flowrl.engines.service.router import Router  # noqa: E402
from flowrl.engines.streaming.protocol import Request  # noqa: E402
from flowrl.engines.vllm.server import VLLMServerEngine, VLLMServerStreamer  # noqa: E402

SERVER = pytest.mark.skipif(os.environ.get("FLOWRL_VLLM_SERVER_TESTS") != "1",
                            reason="vLLM's server takes 1-3 min to start on CPU; set FLOWRL_VLLM_SERVER_TESTS=1")
CONFIG = {"engine": "vllm_server", "max_model_len": 128, "block_size": 32, "kv_cache_gb": 1}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """The tiny model with head_dim 32 (vLLM's CPU attention has no kernel below that)."""
    return build_tiny_model(tmp_path_factory.mktemp("vllm_server") / "model", chars=ArithmeticTask.chars,
                            hidden_size=128, num_heads=4, max_position_embeddings=128)


@pytest.fixture(scope="module")
def server(model_path):
    config = ROLLOUT_ENGINES.get("vllm_server").model_validate(CONFIG)
    engine = config.build(ModelSource(model_path), tokenizer=load_tokenizer(model_path), device="cpu")
    streamer = config.streamer(engine)
    yield engine, streamer
    streamer.close()
    assert engine.process.poll() is not None  # closed: the server process is gone


def hf_logprobs(model, prompt, response):
    """log p(response | prompt) per token under the HF model, temperature 1."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def hf_greedy(model, tokenizer, prompt, n):
    ids, mask = torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long)
    out = HFRolloutEngine(model, tokenizer, HFRolloutConfig()).generate(
        ids, mask, SamplingParams(max_new_tokens=n, greedy=True))
    return out["response_ids"][0, :int(out["response_mask"][0].sum())].tolist()


def test_the_registered_kind_is_vllms_server_and_a_slow_start_is_one_line_within_its_deadline(model_path):
    config = ROLLOUT_ENGINES.get("vllm_server").model_validate({**CONFIG, "start_timeout_s": 0.5})
    assert config.STREAMER == "vllm_server" and STREAMERS.get("vllm_server") is VLLMServerStreamer
    with pytest.raises(RuntimeError, match=r"did not start within roles.rollout.start_timeout_s=0.5 \(its log: "):
        VLLMServerEngine(ModelSource(model_path), load_tokenizer(model_path), device="cpu", config=config)


def test_a_head_size_vllms_cpu_attention_lacks_is_one_line_before_a_server_starts(tmp_path, monkeypatch):
    """head_dim 16 on the CPU: the in-process engine's check, before the server process (on 2026-12-07 the server
    started, then failed every request with an HTTP 500 naming only "EngineCore encountered an issue")."""
    import subprocess

    path = build_tiny_model(tmp_path / "model", chars=ArithmeticTask.chars, hidden_size=64, num_heads=4)
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    config = ROLLOUT_ENGINES.get("vllm_server").model_validate(CONFIG)
    with pytest.raises(ValueError, match=r"head_dim 16; vLLM on CPU needs one of \(32, "):
        config.build(ModelSource(path), tokenizer=load_tokenizer(path), device="cpu")
    assert started == []


@SERVER
def test_samples_through_the_router_are_the_models_own_and_a_weight_update_reaches_the_server(server, model_path):
    engine, streamer = server
    tokenizer, model = load_tokenizer(model_path), load_causal_lm(model_path)
    router = Router([streamer])
    prompt = tokenizer.encode("12+3=")
    sample = asyncio.run(router.sample(Request(tuple(prompt), SamplingParams(max_new_tokens=8), seed=3, key="g")))
    assert sample.versions == [0] * len(sample.response_ids) and router.routed == [1]
    assert torch.allclose(torch.tensor(sample.logprobs), hf_logprobs(model, prompt, sample.response_ids), atol=1e-4)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.3)
    asyncio.run(router.pause())
    engine.load_weights(model.state_dict())  # vLLM's reload_weights through /collective_rpc
    router.resume(1)
    again = asyncio.run(router.sample(Request(tuple(prompt), SamplingParams(max_new_tokens=8), seed=3)))
    assert again.versions == [1] * len(again.response_ids)
    assert torch.allclose(torch.tensor(again.logprobs), hf_logprobs(model, prompt, again.response_ids), atol=1e-4)
    greedy = engine.generate(torch.tensor([prompt]), torch.ones(1, len(prompt), dtype=torch.long),
                             SamplingParams(max_new_tokens=8, greedy=True))
    n = int(greedy["response_mask"][0].sum())
    assert greedy["response_ids"][0, :n].tolist() == hf_greedy(model, tokenizer, prompt, 8)


@SERVER
def test_an_abort_keeps_the_prefix_and_the_rest_runs_on_the_new_version(server, model_path):
    engine, streamer = server
    prompt = tuple(load_tokenizer(model_path).encode("7+8="))
    params = SamplingParams(max_new_tokens=100, ignore_eos=True)

    async def cut_once():
        task = asyncio.create_task(streamer.sample(Request(prompt, params, seed=5)))
        while not streamer.in_flight:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        await streamer.pause(abort=True)
        assert streamer.in_flight == 0 and not task.done()  # it waits for resume, with its prefix
        streamer.resume(streamer.version + 1)
        return await task
    before = streamer.version
    sample = asyncio.run(cut_once())
    assert sample.aborts == 1 and len(sample.response_ids) == 100 and sample.finish == FinishReason.LENGTH
    cut = sample.versions.index(before + 1)
    assert 0 < cut < 100 and set(sample.versions[:cut]) == {before} and set(sample.versions[cut:]) == {before + 1}


@SERVER
def test_the_endpoint_serves_an_agent_from_the_server_replica(server, model_path):
    _, streamer = server
    tokenizer = load_tokenizer(model_path)
    endpoint = Endpoint(Router([streamer]), tokenizer, SamplingParams(max_new_tokens=4))
    endpoint.start()
    try:
        body = json.dumps({"prompt": "9+4=", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"{endpoint.base_url}/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.loads(response.read())
    finally:
        endpoint.stop()
    assert reply["prompt_token_ids"] == tokenizer.encode("9+4=") and 1 <= len(reply["token_ids"]) <= 4
    assert len(reply["token_logprobs"]) == len(reply["token_ids"]) == len(reply["policy_versions"])
