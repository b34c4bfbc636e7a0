"""verl 0.9.1 on what benchmarks/real_model_learning.py gives flowrl (issue 46, point 3): the same SmolLM2 model
folder, word problems (flowrl data wordproblems' train/test.parquet are already verl's schema), chat-template
prompts, group, batch, token budget, optimizer settings and reward, with verl's own validation (greedy, its
val_kwargs) every --eval-every steps, on the first --eval-prompts test rows (flowrl's), as the strict test
accuracy. NOT RUN YET on the GPU (the leases ran out before it; its overrides, data and reward pass
benchmarks/real_model_verl_preflight.py in verl's packages on the CPU); it writes OUTPUT/metrics.jsonl in the
keys benchmarks/plot_learning.py reads, so one plot shows both:

    python benchmarks/real_model_verl.py --model /tmp/smollm2 --data /tmp/wp --output /tmp/runs/verl_grpo
    python benchmarks/plot_learning.py /tmp/runs/grpo /tmp/runs/verl_grpo --x wall --output docs/real_model_vs_verl.png

Needs verl's packages first on PYTHONPATH (VERL_SITE, benchmarks/verl_carry.sh) and vllm (verl_chain.sh's C).
benchmarks/real_model_verl_preflight.py checks its overrides, data and reward in verl's packages on the CPU.
The training reward (`reward_fn` below) is verl's strict gsm8k scorer with 0.1 for a wrong `#### n`, as
flowrl's gsm8k_format; its "acc" (strict, no format credit) is what verl's validation reports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ACCURACY, REWARD = "eval/openai/gsm8k/greedy", "reward/mean"  # plot_learning.py's keys
FIRST_TEST = "test_first.parquet"  # the test rows both systems evaluate (first_test_rows)


def reward_fn(data_source, solution_str, ground_truth, extra_info=None, **_):
    """Strict gsm8k (the last `#### n`) with 0.1 for a wrong answer in the format; acc: strict alone."""
    from verl.utils.reward_score import gsm8k

    score = gsm8k.compute_score(solution_str, ground_truth, method="strict", format_score=0.1, score=1.0)
    return {"score": score, "acc": float(score == 1.0)}


def overrides(args) -> list[str]:
    a = "actor_rollout_ref"
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={args.data}/train.parquet", f"data.val_files={args.output}/{FIRST_TEST}",
        f"data.train_batch_size={args.batch_size}",
        "data.max_prompt_length=256", f"data.max_response_length={args.max_new_tokens}",
        "data.filter_overlong_prompts=True", "data.dataloader_num_workers=0",
        f"{a}.model.path={args.model}", f"+{a}.model.override_config.attn_implementation=sdpa",
        f"{a}.model.use_remove_padding=False", f"{a}.model.enable_gradient_checkpointing=False",
        f"{a}.model.use_fused_kernels=True", f"{a}.model.fused_kernel_options.impl_backend=torch",
        f"{a}.actor.optim.lr={args.lr}", f"{a}.actor.optim.lr_warmup_steps={args.warmup_steps}",
        f"{a}.actor.ppo_mini_batch_size={args.mini_batch_size // args.group_size}",
        f"{a}.actor.use_dynamic_bsz=True", f"{a}.actor.use_kl_loss=True", f"{a}.actor.kl_loss_coef=0.001",
        f"{a}.actor.kl_loss_type=low_var_kl", f"{a}.actor.entropy_coeff=0",
        f"{a}.rollout.name=vllm", f"{a}.rollout.tensor_model_parallel_size=1", f"{a}.rollout.n={args.group_size}",
        f"{a}.rollout.temperature={args.temperature}", f"{a}.rollout.gpu_memory_utilization=0.4",
        f"{a}.rollout.enforce_eager=False", f"{a}.rollout.free_cache_engine=True",
        f"{a}.rollout.log_prob_use_dynamic_bsz=True", f"{a}.ref.log_prob_use_dynamic_bsz=True",
        f"reward.custom_reward_function.path={Path(__file__).resolve()}", "reward.custom_reward_function.name=reward_fn",
        "trainer.logger=[console,file]", "trainer.project_name=flowrl_learning", "trainer.experiment_name=verl",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.val_before_train=True",
        f"trainer.test_freq={args.eval_every}", "trainer.save_freq=-1", f"trainer.total_training_steps={args.steps}",
        "trainer.total_epochs=100", f"trainer.default_local_dir={args.output}/ckpt", "trainer.resume_mode=disable",
        *args.set,
    ]


def first_test_rows(args) -> Path:
    """The first --eval-prompts rows of the test parquet, the rows flowrl's evaluation reads
    (benchmarks/real_model_learning.py): verl's data.val_max_samples would draw that many at random."""
    import pyarrow.parquet as pq

    out = args.output / FIRST_TEST
    table = pq.read_table(Path(args.data) / "test.parquet")
    pq.write_table(table.slice(0, min(args.eval_prompts, table.num_rows)), out)
    return out


def to_metrics(raw: Path, walls: dict[int, float], out: Path) -> None:
    """verl's file-logger lines as plot_learning.py's rows: step, reward/mean, the strict accuracy where
    validated, train_s (verl's timing_s/step summed) and wall_s (since the start, validation included)."""
    rows, train_s = [], 0.0
    for line in raw.read_text().splitlines():
        step, data = json.loads(line)["step"], json.loads(line)["data"]
        train_s += data.get("timing_s/step", 0.0)
        row = {"step": step, "train_s": train_s, "wall_s": walls.get(step)}
        if "critic/score/mean" in data:
            row[REWARD] = data["critic/score/mean"]
        acc = [v for k, v in data.items() if k.startswith("val-core/") and "/acc/" in k]
        if acc:
            row[ACCURACY] = acc[0]
        rows.append(row)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))


def parser() -> argparse.ArgumentParser:
    """The command line (benchmarks/real_model_verl_preflight.py reads its defaults)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--output", required=True, type=Path)
    for flag, default in (("steps", 60), ("batch-size", 64), ("group-size", 8), ("mini-batch-size", 256),
                          ("max-new-tokens", 256), ("warmup-steps", 4), ("eval-every", 5), ("eval-prompts", 200)):
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another hydra override")
    p.add_argument("--deadline", type=float, default=3000, help="seconds before verl's processes are killed")
    return p


def main() -> None:
    args = parser().parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    first_test_rows(args)
    raw = args.output / "verl_metrics.jsonl"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(raw), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([os.environ.get("VERL_SITE", "/tmp/vsite"), os.environ.get("PYTHONPATH", "")])}
    start, walls = time.perf_counter(), {}
    with open(args.output / "verl.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo", *overrides(args)], env=env,
                                cwd=args.output, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None and time.perf_counter() - start < args.deadline:
                if raw.exists():
                    for line in raw.read_text().splitlines():
                        walls.setdefault(json.loads(line)["step"], time.perf_counter() - start)
                time.sleep(0.5)
        finally:  # verl's trainer, Ray and vLLM's processes, at the deadline or on an error here
            if proc.poll() is None:
                print(f"verl: killed after {args.deadline:.0f} s", flush=True)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    to_metrics(raw, walls, args.output / "metrics.jsonl")
    print(f"verl exited {proc.returncode}; {args.output}/metrics.jsonl")


if __name__ == "__main__":
    main()
