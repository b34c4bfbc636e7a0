"""On-policy distillation on one GPU: SmolLM2-135M-Instruct teaches a smaller student built from its config
(fewer layers, random weights, its tokenizer and chat template); the teacher scores the student's samples in
vLLM (roles.teacher.engine=vllm: its top-k from prompt logprobs), and the student's KL to the teacher on its own
samples (`actor/distill_kl`) is printed as one JSON line per step and plotted over the run (docs/algorithms.md,
On-policy distillation).

    flowrl model import SmolLM2-135M-Instruct.Q4_1.gguf --output models/smollm2
    flowrl data wordproblems --output data/wordproblems
    python benchmarks/distill_gpu.py --teacher models/smollm2 --data data/wordproblems --output runs/distill
    # smoke test on CPU in a minute or two: a tiny teacher (a sharpened flowrl.engines.models.tiny_model, head_dim
    # 32 for vLLM's CPU kernels) and the arithmetic task (tests/test_distill_gpu_script.py runs it, 3 steps with
    # --teacher-engine hf; the vLLM teacher's CPU run is tests/test_distill_vllm.py's):
    #   --teacher tiny --device cpu --steps 4 --batch-size 8 --max-new-tokens 4 --topk 4 --lr 1e-2

The student is the teacher's config with --student-layers layers (seeded random init); the run is `flowrl train`
with algorithm=distill (the options below, each a `--set` the docs can repeat). Each step prints
{"step", "distill_kl", "teacher_mass", "step_s"}; the end prints {"first3", "last3", "last_over_first"} and writes
OUTPUT/distill_kl.png (flowrl plot's panels: the KL panel is the distillation KL). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from flowrl.config import load_run_config  # noqa: E402
from flowrl.runtime.observe.plotting import plot_runs  # noqa: E402
from flowrl.runtime.trainer import train  # noqa: E402

KL, MASS = "actor/distill_kl", "actor/distill_teacher_mass"


def tiny_teacher(folder: Path) -> Path:
    """The CPU smoke test's teacher: the arithmetic task's tiny model (head_dim 32, vLLM's CPU kernels have
    none below) with its final norm times 6, a sharp distribution the random student is far from."""
    import torch
    from transformers import AutoModelForCausalLM

    from flowrl.data.builtin.arithmetic import ArithmeticTask
    from flowrl.engines.models.folders import load_tokenizer
    from flowrl.engines.models.tiny_model import build_tiny_model

    base = build_tiny_model(folder / "base", chars=ArithmeticTask.chars, hidden_size=128, num_heads=4,
                            max_position_embeddings=128, seed=7)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    model.save_pretrained(folder / "teacher")
    load_tokenizer(base).save_pretrained(folder / "teacher")
    return folder / "teacher"


def student_from(teacher: str, folder: Path, layers: int, seed: int) -> Path:
    """A random model of the teacher's config with `layers` layers, its tokenizer beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from flowrl.engines.models.folders import load_tokenizer

    values = AutoConfig.from_pretrained(teacher).to_dict()
    values["num_hidden_layers"] = layers
    if values.get("layer_types"):  # one per layer (Qwen2's sliding-window list)
        values["layer_types"] = values["layer_types"][:layers]
    config = AutoConfig.for_model(**values)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    load_tokenizer(teacher).save_pretrained(folder)
    return folder


def run_options(args: argparse.Namespace, teacher: Path, student: Path) -> list[str]:
    cuda = args.device == "cuda"
    prompts = [] if args.data is None else ["task.chat_template=true",
                                            f"data.train_files={Path(args.data) / 'train.parquet'}"]
    vllm = [f"roles.teacher.gpu_memory_utilization={args.teacher_memory}" if cuda else
            "roles.teacher.kv_cache_gb=0.25"]
    return ["algorithm=distill", f"model.path={student}", f"roles.teacher.model={teacher}",
            f"roles.teacher.engine={args.teacher_engine}", *(vllm if args.teacher_engine == "vllm" else []),
            f"train.device={args.device}", f"model.dtype={'bfloat16' if cuda else 'float32'}", *prompts,
            f"roles.rollout.engine={args.rollout_engine or ('hf_static' if cuda else 'hf')}",
            f"roles.rollout.max_new_tokens={args.max_new_tokens}", f"roles.rollout.temperature={args.temperature}",
            f"algo.kind={args.kind}", f"algo.policy_gradient={str(args.policy_gradient).lower()}",
            *([f"algo.topk={args.topk}"] if args.kind.startswith("forward_kl_topk") else []),
            f"train.steps={args.steps}", f"train.batch_size={args.batch_size}",
            f"roles.actor.mini_batch_size={args.batch_size}", f"roles.actor.micro_batch_size={args.micro_batch_size}",
            f"roles.actor.lr={args.lr}", "eval.every=0", "checkpoint.every=0", "checkpoint.export=false",
            "train.loggers=jsonl", f"train.output_dir={args.output}", f"train.seed={args.seed}", *args.set]


def print_step(step: int, row: dict[str, float]) -> None:
    """One JSON line per step: the student's KL to the teacher on the step's own samples."""
    print(json.dumps({"step": step, "distill_kl": row.get(KL), "teacher_mass": row.get(MASS),
                      "step_s": row.get("timing_s/step")}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True, help="flowrl model import's output folder (SmolLM2), or "
                                                         "'tiny' (the CPU smoke test's)")
    parser.add_argument("--teacher-engine", default="vllm", choices=("vllm", "hf"), help="roles.teacher.engine")
    parser.add_argument("--teacher-memory", type=float, default=0.25, help="the vLLM teacher's "
                        "gpu_memory_utilization (the student's engines share the GPU)")
    parser.add_argument("--data", help="flowrl data wordproblems' output folder (its prompts); none: flowrl's "
                                       "arithmetic task (the smoke test with a tiny char-level teacher)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rollout-engine", help="default: hf_static on cuda, hf on cpu")
    parser.add_argument("--student-layers", type=int, help="default 8 (SmolLM2 has 30), 1 for the tiny teacher")
    parser.add_argument("--kind", default="forward_kl_topk", help="algo.kind (verl's advice: forward_kl_topk "
                        "without the policy gradient, k1 with it)")
    parser.add_argument("--topk", type=int, default=64, help="algo.topk: the teacher's tokens per position")
    parser.add_argument("--policy-gradient", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per step (one response each)")
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4, help="untuned: a random student learns fast early")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other run option")
    args = parser.parse_args()

    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    teacher = tiny_teacher(output / "tiny") if args.teacher == "tiny" else Path(args.teacher)
    layers = args.student_layers or (1 if args.teacher == "tiny" else 8)
    student = student_from(str(teacher), output / "student_init", layers, args.seed)
    history = train(load_run_config(None, run_options(args, teacher, student)), progress=False,
                    on_step=print_step)
    kl = [row[KL] for row in history if KL in row]
    try:
        plot_runs([str(output)], str(output / "distill_kl.png"))
    except ImportError:  # matplotlib is the plotting extra's
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
    head, tail = sum(kl[:3]) / len(kl[:3]), sum(kl[-3:]) / len(kl[-3:])
    print(json.dumps({"first3": head, "last3": tail, "last_over_first": tail / head}))


if __name__ == "__main__":
    main()
