"""`grpo_vs_trl.py`'s flowrl runner: flowrl's GRPO on the workload, its node timings, rollout tok/s, update
MFU, memory and the sampler-vs-trainer logprob gap (`exactness`); `--profile`'s update or generate under the
profilers."""

from __future__ import annotations

import cProfile
import json
import pstats
import tempfile
import time

import torch

import bench_workload
from bench_workload import PEAK_FLOPS, BenchTask, Workload, mean_or_none, sync
from common import alias_algorithms

EOS_ID = 1  # common.full_vocab_tokenizer's "<eos>"


def flowrl_config(wl: Workload, path: str, out: str):
    from flowrl.config import load_run_config

    sets = [f"model.path={path}", f"model.dtype={wl.dtype_name}", f"train.device={wl.device}",
            f"train.batch_size={wl.prompts}", f"algo.group_size={wl.group}", f"algo.kl_coef={wl.kl_coef}",
            f"roles.rollout.max_new_tokens={wl.new_tokens}", f"roles.actor.mini_batch_size={wl.rows}",
            f"roles.actor.micro_batch_size={wl.micro}", f"roles.actor.lr={wl.lr}", "eval.every=0", "checkpoint.every=0",
            "checkpoint.export=false", "checkpoint.resume=false", f"train.output_dir={out}", *wl.flowrl_sets]
    if wl.variable and wl.flowrl_engine() == "hf_static":
        sets.append("roles.rollout.engine=hf_static_lengths")  # eos at the drawn lengths
    if wl.variable and wl.flowrl_engine() == "vllm":  # the logits processor masks eos before the drawn length
        return load_run_config(None, sets)
    try:
        return load_run_config(None, ["roles.rollout.ignore_eos=true", *sets])
    except ValueError as err:
        if "ignore_eos" not in str(err):
            raise
        print(f"WARNING flowrl: rollout.ignore_eos refused ({err}); responses may stop at EOS", flush=True)
        return load_run_config(None, sets)


def run_flowrl(wl: Workload, path: str) -> dict:
    alias_algorithms()
    from flowrl.algorithms.grpo import grpo
    from flowrl.runtime.trainer import setup

    from flowrl.engines import device_peak

    device_peak.restart()  # torch's count less what a sleeping vLLM unmapped, from this system's start
    with tempfile.TemporaryDirectory() as out:
        s = setup(flowrl_config(wl, path, out), algo=grpo, task=BenchTask(wl.prompt_len))
        try:
            engine, times, logged, peaks = s.executor.roles["actor"].engine, [], [], []
            for step in range(wl.warmup + wl.steps):
                if step == wl.warmup + wl.steps - 1:  # the weights that sample the last batch, for exactness()
                    sampler = {k: v.to("cpu", copy=True) for k, v in engine.model.state_dict().items()}
                start = time.perf_counter()
                batch, metrics = s.executor.run_step(step, s.stream)
                sync(wl.device)
                times.append(time.perf_counter() - start)
                logged.append(metrics)
                peaks.append(device_peak.run_peak_gib() if wl.device == "cuda" else 0.0)
                if step == 0:
                    now = time.perf_counter()
                    first_step_s, first_step_item_s = now - bench_workload.START, now - bench_workload.ITEM_START
                print(f"flowrl step {step}: {times[-1]:.3f} s " + json.dumps(
                    {k: round(v, 4) for k, v in metrics.items()
                     if k.split("/")[0] in ("timing_s", "memory", "sync") or k.startswith("rollout/decode_s")}),
                    flush=True)
            if wl.profile:  # more steps, untimed: the update or the rollout's generate under the profilers
                profiled = engine if wl.profile == "update" else s.executor.roles["rollout"].engine
                for extra, python in enumerate((False, True) if wl.profile == "generate" else (False,)):
                    profile_call(profiled, wl.profile, lambda: s.executor.run_step(wl.warmup + wl.steps + extra,
                                                                                   s.stream), wl.device, python)
            num_params = sum(p.numel() for p in engine.model.parameters())
            engine.model.load_state_dict(sampler)
            result = {"s_per_step": mean_or_none(times[wl.warmup:]), **exactness(engine, batch, wl.micro),
                      "rollout": s.cfg.rollout.model_dump(), "first_step_s_since_start": first_step_s,
                      "first_step_s_since_item": first_step_item_s,
                      "step_s": times, "step_peak_gib": max(peaks),
                      "cfg_rollout_engine": s.cfg.rollout.engine}
        finally:
            s.executor.close()
    return {**result, **flowrl_rates(wl, logged[wl.warmup:], batch, num_params)}


def profile_call(engine, method: str, run_step, device: str, python: bool = False) -> None:
    """Runs a step with the engine's `method` (update, generate) under torch's profiler; prints the call's wall
    time, the device's busy time (kernels, summed) and the kernels and CPU ops that took longest: where the time
    goes. `python`: under cProfile instead, the Python functions that took longest themselves (a CPU-bound
    call, such as an in-process vLLM's scheduling and output processing, shows there)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call, spans = getattr(engine, method), []

    def profiled(*args, **kwargs):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with cProfile.Profile() if python else profile(activities=activities) as prof:
            start = time.perf_counter()
            out = call(*args, **kwargs)
            sync(device)
            spans.append((time.perf_counter() - start, prof))
        return out

    setattr(engine, method, profiled)
    try:
        run_step()
    finally:
        setattr(engine, method, call)
    for wall, prof in spans:
        if python:
            print(f"PROFILE {method} (cProfile): {wall:.3f} s wall", flush=True)
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
            continue
        events = prof.key_averages()
        # the kernels' own time: an op's self device time counts its kernels again
        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6

        print(f"PROFILE {method}: {wall:.3f} s wall, device busy {busy:.3f} s", flush=True)
        for key in (("self_device_time_total",) if device == "cuda" else ()) + ("self_cpu_time_total",):
            print(events.table(sort_by=key, row_limit=15, max_name_column_width=70), flush=True)


def flowrl_rates(wl: Workload, timed: list[dict], batch, num_params: int) -> dict:
    """Mean node timings; rollout tok/s and update MFU from them."""
    keys = sorted({k for m in timed for k in m if k.startswith("timing_s/")})
    timing = {k.removeprefix("timing_s/"): mean_or_none([m[k] for m in timed if k in m]) for k in keys}

    def maxima(prefix: str) -> dict[str, float]:
        keys = sorted({k for m in timed for k in m if k.startswith(prefix)})
        return {k.removeprefix(prefix): max(m[k] for m in timed if k in m) for k in keys}

    response_tokens = int(batch["response_mask"].sum())
    update_tokens = response_tokens + int(batch["prompt_mask"].sum())
    generate_s, update_s = timing.get("rollout.generate"), timing.get("actor.update")
    mfu = 6 * num_params * update_tokens / update_s / PEAK_FLOPS if update_s and wl.device == "cuda" else None
    return {"timing_s": timing, "memory_max": maxima("memory/"), "sync_max": maxima("sync/"),
            "prompt_width": int(batch["prompt_ids"].shape[1]),
            "response_tokens": response_tokens, "update_tokens": update_tokens, "num_params": num_params,
            "rollout_tok_s": response_tokens / generate_s if generate_s else None, "update_mfu": mfu}


def exactness(engine, batch, micro: int) -> dict:
    """The train engine's logprobs of the sampled tokens vs the sampler's, over the response mask (the engine
    holding the weights that sampled `batch`)."""
    if "rollout_logprobs" not in batch.keys():
        return {"logprob_diff": "batch has no rollout_logprobs"}
    logprobs = engine.forward(batch, micro_batch_size=micro)["logprobs"]
    lengths_B1 = batch["response_mask"].sum(-1, keepdim=True)
    is_last = lengths_B1 - 1 == torch.arange(batch["response_mask"].shape[1], device=lengths_B1.device)
    mask = batch["response_mask"].bool() & ~(is_last & (batch["response_ids"] == EOS_ID))  # forced: logprob 0
    diff = (logprobs.float() - batch["rollout_logprobs"].float()).abs()[mask]
    return {"logprob_diff_mean": diff.mean().item(), "logprob_diff_max": diff.max().item(),
            "logprob_diff_tokens": int(mask.sum())}

