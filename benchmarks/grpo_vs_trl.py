"""A GRPO step four ways on one card: flowrl, TRL's GRPOTrainer without and with vLLM (colocated), a
hand-written loop.

Workload (shared/PERF_NOTES.md): the Qwen2.5-0.5B shape with random weights (bf16 on CUDA), sdpa; 64 prompts
of 128 tokens x 8 samples = 512 rows of up to 256 new tokens at temperature 1; k3 KL to the reference (coef
0.001); one AdamW step per batch. `--lengths fixed`: EOS suppressed, every response runs to the cap;
`--lengths variable`: each row ends with EOS at a length drawn from a log-normal (median cap / 4, --sigma,
capped at the cap), the same draws for every system (benchmarks/forced_lengths.py). Prints seconds per step
of each system (mean over --steps steps after --warmup), useful tokens (response tokens through EOS) per
second of step, flowrl's rollout tok/s, update MFU, sync/sleep timings, memory and sampler-vs-trainer logprob
gap, peak GPU memory and the ratios; each system also as one `RESULT {json}` line (and appended to --jsonl).
Systems that hold a vLLM engine need a process each (one sleep-mode vLLM per process): run them one
--systems at a time and combine with --report. Usage (flowrl need not be pip-installed; run from anywhere):
  python benchmarks/grpo_vs_trl.py --device cuda [--steps 3] [--lengths variable] [--jsonl runs.jsonl]
  python benchmarks/grpo_vs_trl.py --systems trl_vllm --jsonl runs.jsonl; python benchmarks/grpo_vs_trl.py \
      --report runs.jsonl
  python benchmarks/grpo_vs_trl.py --device cpu --small --steps 1
  python benchmarks/grpo_vs_trl.py --systems flowrl --grid 16x8:256,64x8:256,16x8:1024,64x8:1024 --jsonl runs.jsonl
(--grid: one process, each PROMPTSxGROUP:NEW_TOKENS item in turn, each system on each; benchmarks/bench_grid.py)
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import string
import sys
import tempfile
import time
import traceback
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import bench_grid  # noqa: E402
import forced_lengths  # noqa: E402
from common import QWEN05B, SMALL, alias_algorithms, qwen_model  # noqa: E402

START = time.perf_counter()  # the process's start, for the time to the first finished step
ITEM_START = START  # the current workload's start in main's loop (--grid: each item's)

PEAK_FLOPS, PEAK_NAME = 989e12, "H100/H200 SXM dense bf16"
FULL_RUN = dict(prompts=64, group=8, new_tokens=256, micro=32)
SMALL_RUN = dict(prompts=4, group=2, new_tokens=8, micro=4)
SYSTEMS = ("flowrl", "trl", "trl_vllm", "plain")
FAST_SETS = ("roles.rollout.engine=hf_static", "roles.actor.compile=true", "train.forward_micro_batch_size=128")
"""The flowrl options of the H200 runs (docs/benchmarks.md); `train.device=cuda` alone picks them
(flowrl.engines.hf_configs.CUDA_DEFAULTS, tests/test_cuda_defaults.py)."""
EOS_ID = 1  # common.full_vocab_tokenizer's "<eos>"


@dataclass
class Workload:
    device: str
    prompts: int
    group: int
    new_tokens: int
    prompt_len: int
    micro: int
    steps: int
    warmup: int
    lr: float
    kl_coef: float
    lengths: str = "fixed"
    sigma: float = 1.0
    profile: bool = False
    flowrl_sets: list[str] = field(default_factory=list)
    shape: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def dtype_name(self) -> str:
        return "bfloat16" if self.device == "cuda" else "float32"

    @property
    def variable(self) -> bool:
        return self.lengths == "variable"

    def draws(self) -> list[int]:
        """Every row's drawn length, in generation order (twice what the steps take: a margin)."""
        return forced_lengths.draw_lengths(2 * self.rows * (self.warmup + self.steps), self.new_tokens, self.sigma)

    def useful_tokens(self) -> float:
        """Mean response tokens (EOS included) per timed step."""
        if not self.variable:
            return float(self.rows * self.new_tokens)
        draws = self.draws()[self.warmup * self.rows:(self.warmup + self.steps) * self.rows]
        return sum(draws) / self.steps

    def flowrl_engine(self) -> str:
        from flowrl.engines.hf_configs import CUDA_DEFAULTS

        engines = [s.split("=", 1)[1] for s in self.flowrl_sets if s.startswith("roles.rollout.engine=")]
        # unset: train.device=cuda picks hf_static (CUDA_DEFAULTS); the H200 grid of 2026-12-04 left it unset, so
        # its variable-length flowrl rows ran without the drawn lengths (every response to the cap)
        return engines[-1] if engines else (CUDA_DEFAULTS["roles.rollout.engine"] if self.device == "cuda" else "")


class BenchTask:
    """Prompts of exactly `prompt_len` characters (= tokens: the tokenizer is char-level); the reward is a hash
    of the response, so it varies within each group and advantages are not all zero."""

    meta_keys = ("target",)
    chars = string.ascii_lowercase

    def __init__(self, prompt_len: int = 128):
        self.prompt_len = prompt_len

    def example(self, seed: int, index: int) -> tuple[str, dict]:
        rng = random.Random(seed * 1_000_003 + index)
        text = "".join(rng.choice(self.chars) for _ in range(self.prompt_len))
        return text, {"target": text[0]}

    def reward(self, responses: list[str], meta: list[dict]) -> list[float]:
        return [zlib.crc32(f"{m['target']}{r}".encode()) % 1000 / 1000 for r, m in zip(responses, meta)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def mean_or_none(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None


# ---- flowrl -------------------------------------------------------------------------------------------------

def flowrl_config(wl: Workload, path: str, out: str):
    from flowrl.config import load_run_config

    sets = [f"model.path={path}", f"model.dtype={wl.dtype_name}", f"train.device={wl.device}",
            f"train.batch_size={wl.prompts}", f"algo.group_size={wl.group}", f"algo.kl_coef={wl.kl_coef}",
            f"roles.rollout.max_new_tokens={wl.new_tokens}", f"train.mini_batch_size={wl.rows}",
            f"train.micro_batch_size={wl.micro}", f"roles.actor.lr={wl.lr}", "train.eval_every=0", "train.save_every=0",
            "train.export=false", "train.resume=false", f"train.output_dir={out}", *wl.flowrl_sets]
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
                peaks.append(torch.cuda.max_memory_allocated() / 2**30 if wl.device == "cuda" else 0.0)
                if step == 0:
                    now = time.perf_counter()
                    first_step_s, first_step_item_s = now - START, now - ITEM_START
                print(f"flowrl step {step}: {times[-1]:.3f} s " + json.dumps(
                    {k: round(v, 4) for k, v in metrics.items()
                     if k.split("/")[0] in ("timing_s", "memory") or k.startswith("rollout/decode_s")}),
                    flush=True)
            if wl.profile:  # one more step, untimed, its update under the profiler
                profile_update(engine, lambda: s.executor.run_step(wl.warmup + wl.steps, s.stream), wl.device)
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


def profile_update(engine, run_step, device: str) -> None:
    """Runs a step with the engine's update under torch's profiler; prints the update's wall time, the device's
    busy time (kernels, summed) and the kernels and CPU ops that took longest: where an update's time goes."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    update, spans = engine.update, []

    def profiled(*args, **kwargs):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            out = update(*args, **kwargs)
            sync(device)
            spans.append((time.perf_counter() - start, prof))
        return out

    engine.update = profiled
    try:
        run_step()
    finally:
        engine.update = update
    for wall, prof in spans:
        events = prof.key_averages()
        # the kernels' own time: an op's self device time counts its kernels again
        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6

        print(f"PROFILE update: {wall:.3f} s wall, device busy {busy:.3f} s", flush=True)
        for key in (("self_device_time_total",) if device == "cuda" else ()) + ("self_cpu_time_total",):
            print(events.table(sort_by=key, row_limit=15, max_name_column_width=70), flush=True)


def flowrl_rates(wl: Workload, timed: list[dict], batch, num_params: int) -> dict:
    """Mean node timings; rollout tok/s and update MFU from them."""
    keys = sorted({k for m in timed for k in m if k.startswith("timing_s/")})
    timing = {k.removeprefix("timing_s/"): mean_or_none([m[k] for m in timed if k in m]) for k in keys}
    memory = {k.removeprefix("memory/"): max(m[k] for m in timed if k in m)
              for k in sorted({k for m in timed for k in m if k.startswith("memory/")})}
    response_tokens = int(batch["response_mask"].sum())
    update_tokens = response_tokens + int(batch["prompt_mask"].sum())
    generate_s, update_s = timing.get("rollout.generate"), timing.get("actor.update")
    mfu = 6 * num_params * update_tokens / update_s / PEAK_FLOPS if update_s and wl.device == "cuda" else None
    return {"timing_s": timing, "memory_max": memory, "prompt_width": int(batch["prompt_ids"].shape[1]),
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


# ---- TRL ----------------------------------------------------------------------------------------------------

def step_timer(device: str):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall-clock marks at the start and after every optimizer step (one step = one generation batch)."""

        def __init__(self):
            self.marks: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            sync(device)
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            sync(device)
            self.marks.append(time.perf_counter())

    return StepTimer()


def trl_args(wl: Workload, out: str, vllm: bool):
    """TRL's defaults but for the workload; with `vllm`, its colocated engine as TRL documents it (vLLM's own
    defaults: CUDA graphs, gpu_memory_utilization 0.3, no sleep mode)."""
    from trl import GRPOConfig

    cuda = wl.device == "cuda"
    if wl.variable:
        generation_kwargs = {}  # the drawn lengths' logits processors hold eos back (forced_lengths)
    else:
        generation_kwargs = {"min_tokens" if vllm else "min_new_tokens": wl.new_tokens}
    return GRPOConfig(
        output_dir=out, per_device_train_batch_size=wl.micro, gradient_accumulation_steps=wl.rows // wl.micro,
        num_generations=wl.group, max_completion_length=wl.new_tokens, num_iterations=1, beta=wl.kl_coef,
        generation_kwargs=generation_kwargs, temperature=1.0, top_p=1.0, top_k=0,
        epsilon=0.2, loss_type="dapo", scale_rewards="group", learning_rate=wl.lr, lr_scheduler_type="constant",
        max_grad_norm=1.0, max_steps=wl.warmup + wl.steps, gradient_checkpointing=False, bf16=cuda,
        use_cpu=not cuda, model_init_kwargs={"dtype": wl.dtype_name, "attn_implementation": "sdpa"},
        use_vllm=vllm, **(dict(vllm_mode="colocate") if vllm else {}), logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
        shuffle_dataset=False, dataloader_num_workers=0, seed=0)


def run_trl(wl: Workload, path: str, vllm: bool = False) -> dict:
    from datasets import Dataset
    from trl import GRPOTrainer

    from flowrl.engines.hf_models import load_tokenizer

    task = BenchTask(wl.prompt_len)
    examples = [task.example(0, i) for i in range(wl.prompts * (wl.warmup + wl.steps))]
    data = Dataset.from_dict({"prompt": [text for text, _ in examples],
                              "target": [meta["target"] for _, meta in examples]})

    def bench_reward(prompts, completions, target, **_):
        return task.reward(completions, [{"target": t} for t in target])

    timer = step_timer(wl.device)
    with tempfile.TemporaryDirectory() as out:
        model = path
        if wl.variable and not vllm:  # transformers generate: eos at the drawn lengths
            model = forced_lengths.ForcedLengthQwen2.from_pretrained(path, dtype=getattr(torch, wl.dtype_name),
                                                                    attn_implementation="sdpa")
        trainer = GRPOTrainer(model=model, reward_funcs=bench_reward, args=trl_args(wl, out, vllm),
                              train_dataset=data, processing_class=load_tokenizer(path), callbacks=[timer])
        trainer.train()
        if vllm:
            trainer.vllm_generation.llm.llm_engine.engine_core.shutdown()
    intervals = [b - a for a, b in zip(timer.marks, timer.marks[1:])]
    return {"s_per_step": mean_or_none(intervals[wl.warmup:]), "steps_timed": len(intervals[wl.warmup:]),
            "step_s": intervals, "first_step_s_since_start": timer.marks[1] - START if len(timer.marks) > 1
            else None, "first_step_s_since_item": timer.marks[1] - ITEM_START if len(timer.marks) > 1 else None}


def run_trl_vllm(wl: Workload, path: str) -> dict:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, as flowrl's engine runs
    return run_trl(wl, path, vllm=True)


# ---- plain transformers loop --------------------------------------------------------------------------------

def token_logprobs(model, seq_BT: torch.Tensor, num_response: int) -> torch.Tensor:
    logits = model(input_ids=seq_BT, logits_to_keep=num_response + 1).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, seq_BT[:, -num_response:, None]).squeeze(-1)


class PlainLoop:
    """The hand-written baseline: one generate call for all rows, score, group-normalise, reference logprobs,
    clipped policy loss + k3 KL, one AdamW step. EOS is suppressed, so every row is full length and needs no
    response mask."""

    def __init__(self, wl: Workload, path: str):
        from transformers import AutoModelForCausalLM, GenerationConfig

        from flowrl.engines.hf_models import load_tokenizer

        dtype = getattr(torch, wl.dtype_name)
        load = lambda: AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")  # noqa: E731
        self.wl, self.policy, self.ref = wl, load().to(wl.device), load().to(wl.device).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=wl.lr)
        self.tokenizer, self.task = load_tokenizer(path), BenchTask(wl.prompt_len)
        self.gen = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=wl.new_tokens,
                                    min_new_tokens=wl.new_tokens, eos_token_id=self.tokenizer.eos_token_id,
                                    pad_token_id=self.tokenizer.pad_token_id)

    @torch.no_grad()
    def rollout(self, examples: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(prompt + response ids, advantages [B, 1], reference logprobs of the response [B, R])."""
        wl = self.wl
        texts = [text for text, _ in examples for _ in range(wl.group)]
        meta = [m for _, m in examples for _ in range(wl.group)]
        ids = self.tokenizer(texts, return_tensors="pt", add_special_tokens=False)["input_ids"].to(wl.device)
        self.policy.eval()
        seq = self.policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=self.gen)
        rewards = self.task.reward(self.tokenizer.batch_decode(seq[:, ids.shape[1]:]), meta)
        grouped = torch.tensor(rewards, device=wl.device).view(-1, wl.group)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        num_response = seq.shape[1] - ids.shape[1]
        ref_lp = torch.cat([token_logprobs(self.ref, mb, num_response) for mb in seq.split(wl.micro)])
        return seq, adv, ref_lp

    def step(self, examples: list) -> None:
        seq, adv, ref_lp = self.rollout(examples)
        num_rows, num_response = ref_lp.shape
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        for rows in torch.arange(num_rows, device=seq.device).split(self.wl.micro):
            lp = token_logprobs(self.policy, seq[rows], num_response)
            ratio = torch.exp(lp - lp.detach())
            pg = torch.maximum(-adv[rows] * ratio, -adv[rows] * ratio.clamp(0.8, 1.2))
            delta = ref_lp[rows] - lp
            loss = pg + self.wl.kl_coef * (torch.exp(delta) - delta - 1)
            (loss.sum() / (num_rows * num_response)).backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
        self.optimizer.step()


def run_plain(wl: Workload, path: str) -> dict:
    if wl.variable:
        raise ValueError("the plain loop runs the fixed workload only")
    loop, times = PlainLoop(wl, path), []
    for step in range(wl.warmup + wl.steps):
        examples = [loop.task.example(0, step * wl.prompts + i) for i in range(wl.prompts)]
        start = time.perf_counter()
        loop.step(examples)
        sync(wl.device)
        times.append(time.perf_counter() - start)
    return {"s_per_step": mean_or_none(times[wl.warmup:])}


# ---- driver -------------------------------------------------------------------------------------------------

RUNNERS = {"flowrl": run_flowrl, "trl": run_trl, "trl_vllm": run_trl_vllm, "plain": run_plain}


def measured(name: str, wl: Workload, path: str, draws_from: int = 0) -> dict:
    """One system's result (or its error), with peak GPU memory; frees what it held before the next.
    `draws_from`: the process's draw counter at the workload's start (--grid: the item's first draw)."""
    gc.collect()
    if wl.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    print(f"--- running {name}", flush=True)
    try:
        result = RUNNERS[name](wl, path)
    except Exception as err:  # report the failing system and go on with the others
        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err}"}
    gc.collect()
    if wl.device == "cuda":
        result["peak_gib"] = max(torch.cuda.max_memory_allocated() / 2**30, result.get("step_peak_gib", 0.0),
                                 *[v for k, v in result.get("memory_max", {}).items() if k.startswith("peak_gib")])
        torch.cuda.empty_cache()
        result["left_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
    if wl.variable:  # rows that took a draw in this workload so far (expected: rows x steps per system)
        result["draws_taken"] = forced_lengths.process_draws().next - draws_from
    if result.get("s_per_step"):
        result["useful_tokens_per_step"] = wl.useful_tokens()
        result["useful_tok_per_step_s"] = wl.useful_tokens() / result["s_per_step"]
    return result


def fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def report_flowrl(r: dict) -> None:
    t = r["timing_s"]
    print(f"        rollout {fmt(r['rollout_tok_s'], ',.0f')} tok/s ({r['response_tokens']} tokens in "
          f"{fmt(t.get('rollout.generate'), '.3f')} s); update {fmt(t.get('actor.update'), '.3f')} s, MFU "
          f"{fmt(r['update_mfu'], '.1%')} (6 x {r['num_params'] / 1e6:.1f}M params x {r['update_tokens']} tokens "
          f"/ {PEAK_NAME} {PEAK_FLOPS / 1e12:.0f} TFLOP/s); prompt width {r['prompt_width']}")
    print("        timing_s: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))
    print(f"        memory (max over steps): {r.get('memory_max')}; first step done "
          f"{fmt(r.get('first_step_s_since_start'), '.1f')} s after the process started")
    print(f"        rollout config: {r['rollout']}")
    print(f"        logprobs trainer vs sampler: mean |diff| {fmt(r.get('logprob_diff_mean'), '.2e')}, max "
          f"{fmt(r.get('logprob_diff_max'), '.2e')} over {r.get('logprob_diff_tokens')} tokens "
          f"{r.get('logprob_diff', '')}")


def report(results: dict) -> dict:
    """Prints each system's line and the ratios (other system's s/step over flowrl's); returns the ratios."""
    for name, r in results.items():
        if "error" in r:
            print(f"{name:7s} FAILED: {r['error']}")
            continue
        print(f"{name:8s} {fmt(r['s_per_step'], '.3f')} s/step  peak {fmt(r.get('peak_gib'), '.1f')} GiB  "
              f"useful {fmt(r.get('useful_tok_per_step_s'), ',.0f')} tok/s of step")
        if name.startswith("flowrl"):
            report_flowrl(r)
    ok = {n: r["s_per_step"] for n, r in results.items() if r.get("s_per_step")}
    ratios = {f"{other}/{mine}": ok[other] / ok[mine] for mine in ok if mine.startswith("flowrl")
              for other in ("trl", "trl_vllm", "plain") if other in ok}
    for key, ratio in ratios.items():
        print(f"GRPO step {key}: {ratio:.2f}x")
    return ratios


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="tiny model and batch, for a CPU smoke run")
    for flag in ("prompts", "group", "new-tokens", "micro"):
        p.add_argument(f"--{flag}", type=int, help=f"default {FULL_RUN[flag.replace('-', '_')]} "
                                                   f"({SMALL_RUN[flag.replace('-', '_')]} with --small)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed steps per system")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--lr", type=float, default=1e-7, help="AdamW learning rate (all systems)")
    p.add_argument("--kl-coef", type=float, default=0.001)
    p.add_argument("--lengths", choices=("fixed", "variable"), default="fixed",
                   help="fixed: EOS suppressed, all rows run to the cap; variable: EOS at log-normal drawn lengths")
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the variable lengths")
    p.add_argument("--profile", action="store_true", help="flowrl: one more step after the timed ones, its "
                                                          "update under torch's profiler (printed tables)")
    p.add_argument("--label", default="", help="suffix of flowrl's name in the results (flowrl-LABEL)")
    p.add_argument("--flowrl-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra flowrl config override, e.g. roles.rollout.micro_batch_size=512 (repeatable)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", help="write the results here")
    p.add_argument("--jsonl", help="append one line per system here")
    p.add_argument("--grid", help="PROMPTSxGROUP:NEW_TOKENS,... (e.g. 16x8:256,64x8:1024): run every system "
                                  "on each of these sizes in turn, in this one process (micro capped at the rows)")
    p.add_argument("--report", help="print the ratios of the systems in this JSONL file (one workload each) "
                                    "and exit")
    return p.parse_args()


def workload(args: argparse.Namespace, item: dict | None = None) -> Workload:
    """The workload of the options, with a --grid item's sizes in place of --prompts/--group/--new-tokens."""
    preset = SMALL_RUN if args.small else FULL_RUN
    sizes = {k: getattr(args, k) or v for k, v in preset.items()} | (item or {})
    wl = Workload(device=args.device, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, lr=args.lr,
                  kl_coef=args.kl_coef, lengths=args.lengths, sigma=args.sigma, profile=args.profile,
                  flowrl_sets=args.flowrl_set,
                  shape=SMALL if args.small else QWEN05B, **sizes)
    wl.micro = min(wl.micro, wl.rows)
    if wl.steps < 1 or wl.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    if wl.rows % wl.micro:
        raise SystemExit(f"--micro {wl.micro} must divide prompts x group = {wl.rows}"
                         + (f" (--grid item {wl.prompts}x{wl.group}:{wl.new_tokens})" if item else ""))
    return wl


def report_file(path: str) -> None:
    """The ratios per workload of the RESULT lines in a JSONL file."""
    workloads: dict[str, dict] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        wl = row["workload"]
        key = f"{wl['prompts']}x{wl['group']}, {wl['new_tokens']} new, {wl['lengths']}"
        workloads.setdefault(key, {})[row["system"]] = row["result"]
    for key, results in workloads.items():
        print(f"=== {key}")
        report(results)


def setup_lengths(wl: Workload, draws: list[int], systems: list[str], folder: str) -> None:
    """The variable workload's draws for this process (--grid: all items'), and the hooks that apply them."""
    forced_lengths.write_draws(draws, folder)
    forced_lengths.register_flowrl_engine()
    if "trl_vllm" in systems or ("flowrl" in systems and wl.flowrl_engine() == "vllm"):
        forced_lengths.install_vllm_plugin(folder + "/plugin")


def run_item(wl: Workload, systems: list[str], path: str, span: tuple[int, int], args, card: str) -> dict:
    """Every system on one workload (--grid: one item, its draws `span` of the process's), a RESULT line each."""
    global ITEM_START
    ITEM_START = time.perf_counter()
    print(f"workload: {wl.shape} {wl.dtype_name} on {card}; {wl.prompts} prompts x {wl.group} = {wl.rows} rows, "
          f"{wl.prompt_len} prompt + {wl.new_tokens} new tokens; micro-batch {wl.micro}; lr {wl.lr}; "
          f"{wl.steps} timed steps after {wl.warmup} warm-up; {wl.lengths} lengths", flush=True)
    if wl.variable:
        bench_grid.start_item(span)
    results = {}
    for name in systems:
        key = f"{name}-{args.label}" if args.label and name == "flowrl" else name
        results[key] = measured(name, wl, path, draws_from=span[0])
        line = {"system": key, "workload": asdict(wl), "device_name": card, "result": results[key]}
        print("RESULT " + json.dumps(line), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(line) + "\n")
    return results


def main() -> None:
    args = parse_args()
    if args.report:
        return report_file(args.report)
    if args.grid and (args.prompts or args.group or args.new_tokens):
        raise SystemExit("--grid gives each item's prompts, group and new tokens: drop --prompts/--group/--new-tokens")
    workloads = [workload(args, item) for item in bench_grid.parse_grid(args.grid)] if args.grid else [workload(args)]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(RUNNERS):
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {list(RUNNERS)}")
    transformers.utils.logging.disable_progress_bar()
    first = workloads[0]
    bench_grid.warn_vllm(len(workloads), systems, first.flowrl_engine())
    card = torch.cuda.get_device_name() if first.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        draws, spans = bench_grid.draw_layout(workloads) if first.variable else ([], [(0, 0)] * len(workloads))
        if first.variable:
            setup_lengths(first, draws, systems, tmp)
        max_positions = max(1536, first.prompt_len + max(wl.new_tokens for wl in workloads))
        path = qwen_model(tmp + "/model", BenchTask.chars, first.shape, max_positions, getattr(torch, first.dtype_name))
        runs = [(wl, run_item(wl, systems, path, span, args, card)) for wl, span in zip(workloads, spans)]
    summaries = []
    for wl, results in runs:
        print(f"=== results: {wl.prompts}x{wl.group}, {wl.new_tokens} new, {wl.lengths}")
        summaries.append({"workload": asdict(wl), "device_name": card, "results": results, "ratios": report(results)})
    if args.json:
        Path(args.json).write_text(json.dumps(summaries if args.grid else summaries[0], indent=2))


if __name__ == "__main__":
    main()
