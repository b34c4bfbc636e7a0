"""`grpo_vs_trl.py`'s baselines: TRL's GRPOTrainer without and with vLLM (`run_trl`, `run_trl_vllm`) and the
hand-written loop (`PlainLoop`, `run_plain`)."""

from __future__ import annotations

import os
import tempfile
import time

import torch

import bench_workload
import forced_lengths
from bench_workload import BenchTask, Workload, mean_or_none, sync

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

    from flowrl.engines.models.folders import load_tokenizer

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
    first = timer.marks[1] if len(timer.marks) > 1 else None  # the first step's end
    return {"s_per_step": mean_or_none(intervals[wl.warmup:]), "steps_timed": len(intervals[wl.warmup:]),
            "step_s": intervals, "first_step_s_since_start": None if first is None else first - bench_workload.START,
            "first_step_s_since_item": None if first is None else first - bench_workload.ITEM_START}


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

        from flowrl.engines.models.folders import load_tokenizer

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

