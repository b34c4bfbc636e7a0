"""roles.teacher.engine=vllm: a frozen model served by vLLM in this process that scores sampled rows, the
distillation teacher's top-k (verl's teacher, verl/experimental/teacher_loop/teacher_manager.py).

Each row's prompt and response tokens go in as one prompt, asked with `max_tokens=1` and
`prompt_logprobs=K`: vLLM's prefill gives every position's logprob of the next token and its K largest
logprobs (verl's `_get_teacher_sampling_params` and `extract_prompt_logprobs`). flowrl asks them flat
(vLLM's FlatLogprobs): each position holds K + 1 entries, the token itself first, then ranks 1..K; so a
tie at the K-th rank reads as vLLM's torch.topk ordered it.

vLLM computes prompt logprobs before any sampling processor (its model runner's `_get_prompt_logprobs_dict`:
"prompt tokens skip sampling processors"): they are the teacher's own distribution at temperature 1,
untruncated, whatever the request's temperature (verl's teacher always asks temperature 1). The HF teacher
scores each row under the distribution it was sampled with (flowrl.engines.sampling); rows sampled
otherwise are refused here in one line rather than scored under another distribution than the HF engine's.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any, Callable, ClassVar

import torch
from pydantic import ConfigDict, Field
from tensordict import TensorDict

from flowrl.data.scoring.pool import call_with_deadline
from flowrl.engines import memory
from flowrl.engines.configs import Head, ModelSource, TrainEngineConfig
from flowrl.engines.memory import ModelShape, RankLoad
from flowrl.engines.protocols import TrainEngine
from flowrl.engines.train.model_outputs import TOPK_IDS, TOPK_LOGPROBS, check_outputs, default_outputs
from flowrl.engines.vllm.process import GIB, flat_logprobs_option
from flowrl.engines.vllm.process import INSTALL, check_head_dim

try:
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.logprobs import FlatLogprobs
except ImportError as err:  # flowrl.engines.vllm.rollout names the fixes; this module imports it first
    raise ImportError(f"vllm is not installed: {INSTALL}", name="vllm") from err


class VLLMTeacherConfig(TrainEngineConfig):
    """`roles.teacher.engine=vllm`: the teacher's model in vLLM, scoring only (a frozen role's engine)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)
    SECTION: ClassVar[str | None] = "teacher"
    max_logprobs: int = Field(256, ge=1, description="Largest top-k one request may ask (vLLM's max_logprobs; "
                              "algo.topk must not exceed it).")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="Share of GPU memory this vLLM may take "
                                          "for weights and KV cache (the student's engines share the GPU).")
    kv_cache_gb: float | None = Field(None, gt=0, description="KV cache size in GiB; None: what "
                                      "gpu_memory_utilization leaves on CUDA, 1 GiB on CPU.")
    enforce_eager: bool = Field(True, description="No CUDA graphs or torch.compile: starts in seconds.")
    max_num_seqs: int = Field(256, ge=1, description="Most sequences vLLM scores at once.")
    block_size: int | None = Field(None, ge=1, description="Tokens per KV-cache block; None: vLLM's default.")
    start_timeout_s: float = Field(600.0, gt=0, description="Deadline of vLLM's start-up; past it the run "
                                   "stops with one line.")

    def build(self, source: ModelSource, *, head: Head, device: str, trainable: bool = True,
              base_of: TrainEngine | None = None) -> "VLLMTeacherEngine":
        if trainable or head != "actor":
            raise ValueError("engine=vllm scores with a frozen model (roles.teacher.engine=vllm); a trained or "
                             "value/reward role needs a train engine such as hf")
        return VLLMTeacherEngine(source, device=device, config=self)

    def closer(self, engine: TrainEngine) -> Callable[[], None]:
        return engine.close

    def estimate_memory(self, shape: ModelShape, load: RankLoad, *, trainable: bool = True,
                        base_lent: bool = False) -> dict[str, int]:
        """Its own whole copy of the weights and the KV cache of its rows at full length."""
        return {"weights": shape.weight_bytes, "kv_cache": memory.kv_cache(shape, load)}


class VLLMTeacherEngine:
    """One vLLM engine; `forward` scores each row as one request (no weights train or sync)."""

    def __init__(self, source: ModelSource, *, device: str, config: VLLMTeacherConfig):
        cuda = device.startswith("cuda")
        check_head_dim(source.path, cuda)
        self.config, self.closed = config, False
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process, as the rollout's
        kv_gb = config.kv_cache_gb or (None if cuda else 1.0)
        kwargs = dict(model=str(source.path), dtype=source.dtype, seed=0, generation_config="vllm",
                      max_logprobs=config.max_logprobs, enforce_eager=config.enforce_eager,
                      gpu_memory_utilization=config.gpu_memory_utilization, block_size=config.block_size,
                      kv_cache_memory_bytes=None if kv_gb is None else int(kv_gb * GIB),
                      max_num_seqs=config.max_num_seqs)
        device_index = torch.cuda.current_device() if cuda else None

        def start() -> Any:  # on the caller's CUDA device: the current device is per thread
            if device_index is not None:
                torch.cuda.set_device(device_index)
            return vllm.LLM(**kwargs)

        self.llm = call_with_deadline(start, (), config.start_timeout_s, "vLLM's start-up",
                                      timed_out=f"the teacher's vLLM did not start within {config.start_timeout_s:g}"
                                                f" s (roles.teacher.start_timeout_s)")
        atexit.register(close_at_exit, weakref.ref(self))

    @torch.no_grad()
    def forward(self, batch: TensorDict, *, temperature: float = 1.0, micro_batch_size: int = 8,
                outputs: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
        """The teacher's logprob of each response token and, named in `outputs`, its top-k logprobs and ids
        ([B, R] and [B, R, K], 0 on padding), on the device of batch["prompt_ids"]; `micro_batch_size` has no
        effect (vLLM schedules the rows itself)."""
        names, k = self._checked(batch, temperature, outputs)
        rows = [_row_tokens(batch, i) for i in range(batch.batch_size[0])]
        params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=k, detokenize=False,
                                     **flat_logprobs_option(vllm.SamplingParams))
        results = self.llm.generate([TokensPrompt(prompt_token_ids=p + r) for p, r, _ in rows], params,
                                    use_tqdm=False)
        width = batch["response_ids"].shape[1]
        logprobs_BR = torch.zeros(len(rows), width)
        top_BRK, ids_BRK = torch.zeros(len(rows), width, max(k, 1)), torch.zeros(len(rows), width, max(k, 1),
                                                                                  dtype=torch.long)
        for i, ((prompt, _, columns), result) in enumerate(zip(rows, results)):
            token, top, ids = _prompt_logprobs(result.prompt_logprobs, len(prompt), len(columns), k)
            logprobs_BR[i, columns], top_BRK[i, columns], ids_BRK[i, columns] = token, top, ids
        home = batch["prompt_ids"].device
        out = {"logprobs": logprobs_BR, f"{TOPK_LOGPROBS}:{k}": top_BRK, f"{TOPK_IDS}:{k}": ids_BRK}
        return {name: out[name].to(home) for name in names}

    def _checked(self, batch: TensorDict, temperature: float,
                 outputs: tuple[str, ...] | None) -> tuple[tuple[str, ...], int]:
        """The output names and their top-k (0: none); one line for what this engine cannot give."""
        names = check_outputs("actor", outputs or default_outputs("actor"))
        ks = {int(name.partition(":")[2]) for name in names if name.partition(":")[0] in (TOPK_LOGPROBS, TOPK_IDS)}
        other = [name for name in names if name != "logprobs" and name.partition(":")[0] not in (TOPK_LOGPROBS,
                                                                                                   TOPK_IDS)]
        if other or len(ks) > 1:
            raise ValueError(f"outputs: the vLLM teacher gives 'logprobs' and one 'topk_logprobs:K'/'topk_ids:K', "
                             f"not {other or sorted(names)}")
        k = ks.pop() if ks else 0
        if k > self.config.max_logprobs:
            raise ValueError(f"algo.topk={k} exceeds roles.teacher.max_logprobs={self.config.max_logprobs}")
        _check_plain_sampling(batch, temperature)
        return names, k

    def close(self) -> None:
        """Shuts the in-process vLLM engine down now (once; also at the interpreter's exit), so a later garbage
        collection does not tear down vLLM state under another engine (flowrl.engines.vllm.rollout.close)."""
        if not self.closed:
            self.closed = True
            self.llm.llm_engine.engine_core.shutdown()


def close_at_exit(engine: "weakref.ref[VLLMTeacherEngine]") -> None:
    if (alive := engine()) is not None:
        alive.close()


def _check_plain_sampling(batch: TensorDict, temperature: float) -> None:
    """vLLM's prompt logprobs are at temperature 1, untruncated: rows sampled otherwise are refused."""
    if "sample_temperature" not in batch.keys():
        plain = temperature == 1.0
    else:
        plain = bool((batch["sample_temperature"] == 1.0).all() and (batch["sample_top_k"] == 0).all()
                     and (batch["sample_top_p"] == 1.0).all())
    if not plain:
        raise ValueError("roles.teacher.engine=vllm scores under the teacher's own distribution (temperature 1, "
                         "no top-k/top-p: vLLM's prompt logprobs skip its sampler), but these rows were sampled "
                         "otherwise; sample with roles.rollout.temperature=1, top_k=0, top_p=1, or use "
                         "roles.teacher.engine=hf")


def _row_tokens(batch: TensorDict, i: int) -> tuple[list[int], list[int], torch.Tensor]:
    """(the row's prompt tokens, its response tokens, the response columns they sit in): the real tokens
    of each mask, in order, as the HF engine packs them (flowrl.engines.train.model_inputs.packed_inputs)."""
    prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
    columns = batch["response_mask"][i].bool().nonzero().squeeze(-1).cpu()
    return prompt, batch["response_ids"][i][columns].tolist(), columns


def _prompt_logprobs(flat: Any, num_prompt: int, num_response: int,
                     k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([R] logprob of each response token, [R, K] top-k logprobs, [R, K] their ids) from a request's flat
    prompt logprobs, whose position j (j >= 1; position 0 is None) predicts prompt token j: token first,
    then ranks 1..K."""
    if not isinstance(flat, FlatLogprobs):  # asked by flat_logprobs_option
        raise ValueError("this vLLM returns no flat prompt logprobs; install the vLLM flowrl pins (vllm==0.33)")
    token, top, ids = torch.zeros(num_response), torch.zeros(num_response, max(k, 1)), \
        torch.zeros(num_response, max(k, 1), dtype=torch.long)
    for t in range(num_response):
        start, end = flat.start_indices[num_prompt + t], flat.end_indices[num_prompt + t]
        assert end - start == k + 1, (start, end, k)
        token[t] = flat.logprobs[start]
        if k:
            top[t] = torch.tensor(flat.logprobs[start + 1:end])
            ids[t] = torch.tensor(flat.token_ids[start + 1:end])
    return token, top, ids
