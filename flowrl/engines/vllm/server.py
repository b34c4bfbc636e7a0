"""`roles.rollout.engine=vllm_server`: a rollout replica that is vLLM's own OpenAI server in a process of its own.

`python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs) starts on 127.0.0.1 at a free port,
with `VLLM_SERVER_DEV_MODE=1` for vLLM's RL and dev routes, and is waited for (`GET /health`) within
`start_timeout_s`. What flowrl asks of it, all vLLM's own routes:

- sampling: `POST /v1/completions` with the prompt as token ids, `return_token_ids` and `logprobs=0` (the
  sampler's processed logprob of each sampled token: the server runs `--logprobs-mode processed_logprobs`);
- a weight update, by `roles.rollout.weight_transfer` (flowrl.engines.vllm.server_weights): the file path writes
  the trainer's tensors as one safetensors file in a folder the engine owns, then
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": folder}}` (vLLM's in-place
  reload on every worker of the server, tensor-parallel ones included) and `POST /reset_prefix_cache` (the
  cached prefixes were computed under the old weights); the NCCL path (CUDA, split Ray pools) posts
  `/init_weight_transfer_engine` once, then `/start_weight_update`, one `/update_weights` per bucket while train
  rank 0 broadcasts it, `/finish_weight_update` and `/reset_prefix_cache`;
- an abort: `POST /abort_requests` (every request in flight ends with `finish_reason="abort"` and the tokens
  sampled so far).

`VLLMServerStreamer` is the StreamingEngine over it (flowrl.engines.streaming.protocol), so a Router
(flowrl.engines.service.router) routes over server replicas as over in-process ones. `pause` stops new requests
here and waits until none is in flight (`abort=True` aborts them first: each keeps its prefix and continues,
after `resume`, from prompt + prefix with the budget left); so no request runs across a weight update and every
token's version is the one it was sent under.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Iterable

import torch
from pydantic import Field
from safetensors.torch import save_file
from tensordict import TensorDict

from flowrl.data.batch import right_pad
from flowrl.engines.configs import ModelSource
from flowrl.engines.vllm.process import CPU_SERVER_ARGS, check_head_dim
from flowrl.engines.vllm.replica_config import VLLMReplicaConfig
from flowrl.engines.hf.rollout import responses
from flowrl.engines.protocols import FinishReason, SamplingParams, TrainEngine, WeightSync
from flowrl.engines.streaming.protocol import Request, Sample
from flowrl.engines.vllm.server_weights import Transfer, free_port, server_args, transfer_for
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S
from flowrl.engines.weights.in_process import StreamedSync
from flowrl.engines.service.orphan_guard import guarded

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}


class VLLMServerConfig(VLLMReplicaConfig):
    """A replica that is a vLLM OpenAI server process (see the module docstring)."""

    STREAMER: ClassVar[str] = "vllm_server"
    RANK_SPANS_GPUS: ClassVar[bool] = True  # a pool of N GPUs: N / tensor_parallel_size servers, one a rank
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt + response; None: the model's.")
    kv_cache_gb: float = Field(1.0, gt=0, description="KV cache of the server in GiB (on CPU VLLM_CPU_KVCACHE_SPACE).")
    block_size: int | None = Field(None, ge=1, description="Tokens per KV-cache block; None: vLLM's default.")
    start_timeout_s: float = Field(600.0, gt=0, description="Deadline of the server's start-up (until /health).")
    request_timeout_s: float = Field(600.0, gt=0, description="Deadline of one HTTP call to the server.")
    server_args: list[str] = Field(default_factory=list, description="More `vllm serve` arguments, as given.")
    concurrent_requests: int = Field(1024, ge=1, description="Requests this process keeps in flight to the server "
                                     "at once (vLLM runs up to its max_num_seqs of them and queues the rest). At 32 "
                                     "a 512-row generate ran in 16 waves: 47 s against the in-process engine's 8 s "
                                     "(64x8, 256 tokens, H100, 2026-12-07).")
    weight_transfer: Transfer = Field("auto", description="How a weight update reaches the server: 'file' (a "
                                      "safetensors file and vLLM's reload_weights; any device), 'nccl' (vLLM's NCCL "
                                      "weight transfer from train rank 0, CUDA and split Ray pools; elsewhere the "
                                      "file), 'auto': nccl on CUDA, file on CPU.")

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> "VLLMServerEngine":
        return VLLMServerEngine(source, tokenizer, device=device, config=self)


class VLLMServerEngine:
    """A RolloutEngine over one vLLM server process it starts and stops."""

    def __init__(self, source: ModelSource, tokenizer: Any, *, device: str, config: VLLMServerConfig):
        check_head_dim(source.path, device.startswith("cuda"))  # one line here, not an HTTP 500 at the first request
        self.config, self.tp_ranks = config, 1  # one pool rank drives the server; its TP workers are vLLM's
        self.transfer = transfer_for(config.weight_transfer, device)
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.folder = Path(tempfile.mkdtemp(prefix="flowrl-vllm-server-"))  # its log and the weights it reloads
        self.log = (self.folder / "server.log").open("wb")
        # the threads of the HTTP calls in flight, generate's and the streamer's (urllib blocks: one call a thread)
        self.requests = ThreadPoolExecutor(config.concurrent_requests, thread_name_prefix="flowrl-vllm-server")
        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        if not device.startswith("cuda"):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(config.kv_cache_gb)))
        # behind the orphan guard: the server's group ends with this process, even one killed before close()
        command = guarded(server_command(source, config, self.port, device) + server_args(self.transfer))
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited {self.process.returncode} while starting: "
                                   f"{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the vLLM server did not start within roles.rollout.start_timeout_s="
                           f"{self.config.start_timeout_s:g} (its log: {self.folder / 'server.log'})")

    def tail(self) -> str:
        lines = (self.folder / "server.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:])[-600:]

    def post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(f"{self.url}{route}", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.config.request_timeout_s) as reply:
                text = reply.read()
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"vLLM server {route}: HTTP {err.code}: {err.read()[:300]!r}") from None
        return json.loads(text) if text else {}

    def complete(self, prompt_ids: list[int], params: SamplingParams, seed: int | None) -> tuple[list, list, str]:
        """One completion: (token ids, the sampler's logprob of each, vLLM's finish_reason)."""
        body = {"model": "flowrl", "prompt": prompt_ids, "max_tokens": params.max_new_tokens, "logprobs": 0,
                "return_token_ids": True, "temperature": 0.0 if params.greedy else params.temperature,
                "top_p": params.top_p, "ignore_eos": params.ignore_eos, "skip_special_tokens": False}
        if params.top_k:
            body["top_k"] = params.top_k
        if seed is not None:
            body["seed"] = seed
        choice = self.post("/v1/completions", body)["choices"][0]
        return list(choice["token_ids"]), list(choice["logprobs"]["token_logprobs"]), choice["finish_reason"]

    def generate(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, params: SamplingParams,
                 *, seed: int | None = None) -> TensorDict:
        """Each row one request (seed + row when seeded), all at once; the output as the in-process engines'."""
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids_BP.cpu(), prompt_mask_BP.cpu())]
        seeds = [None if seed is None else seed + row for row in range(len(prompts))]
        outs = list(self.requests.map(lambda a: self.complete(a[0], params, a[1]), zip(prompts, seeds)))
        ids_BR, _ = right_pad([out[0] for out in outs], self.pad_id)
        logprobs_BR, _ = right_pad([out[1] for out in outs], 0.0, torch.float32)
        return responses(ids_BR, logprobs_BR, self.eos_id, self.pad_id, prompt_ids_BP.device)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        self.load_weight_stream(state_dict.items())

    def load_weight_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """The tensors into the server through vLLM's reload_weights (see the module docstring)."""
        tensors, seen = {}, set()
        for name, tensor in named_tensors:
            tensor = tensor.detach().to("cpu").contiguous()
            tensors[name] = tensor.clone() if tensor.data_ptr() in seen else tensor  # tied: safetensors stores each
            seen.add(tensor.data_ptr())
        weights = self.folder / "weights"
        weights.mkdir(exist_ok=True)
        save_file(tensors, str(weights / "model.safetensors"))  # the engine's own file, rewritten each update
        self.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights)}})
        self.post("/reset_prefix_cache", {})
        return sum(t.numel() * t.element_size() for t in tensors.values())

    @property
    def nccl_workers(self) -> int:
        """The workers of this server in vLLM's NCCL weight-transfer group (its tensor-parallel size); 0 on the
        file path."""
        return self.config.tensor_parallel_size if self.transfer == "nccl" else 0

    def init_weight_transfer(self, info: dict) -> None:
        self.post("/init_weight_transfer_engine", {"init_info": info})

    def start_weight_update(self) -> None:
        self.post("/start_weight_update", {})

    def update_weights(self, info: dict) -> None:
        self.post("/update_weights", {"update_info": info})

    def finish_weight_update(self) -> None:
        """Ends an NCCL update: vLLM finalizes the reload; the cached prefixes go, as on the file path."""
        self.post("/finish_weight_update", {})
        self.post("/reset_prefix_cache", {})

    def weight_sync(self, train: TrainEngine, timeout_s: float = SYNC_TIMEOUT_S) -> WeightSync:
        """The trainer `train` shares this process (no GPU of its own for vLLM's NCCL group): the file path (one
        HTTP call to the server, under request_timeout_s; `timeout_s` bounds transfers between ranks, of which
        there are none here)."""
        if self.config.weight_transfer == "nccl":
            warnings.warn("roles.rollout.weight_transfer=nccl has no effect here: the trainer shares the rollout's "
                          "process, so its weights reach the server through a file (NCCL needs split Ray pools)",
                          stacklevel=2)
        return StreamedSync()

    def close(self) -> None:
        """Stops the server's process group (SIGTERM, then SIGKILL after 30 s) and removes the weights file it
        wrote (its log stays, for a failed start's error names it)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
        self.log.close()
        self.requests.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self.folder / "weights", ignore_errors=True)


def server_command(source: ModelSource, config: VLLMServerConfig, port: int, device: str) -> list[str]:
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(source.path),
               "--served-model-name", "flowrl", "--host", "127.0.0.1", "--port", str(port), "--dtype", source.dtype,
               "--seed", "0", "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
               "--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.enforce_eager:
        command.append("--enforce-eager")
    if not device.startswith("cuda"):
        command += CPU_SERVER_ARGS
    if config.max_model_len:
        command += ["--max-model-len", str(config.max_model_len)]
    if config.block_size:
        command += ["--block-size", str(config.block_size)]
    return command + list(config.server_args)



class VLLMServerStreamer:
    """A StreamingEngine over a VLLMServerEngine (see the module docstring)."""

    def __init__(self, engine: VLLMServerEngine, *, version: int = 0, pause_timeout_s: float = 600.0):
        self.engine, self.version, self.pause_timeout_s = engine, version, pause_timeout_s
        self.lock = threading.Lock()  # pause and sample may run on different threads' event loops
        self.paused, self.in_flight = False, 0

    async def sample(self, request: Request) -> Sample:
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        aborts = 0
        while True:
            version = await self.enter()
            budget = request.params.max_new_tokens - len(ids)
            seed = None if request.seed is None else request.seed + len(ids)
            params = SamplingParams(**{**vars(request.params), "max_new_tokens": budget})
            try:
                got, got_logprobs, finish = await asyncio.get_running_loop().run_in_executor(
                    self.engine.requests, self.engine.complete, list(request.prompt_ids) + ids, params, seed)
            finally:
                with self.lock:
                    self.in_flight -= 1
            ids, logprobs, versions = ids + got, logprobs + got_logprobs, versions + [version] * len(got)
            if finish != "abort" or len(ids) >= request.params.max_new_tokens:
                reason = FINISH.get(finish, FinishReason.LENGTH)
                return Sample(request, ids, logprobs, versions, reason, aborts)
            aborts += 1

    async def enter(self) -> int:
        """Waits while paused, then counts one request in flight; the version it runs under."""
        while True:
            with self.lock:
                if not self.paused:
                    self.in_flight += 1
                    return self.version
            await asyncio.sleep(0.01)

    async def pause(self, abort: bool = False) -> None:
        with self.lock:
            self.paused = True
        deadline = time.monotonic() + self.pause_timeout_s
        while self.in_flight:
            if abort:
                await asyncio.to_thread(self.engine.post, "/abort_requests", {})
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.in_flight} requests still in flight on the vLLM server after "
                                   f"{self.pause_timeout_s:g} s of pause")
            await asyncio.sleep(0.05)

    def resume(self, version: int) -> None:
        with self.lock:
            self.version, self.paused = version, False

    def close(self) -> None:
        self.engine.close()
