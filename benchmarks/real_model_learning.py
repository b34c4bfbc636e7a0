"""A real model learns: GRPO (or another prebuilt algorithm) on an imported SmolLM2-135M-Instruct, arithmetic
word problems, greedy test accuracy every --eval-every steps (docs/real_model.md).

    flowrl model import SmolLM2-135M-Instruct.Q4_1.gguf --output models/smollm2
    flowrl data wordproblems --output data/wordproblems
    python benchmarks/real_model_learning.py --model models/smollm2 --data data/wordproblems \
        --output runs/smollm2_grpo --device cuda
    python benchmarks/plot_learning.py runs/smollm2_grpo --output docs/real_model_learning.png

The run is `flowrl train` with the options below (each a `--set` the docs can repeat): the prompts go
through the model's chat template, the training reward is --reward (by default gsm8k_format: the strict gsm8k scorer, with 0.1 for a wrong
`#### n`), the evaluation is strict (`data.val_reward=gsm8k`: the last `#### n`, no format credit), and the
first --eval-prompts test rows are decoded greedily at step 0 and every --eval-every steps
(`eval/openai/gsm8k/greedy` in OUTPUT/metrics.jsonl). OUTPUT/wall_clock.jsonl holds each step's seconds
since the start (wall_s) and the steps' own seconds so far (train_s: start-up, evaluation and saving left out,
as benchmarks/real_model_trl.py counts TRL's); at the end the exported model (OUTPUT/final) is re-scored strict and flexible by
benchmarks/real_model_eval.py (OUTPUT/final_score.json), and a table of the run is printed.
`--device cpu --steps 2 --tiny` (a 2-layer random Llama with the model's tokenizer and chat template in
place of its weights) and small batches are a smoke test of the same path in a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from real_model_eval import greedy_accuracy  # noqa: E402

from flowrl.config import load_run_config  # noqa: E402
from flowrl.runtime.trainer import train  # noqa: E402

ACCURACY = "eval/openai/gsm8k/greedy"


def tiny_copy(model: str, folder: Path) -> Path:
    """A 2-layer, width-32 random Llama at `folder` with `model`'s tokenizer and chat template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from flowrl.engines.models.folders import load_tokenizer

    tokenizer = load_tokenizer(model)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_options(args: argparse.Namespace) -> list[str]:
    """The `--set` values of the run."""
    data = Path(args.data)
    cuda = args.device == "cuda"
    return [f"algorithm={args.algorithm}", f"model.path={args.model}", f"train.device={args.device}",
            f"model.dtype={'bfloat16' if cuda else 'float32'}", "task.chat_template=true",
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            f"roles.rollout.engine={args.rollout_engine or ('hf_static' if cuda else 'hf')}",
            f"roles.rollout.max_new_tokens={args.max_new_tokens}", f"roles.rollout.temperature={args.temperature}",
            f"data.reward={args.reward}", "data.val_reward=gsm8k", f"train.steps={args.steps}",
            f"train.batch_size={args.batch_size}", f"algo.group_size={args.group_size}",
            f"roles.actor.mini_batch_size={args.mini_batch_size}",
            f"roles.actor.micro_batch_size={args.micro_batch_size}",
            f"roles.actor.lr={args.lr}", f"roles.actor.warmup_steps={args.warmup_steps}",
            f"eval.every={args.eval_every}", f"eval.prompts={args.eval_prompts}",
            f"checkpoint.every={args.steps}", "checkpoint.export=true", "train.loggers=console,jsonl",
            f"train.output_dir={args.output}", f"train.seed={args.seed}", *args.set]


def table(output: Path) -> str:
    """step | reward/mean | greedy test accuracy | seconds since the start, from the run's files."""
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    wall = {r["step"]: r["wall_s"] for r in map(json.loads, (output / "wall_clock.jsonl").read_text().splitlines())}
    lines = ["| step | reward/mean | greedy test accuracy (strict) | wall s |", "|---:|---:|---:|---:|"]
    for r in rows:
        reward = f"{r['reward/mean']:.3f}" if "reward/mean" in r else "-"
        accuracy = f"{r[ACCURACY]:.3f}" if ACCURACY in r else "-"
        lines.append(f"| {r['step']} | {reward} | {accuracy} | {wall.get(r['step'], 0.0):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="flowrl model import's output folder")
    parser.add_argument("--data", required=True, help="flowrl data wordproblems' output folder")
    parser.add_argument("--output", required=True, help="the run's folder (metrics.jsonl, final/, ...)")
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rollout-engine", help="default: hf_static on cuda, hf on cpu")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--mini-batch-size", type=int, default=256, help="responses per optimizer step")
    parser.add_argument("--micro-batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the rollouts")
    parser.add_argument("--reward", default="gsm8k_format", help="data.reward: the training reward (the "
                        "evaluation is always the strict gsm8k accuracy); gsm8k_format adds verl's 0.1 for a "
                        "wrong `#### n`: strict alone gave 0.2%% of samples a reward and no learning in 60 steps")
    parser.add_argument("--lr", type=float, default=1e-5, help="untuned: a first guess for 135M parameters")
    parser.add_argument("--warmup-steps", type=int, default=4, help="in optimizer steps")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-prompts", type=int, default=200, help="the first this many test rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other run option")
    parser.add_argument("--tiny", action="store_true", help="a smoke test: a tiny random model in place of "
                                                              "--model's weights (its tokenizer kept)")
    parser.add_argument("--no-rescore", action="store_true", help="skip re-scoring the exported model")
    args = parser.parse_args()

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        args.model = str(tiny_copy(args.model, output / "tiny_model"))
    cfg = load_run_config(None, run_options(args))
    (output / "wall_clock.jsonl").write_text(json.dumps({"step": 0, "wall_s": 0.0, "train_s": 0.0}) + "\n")
    start = time.perf_counter()
    train_s = [0.0]  # the steps' own seconds (timing_s/step): start-up, evaluation and saving left out

    def on_step(step: int, logged: dict) -> None:
        train_s[0] += logged.get("timing_s/step", 0.0)
        with open(output / "wall_clock.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "wall_s": round(time.perf_counter() - start, 2),
                                "train_s": round(train_s[0], 2)}) + "\n")

    train(cfg, progress=True, on_step=on_step)
    print(table(output))
    if not args.no_rescore:
        score = greedy_accuracy(str(output / "final"), str(Path(args.data) / "test.parquet"), args.eval_prompts,
                                args.max_new_tokens, args.micro_batch_size, args.device,
                                "bfloat16" if args.device == "cuda" else "float32")
        (output / "final_score.json").write_text(json.dumps(score) + "\n")
        print(f"exported model re-scored: {json.dumps(score)}")


if __name__ == "__main__":
    main()
