"""On-policy distillation on one GPU: SmolLM2-135M-Instruct teaches a smaller student built from its config
(fewer layers, random weights, its tokenizer and chat template), and the student's KL to the teacher on its own
samples (`actor/distill_kl`) is plotted over the run (docs/algorithms.md, On-policy distillation).

    flowrl model import SmolLM2-135M-Instruct.Q4_1.gguf --output models/smollm2
    flowrl data wordproblems --output data/wordproblems
    python benchmarks/distill_gpu.py --teacher models/smollm2 --data data/wordproblems --output runs/distill
    # smoke test on CPU in a minute, a tiny teacher (flowrl.engines.models.tiny_model) and the arithmetic task:
    #   --teacher TINY --device cpu --student-layers 1 --steps 3 --batch-size 4 --max-new-tokens 8 --lr 1e-2

The student is the teacher's LlamaConfig with --student-layers layers (seeded random init); the run is
`flowrl train` with algorithm=distill (the options below, each a `--set` the docs can repeat). At the end it
prints the first and last steps' KL and their ratio, and writes OUTPUT/distill_kl.png. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from flowrl.config import load_run_config  # noqa: E402
from flowrl.runtime.trainer import train  # noqa: E402

KL = "actor/distill_kl"


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


def run_options(args: argparse.Namespace, student: Path) -> list[str]:
    cuda = args.device == "cuda"
    prompts = [] if args.data is None else ["task.chat_template=true",
                                            f"data.train_files={Path(args.data) / 'train.parquet'}"]
    return ["algorithm=distill", f"model.path={student}", f"roles.teacher.model={args.teacher}",
            f"train.device={args.device}", f"model.dtype={'bfloat16' if cuda else 'float32'}", *prompts,
            f"roles.rollout.engine={args.rollout_engine or ('hf_static' if cuda else 'hf')}",
            f"roles.rollout.max_new_tokens={args.max_new_tokens}", f"roles.rollout.temperature={args.temperature}",
            f"algo.kind={args.kind}", f"algo.policy_gradient={str(args.policy_gradient).lower()}",
            f"train.steps={args.steps}", f"train.batch_size={args.batch_size}",
            f"train.mini_batch_size={args.batch_size}", f"train.micro_batch_size={args.micro_batch_size}",
            f"roles.actor.lr={args.lr}", "eval.every=0", "checkpoint.every=0", "checkpoint.export=false",
            "train.loggers=console,jsonl", f"train.output_dir={args.output}", f"train.seed={args.seed}", *args.set]


def plot(steps: list[int], kl: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, kl, marker="o", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("KL(student || teacher), student's samples")
    ax.set_title("on-policy distillation from SmolLM2-135M-Instruct")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True, help="flowrl model import's output folder (SmolLM2)")
    parser.add_argument("--data", help="flowrl data wordproblems' output folder (its prompts); none: flowrl's "
                                       "arithmetic task (the smoke test with a tiny char-level teacher)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rollout-engine", help="default: hf_static on cuda, hf on cpu")
    parser.add_argument("--student-layers", type=int, default=8, help="the teacher has 30")
    parser.add_argument("--kind", default="k1", help="algo.kind (k1 with the policy gradient, k3 without)")
    parser.add_argument("--policy-gradient", action=argparse.BooleanOptionalAction, default=True)
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
    student = student_from(args.teacher, output / "student_init", args.student_layers, args.seed)
    train(load_run_config(None, run_options(args, student)))
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    steps, kl = [r["step"] for r in rows if KL in r], [r[KL] for r in rows if KL in r]
    try:
        plot(steps, kl, output / "distill_kl.png")
    except ImportError:  # matplotlib is the plotting extra's
        print("matplotlib is not installed: no plot (pip install matplotlib)")
    head, tail = sum(kl[:3]) / len(kl[:3]), sum(kl[-3:]) / len(kl[-3:])
    print(f"distill_kl first 3 steps {head:.4f}, last 3 steps {tail:.4f}: last / first {tail / head:.3f}x")


if __name__ == "__main__":
    main()
