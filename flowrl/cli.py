"""`flowrl train ALGO`, `flowrl plan ALGO`, `flowrl config`, `flowrl data` and `flowrl export`.

Every user mistake ends in one line naming the field, file or row and exit
status 2 (a finished run: 3); anything else in one line and status 1.
`--debug` shows the full traceback instead. Heavy imports happen after the
arguments parse, so `flowrl --help` answers at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

EXIT_USER_ERROR, EXIT_FINISHED, EXIT_FAILURE = 2, 3, 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowrl", description="RL post-training of LLMs as dataflow graphs.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "train with an algorithm"), ("plan", "print the compiled plan, load nothing")):
        p = sub.add_parser(name, help=text)
        p.add_argument("algorithm", nargs="?", default="grpo",
                       help="a built-in name (grpo, ppo, dppo, ...) or module:attribute")
        p.add_argument("--config", help="a JSON, YAML or TOML file of RunConfig values")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one value, e.g. --set train.steps=20 --set algo.group_size=4")
        p.add_argument("--steps", type=int, help="shorthand for --set train.steps=N")
        p.add_argument("--output-dir", help="shorthand for --set train.output_dir=DIR")
        p.add_argument("--no-progress", action="store_true", help="no progress bar or per-step lines")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
    plan = sub.choices["plan"]
    plan.add_argument("--format", choices=("text", "mermaid", "dot"), default="text",
                      help="the plan as text, or as Mermaid or Graphviz DOT source")
    plan.add_argument("--gpus", type=int, help="build the pools for this many GPUs and estimate memory per GPU")
    plan.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are on (with --gpus)")
    plan.add_argument("--split", type=float, help="with --gpus: this fraction of the GPUs for the rollout, the "
                                                  "rest for training (default: every role on every GPU)")
    plan.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU (with --gpus)")
    plan.add_argument("--prompt-len", type=int, default=256, help="prompt tokens assumed for the estimate")
    show = sub.add_parser("config", help="print every config field with its default and description")
    show.add_argument("algorithm", nargs="?", help="also print this algorithm's algo.* options")
    data = sub.add_parser("data", help="convert a raw GSM8K or MATH file into verl's data set schema")
    data.add_argument("kind", choices=["gsm8k", "math"])
    data.add_argument("--input", required=True, help="the raw rows: .parquet, .jsonl or a saved datasets folder")
    data.add_argument("--output", required=True, help="the converted rows: .parquet or .jsonl")
    data.add_argument("--split", default="train", help="recorded in extra_info.split")
    export = sub.add_parser("export", help="write a (sharded) checkpoint's policy as a Hugging Face model folder")
    export.add_argument("checkpoint", help="a step folder, a checkpoints folder or a run's output_dir (its newest "
                                           "intact checkpoint)")
    export.add_argument("--output", required=True, help="the Hugging Face folder to write")
    return parser


def print_config(algorithm: str | None) -> None:
    from flowrl.config import RunConfig, config_lines
    from flowrl.runtime.trainer import resolve_algorithm

    for line in config_lines(RunConfig):
        print(line)
    if algorithm:
        for line in config_lines(resolve_algorithm(algorithm).config_cls, "algo."):
            print(line)


def config_from_args(args: argparse.Namespace) -> Any:
    from flowrl.config import load_run_config

    overrides = [f"algorithm={args.algorithm}", *args.set]
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    return load_run_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    from flowrl.runtime import trainer

    if args.command == "config":
        print_config(args.algorithm)
        return 0
    if args.command == "data":
        from flowrl.data import prepare

        return prepare.main(args)
    if args.command == "export":
        from flowrl.runtime.export import export

        print(f"exported {export(args.checkpoint, args.output)}")
        return 0
    trainer.resolve_algorithm(args.algorithm)  # imports it first: the roles it registers may be placed
    cfg = config_from_args(args)
    if args.command == "plan":
        algo = trainer.resolve_algorithm(cfg.algorithm)
        task = trainer.run_task(cfg)
        if args.gpus:
            from flowrl.runtime.planning import plan_on_gpus

            print(plan_on_gpus(cfg, algo, task, args.gpus, args.nodes, args.split, args.gpu_memory_gib,
                               args.prompt_len))
            return 0
        plan = trainer.make_plan(cfg, algo, task)
        print({"text": plan.describe, "mermaid": plan.mermaid, "dot": plan.dot}[args.format]())
        return 0
    history = trainer.train(cfg, progress=not args.no_progress)
    if history and os.environ.get("RANK", "0") == "0":
        first, last = history[0].get("reward/mean", 0.0), history[-1].get("reward/mean", 0.0)
        print(f"done: {len(history)} steps, reward/mean {first:.3f} -> {last:.3f}; output in {cfg.train.output_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("flowrl: interrupted; rerun the same command to resume from the last checkpoint", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (the one place every error becomes one line)
        if args.debug:
            raise
        from flowrl.runtime.resume import RunFinished

        if isinstance(err, RunFinished):
            print(f"flowrl: {err}", file=sys.stderr)
            return EXIT_FINISHED
        user = isinstance(err, ValueError)
        what = "error" if user else f"error: {type(err).__name__}"
        print(f"flowrl: {what}: {' '.join(str(err).split()) or type(err).__name__}"
              f"{'' if user else ' (rerun with --debug for the traceback)'}", file=sys.stderr)
        return EXIT_USER_ERROR if user else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
