"""`flowrl train ALGO` and `flowrl plan ALGO`."""

from __future__ import annotations

import argparse
import os
import sys

from flowrl.config import RunConfig, load_run_config


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowrl", description="RL post-training of LLMs as dataflow graphs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "train with an algorithm"), ("plan", "print the compiled plan, load nothing")):
        p = sub.add_parser(name, help=text)
        p.add_argument("algorithm", nargs="?", default="grpo",
                       help="a built-in name (grpo, ppo, dppo, ...) or module:attribute")
        p.add_argument("--config", help="a JSON or YAML file of RunConfig values")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one value, e.g. --set train.steps=20 --set algo.group_size=4")
        p.add_argument("--steps", type=int, help="shorthand for --set train.steps=N")
        p.add_argument("--output-dir", help="shorthand for --set train.output_dir=DIR")
        p.add_argument("--no-progress", action="store_true", help="no progress bar or per-step lines")
    show = sub.add_parser("config", help="print every config field with its default and description")
    show.add_argument("algorithm", nargs="?", help="also print this algorithm's algo.* options")
    return parser


def print_config(algorithm: str | None) -> None:
    from flowrl.config import config_lines
    from flowrl.runtime.trainer import resolve_algorithm

    for line in config_lines(RunConfig):
        print(line)
    if algorithm:
        for line in config_lines(resolve_algorithm(algorithm).config_cls, "algo."):
            print(line)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    overrides = [f"algorithm={args.algorithm}", *args.set]
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    return load_run_config(args.config, overrides)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from flowrl.runtime import trainer  # heavy imports after argument errors

    try:
        if args.command == "config":
            print_config(args.algorithm)
            return 0
        trainer.resolve_algorithm(args.algorithm)  # imports it first: the roles it registers may be placed
        cfg = config_from_args(args)
        if args.command == "plan":
            algo = trainer.resolve_algorithm(cfg.algorithm)
            task = trainer.make_task(cfg.task.name, cfg.task.max_operand)
            print(trainer.make_plan(cfg, algo, task).describe())
            return 0
        history = trainer.train(cfg, progress=not args.no_progress)
    except ValueError as err:
        print(f"flowrl: error: {err}", file=sys.stderr)
        return 2
    if history and os.environ.get("RANK", "0") == "0":
        first, last = history[0].get("reward/mean", 0.0), history[-1].get("reward/mean", 0.0)
        print(f"done: {len(history)} steps, reward/mean {first:.3f} -> {last:.3f}; output in {cfg.train.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
