"""TRL's GRPOTrainer on what benchmarks/real_model_learning.py gives flowrl: the same model folder, word
problems, chat-template prompts, reward (--reward), group size, token budget and optimizer settings, with
the greedy test accuracy every --eval-every steps (docs/real_model.md, section 6).

    python benchmarks/real_model_trl.py --model models/smollm2 --data data/wordproblems --output runs/smollm2_trl
    python benchmarks/plot_learning.py runs/smollm2_grpo runs/smollm2_trl --x train \
        --output docs/real_model_vs_trl.png

A step is one generation batch (--batch-size prompts x --group-size responses), as in flowrl: TRL takes
--mini-batch-size responses per optimizer step (micro-batches of --micro-batch-size, gradient accumulation),
so one step is batch*group/mini optimizer steps, as flowrl's roles.actor.mini_batch_size gives. The evaluation is
benchmarks/real_model_eval.greedy_responses (transformers' generate) on the trainer's own model; its time is
left out of `train_s`, the clock that flowrl's `timing_s/step` sums (real_model_learning.py), so neither
system is charged for evaluating. OUTPUT/metrics.jsonl holds, per step: reward/mean, the accuracy where
evaluated, train_s and wall_s (since the trainer's start, evaluation included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402

from real_model_eval import greedy_responses  # noqa: E402

from flowrl.data.dataset import load_rows  # noqa: E402
from flowrl.data.scoring.scorers import gsm8k, gsm8k_flexible, resolve  # noqa: E402
from flowrl.engines.models.folders import load_tokenizer  # noqa: E402

ACCURACY = "eval/openai/gsm8k/greedy"  # the key flowrl logs, so plot_learning.py reads both runs alike


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Evaluator:
    """Strict and flexible greedy accuracy on the test rows, with the model the trainer is training."""

    def __init__(self, rows: list[dict], tokenizer, max_new_tokens: int, batch_size: int):
        self.rows, self.tokenizer = rows, tokenizer
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size

    def __call__(self, model) -> dict[str, float]:
        was_training = model.training
        model.eval()
        ids = greedy_responses(model, self.tokenizer, [r["prompt"] for r in self.rows], self.max_new_tokens,
                               self.batch_size)
        model.train(was_training)
        texts = [self.tokenizer.decode(row) for row in ids]
        pairs = list(zip(self.rows, texts))
        return {ACCURACY: sum(gsm8k(r["data_source"], t, r["ground_truth"]) for r, t in pairs) / len(pairs),
                "eval/flexible": sum(gsm8k_flexible(r["data_source"], t, r["ground_truth"]) for r, t in pairs)
                / len(pairs)}


def callback(args: argparse.Namespace, evaluate: Evaluator, rewards: list[float], output: Path):
    """Writes one metrics row per generation batch; evaluates at step 0 and every --eval-every steps."""
    from transformers import TrainerCallback

    per_step = args.batch_size * args.group_size // args.mini_batch_size  # optimizer steps per generation

    class Progress(TrainerCallback):
        def __init__(self):
            self.start = self.eval_s = 0.0

        def _row(self, step: int, model) -> dict:
            row = {"step": step}
            if step % args.eval_every == 0 or step == args.steps:
                sync(args.device)
                begin = time.perf_counter()
                row.update(evaluate(model))
                sync(args.device)
                self.eval_s += time.perf_counter() - begin
            now = time.perf_counter() - self.start
            row.update(wall_s=round(now, 2), train_s=round(now - self.eval_s, 2))
            if rewards and step:
                row["reward/mean"] = rewards[-1]
            with open(output / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
            return row

        def on_train_begin(self, targs, state, control, model=None, **kwargs):
            sync(args.device)
            self.start = time.perf_counter()
            self._row(0, model)

        def on_step_end(self, targs, state, control, model=None, **kwargs):
            if state.global_step % per_step == 0:
                sync(args.device)
                self._row(state.global_step // per_step, model)

    return Progress()


def trl_config(args: argparse.Namespace, output: Path):
    from trl import GRPOConfig

    cuda = args.device == "cuda"
    rows = args.batch_size * args.group_size
    return GRPOConfig(
        output_dir=str(output / "trainer"), per_device_train_batch_size=args.micro_batch_size,
        gradient_accumulation_steps=args.mini_batch_size // args.micro_batch_size,
        steps_per_generation=rows // args.micro_batch_size,  # micro-steps: one generation feeds them all
        num_generations=args.group_size, max_completion_length=args.max_new_tokens, num_iterations=1,
        beta=args.kl_coef, epsilon=args.clip, loss_type="dapo", scale_rewards="group",
        temperature=args.temperature,
        top_p=1.0, top_k=0, learning_rate=args.lr, warmup_steps=args.warmup_steps, lr_scheduler_type="constant_with_warmup",
        weight_decay=0.0, max_grad_norm=1.0, max_steps=args.steps * rows // args.mini_batch_size,
        gradient_checkpointing=False, bf16=cuda, use_cpu=not cuda,
        model_init_kwargs={"dtype": "bfloat16" if cuda else "float32", "attn_implementation": "sdpa"},
        logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, seed=args.seed,
        dataloader_num_workers=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="flowrl model import's output folder")
    parser.add_argument("--data", required=True, help="flowrl data wordproblems' output folder")
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=30, help="generation batches")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--mini-batch-size", type=int, default=256, help="responses per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--reward", default="gsm8k_format", help="a flowrl scorer name (data.reward)")
    parser.add_argument("--warmup-steps", type=int, default=4, help="in optimizer steps")
    parser.add_argument("--clip", type=float, default=0.2, help="flowrl grpo's algo.clip")
    parser.add_argument("--kl-coef", type=float, default=0.001, help="flowrl grpo's algo.kl_coef (k3)")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-prompts", type=int, default=200)
    parser.add_argument("--eval-batch-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from datasets import Dataset
    from trl import GRPOTrainer

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.jsonl").write_text("")
    train_rows = load_rows([str(Path(args.data) / "train.parquet")], "--data")
    test_rows = load_rows([str(Path(args.data) / "test.parquet")], "--data")[:args.eval_prompts]
    data = Dataset.from_list([{"prompt": r["prompt"], "data_source": r["data_source"],
                               "ground_truth": r["ground_truth"]} for r in train_rows])
    rewards: list[float] = []

    score = resolve(args.reward)

    def scorer(prompts, completions, data_source, ground_truth, **_):
        scores = [float(score(s, c[-1]["content"], t)) for s, c, t in zip(data_source, completions, ground_truth)]
        rewards.append(sum(scores) / len(scores))
        return scores

    tokenizer = load_tokenizer(args.model)
    evaluate = Evaluator(test_rows, tokenizer, args.max_new_tokens, args.eval_batch_size)
    trainer = GRPOTrainer(model=args.model, reward_funcs=scorer, args=trl_config(args, output),
                          train_dataset=data, processing_class=tokenizer,
                          callbacks=[callback(args, evaluate, rewards, output)])
    trainer.train()


if __name__ == "__main__":
    main()
