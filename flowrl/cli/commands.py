"""What each command does, `flowrl train ALGO`, `flowrl plan ALGO`, `flowrl config`, `flowrl data`, `flowrl model
import`, `flowrl export`, ..., and how an error ends (`main`).

Every user mistake ends in one line naming the field, file or row and exit
status 2 (a finished run: 3, or 0 under torchrun, whose agent reports any other
status of a rank as a failure with a traceback); anything else in one line and
status 1. Warnings raised in flowrl's own code print as one line each.
`--debug` shows the full traceback instead. Heavy imports happen after the
arguments parse, so `flowrl --help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from flowrl.cli.args import command_parser
from flowrl.cli.listing import algorithm_lines, print_config

EXIT_USER_ERROR, EXIT_FINISHED, EXIT_FAILURE = 2, 3, 1


def config_from_args(args: argparse.Namespace) -> Any:
    from flowrl.config import load_run_config

    overrides = [*verl_overrides(args), *args.set]
    if getattr(args, "gpus", None) is not None:  # `flowrl plan --gpus N`: a CUDA run's config (its preset)
        overrides.insert(0, "train.device=cuda")
    if args.steps is not None:
        overrides.append(f"train.steps={args.steps}")
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    try:
        cfg = load_run_config(args.config, overrides)
    except ValueError as err:
        from flowrl.config.verl_args import verl_hint

        raise ValueError(verl_hint(args.set, lambda word: refused(args.config, word)) or str(err)) from None
    if not any(o.startswith("train.output_dir=") for o in overrides) and not set_in_file(args.config):
        cfg.train.output_dir = default_output_dir(cfg.algorithm)
    return cfg


def set_in_file(config: str | None) -> bool:
    from flowrl.config import read_config_file

    return bool(config) and "output_dir" in (read_config_file(config).get("train") or {})


def default_output_dir(algorithm: str) -> str:
    """`flowrl train` without train.output_dir: a folder of its own, runs/<algorithm>-<start time>, as verl's
    experiment folders; the ranks of one torchrun job agree on it (their launcher's start time)."""
    import time

    name = algorithm.rsplit(":", 1)[-1].rsplit("/", 1)[-1].removesuffix(".py")
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:  # every rank is a child of the same torchrun agent: its start time
        import psutil
    except ImportError:
        return f"runs/{name}-torchrun-{os.getppid()}"
    started = psutil.Process(os.getppid()).create_time()
    return f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}"


def refused(config: str | None, word: str) -> bool:
    from flowrl.config import load_run_config

    try:
        load_run_config(config, [word])
    except ValueError:
        return True
    return False


def choose_algorithm(args: argparse.Namespace) -> str:
    """The algorithm the command line names, else the --config file's `algorithm:`, else grpo; a file and a
    command line that name different ones are refused (one would be dropped without a word)."""
    from flowrl.config import read_config_file

    in_file = read_config_file(args.config).get("algorithm") if args.config else None
    if in_file is not None and args.algorithm_named and str(in_file) != args.algorithm:
        raise ValueError(f"algorithm: the command line names {args.algorithm!r} but {args.config} says "
                         f"algorithm: {in_file!r}; name one (drop it from the file or from the command line)")
    return args.algorithm if args.algorithm_named else str(in_file or "grpo")


def verl_overrides(args: argparse.Namespace) -> list[str]:
    """`algorithm=NAME` and, with --verl or --verl-config, the verl keys' flowrl overrides: each key flowrl
    cannot honour named on stderr, the command it runs as on stdout."""
    if not (args.verl or args.verl_config):
        return [f"algorithm={args.algorithm}"] if args.algorithm else []  # none named: --config's, or grpo
    from flowrl.config.verl_args import from_verl

    mapped = from_verl(args.verl_words, args.verl_config)
    if args.algorithm not in (None, mapped.algorithm):
        raise ValueError(f"{args.algorithm}: with --verl the algorithm comes from verl's keys, here {mapped.algorithm}")
    if os.environ.get("RANK", "0") == "0":
        for note in mapped.notes:
            print(f"flowrl: verl: {note}", file=sys.stderr)
        print(f"flowrl: running as: {mapped.command()}{''.join(f' --set {w}' for w in args.set)}", flush=True)
    return [f"algorithm={mapped.algorithm}", *mapped.words()]


def run(args: argparse.Namespace) -> int:
    from flowrl.runtime import trainer

    if args.command == "config":
        print_config(args.algorithm)
        return 0
    if args.command == "algorithms":
        print("\n".join(algorithm_lines()))
        return 0
    if args.command == "data" and args.kind == "wordproblems":
        from flowrl.data.builtin import wordproblems

        return wordproblems.main(args)
    if args.command == "data":
        from flowrl.data import prepare

        return prepare.main(args)
    if args.command == "model":
        from flowrl.engines.models.model_import import import_model

        print(f"imported {args.source} -> {import_model(args.source, args.output, args.dtype)}")
        return 0
    if args.command == "export":
        from flowrl.runtime.store.export import export

        print(f"exported {export(args.checkpoint, args.output, task=args.task)}")
        return 0
    if args.command == "plot":
        from flowrl.runtime.observe.plotting import plot_runs

        print(f"plotted {len(args.runs)} run(s) -> {plot_runs(args.runs, args.output)}")
        return 0
    if args.command == "trust":
        from flowrl.runtime.store.checkpoint import trust

        print(f"signed {', '.join(str(p) for p in trust(args.folder))}")
        return 0
    if not (args.verl or args.verl_config):
        args.algorithm = choose_algorithm(args)
    trainer.resolve_algorithm(args.algorithm or "grpo")  # imports it first: the roles it registers may be placed
    cfg = config_from_args(args)
    args.run_folder = cfg.train.output_dir
    if args.command == "train" and args.nproc_per_node != 1 and "RANK" not in os.environ:
        from flowrl.runtime.launch import run_ranks, without_nproc

        if args.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node: expected 1 or more ranks, got {args.nproc_per_node}")
        return run_ranks(args.nproc_per_node, [*without_nproc(args.argv), "--output-dir", cfg.train.output_dir])
    if args.command == "plan":
        check_plan_args(args)
        algo = trainer.resolve_algorithm(cfg.algorithm)
        task = trainer.run_task(cfg)
        if args.cluster is not None:
            from flowrl.runtime.layout.auto_plan import print_choice

            print(print_choice(cfg, algo, task, args))
            return 0
        if args.gpus is not None:
            from flowrl.runtime.layout.planning import plan_on_gpus

            print(plan_on_gpus(cfg, algo, task, args.gpus, args.nodes, args.split, args.gpu_memory_gib,
                               args.prompt_len, args.gpus_per_node, fmt=args.format))
            return 0
        plan = trainer.make_plan(cfg, algo, task)
        text = {"text": plan.describe, "mermaid": plan.mermaid, "dot": plan.dot}
        print(json.dumps({"plan": plan.describe().splitlines()}, indent=2) if args.format == "json"
              else text[args.format]())
        return 0
    history = trainer.train(cfg, progress=not args.no_progress)
    if history and os.environ.get("RANK", "0") == "0":
        shown = next((k for k in DONE_METRICS if k in history[-1]), DONE_METRICS[0])  # sft and rm have no reward
        first, last = history[0].get(shown, 0.0), history[-1].get(shown, 0.0)
        print(f"done: {len(history)} steps, {shown} {first:.3f} -> {last:.3f}; output in {cfg.train.output_dir}")
    return 0


def check_plan_args(args: argparse.Namespace) -> None:
    """`flowrl plan`'s numbers: --gpus 0 would silently print the plan without GPUs."""
    for name, value in (("--gpu-memory-gib", args.gpu_memory_gib), ("--prompt-len", args.prompt_len)):
        if not 0 < value < float("inf"):  # nan too; --gpus and --nodes are checked with the pools
            raise ValueError(f"{name}: expected a positive number, got {value}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments; for train and plan, bare KEY=VALUE words are overrides like --set KEY=VALUE."""
    parser = command_parser()
    args, extra = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.run_folder = None  # train: its output folder, once known (the interrupt message names it)
    if args.command in ("train", "plan"):
        if args.algorithm and "=" in args.algorithm:  # `flowrl train train.steps=3`: no algorithm named
            extra, args.algorithm = [args.algorithm, *extra], None
        bare = [word for word in extra if "=" in word and not word.startswith("-")]
        extra = [word for word in extra if word not in bare]
        args.verl_words, verl = (bare, []) if args.verl or args.verl_config else ([], bare)
        args.set = [*args.set, *verl]
        args.algorithm_named = args.algorithm is not None  # else --config's, or grpo (choose_algorithm)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


_OWN_CODE = (str(Path(__file__).parents[1]), str(Path(__file__).parents[2] / "algorithms"))  # flowrl and its algorithms
_format_warning = warnings.formatwarning


def say_line(line: str) -> None:
    """One line on stderr in one write: a launch's ranks share the launcher's stderr, and `print` writes the text
    and its newline apart, so two ranks' lines came out as one ("...size 2flowrl: error (rank 1): ...")."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None) -> str:
    """A warning raised in flowrl's own code as one line, "flowrl: warning: ..."; others as Python shows them.
    Under torchrun only rank 0 says flowrl's (every rank warns alike)."""
    if filename.startswith(_OWN_CODE):
        from flowrl.data.redact import redact

        return "" if os.environ.get("RANK", "0") != "0" else f"flowrl: warning: {redact(str(message))}\n"
    return _format_warning(message, category, filename, lineno, line)


def finished(err: Exception) -> int:
    """A finished run: its one line (from rank 0 only under torchrun), status 3, or 0 under torchrun."""
    if os.environ.get("RANK", "0") == "0":
        print(f"flowrl: {err}", file=sys.stderr)
    return 0 if "TORCHELASTIC_RUN_ID" in os.environ else EXIT_FINISHED


DONE_METRICS = ("reward/mean", "actor/sft_loss", "rm/bt_loss")  # the done line's figure: the first a run logs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    warnings.formatwarning = format_warning
    try:
        return run(args)
    except KeyboardInterrupt as err:
        where = f"train.output_dir={args.run_folder}" if args.run_folder else "the same train.output_dir"
        print(f"flowrl: interrupted{f' ({err})' if str(err) else ''}; resume from the last checkpoint with "
              f"{where}", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001  (the one place every error becomes one line)
        if args.debug:
            raise
        from flowrl.runtime.store.resume import RunFinished
        from flowrl.runtime.shutdown import Stopped, exit_now

        if isinstance(err, RunFinished):
            return finished(err)
        if isinstance(err, Stopped):  # SIGTERM or SIGINT, at a safe point: where the checkpoint is
            if os.environ.get("RANK", "0") == "0":  # every torchrun rank stopped at the same step
                print(f"flowrl: {err}", file=sys.stderr)
            if argv is None:  # the process's own entry (`flowrl`, `python -m flowrl`): exit within the budget
                exit_now(err.exit_code)
            return err.exit_code
        user = isinstance(err, ValueError)
        rank = os.environ.get("RANK", "0")  # every rank says it: a rank may fail alone, or rank 0 be elsewhere
        what = ("error" if user else f"error: {type(err).__name__}") if rank == "0" else \
            (f"error (rank {rank})" if user else f"error (rank {rank}): {type(err).__name__}")
        from flowrl.data.redact import redact

        say_line(f"flowrl: {what}: {redact(' '.join(str(err).split())) or type(err).__name__}"
                 f"{'' if user else ' (rerun with --debug for the traceback)'}")
        if user:  # bad input: let the launch's other ranks say their line before the launcher ends them
            from flowrl.runtime.launch import wait_for_peers_to_say

            wait_for_peers_to_say()
        return EXIT_USER_ERROR if user else EXIT_FAILURE
    except BaseException as err:  # torch.distributed.checkpoint's CheckpointException is no Exception
        if args.debug:
            raise
        lines = str(err).strip().splitlines()
        said = f"{type(err).__name__}({err.code!r}) from code the run called (flowrl never exits itself)" \
            if isinstance(err, SystemExit) else f"{type(err).__name__}: {lines[0] if lines else ''}"
        say_line(f"flowrl: error: {said} (rerun with --debug for the traceback)")
        return EXIT_FAILURE
