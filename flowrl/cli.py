"""`flowrl train ALGO`, `flowrl plan ALGO`, `flowrl config`, `flowrl data`, `flowrl model import` and `flowrl export`.

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

EXIT_USER_ERROR, EXIT_FINISHED, EXIT_FAILURE = 2, 3, 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowrl", description="RL post-training of LLMs as dataflow graphs.")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "train with an algorithm"), ("plan", "print the compiled plan, load nothing")):
        p = sub.add_parser(name, help=text)
        p.add_argument("algorithm", nargs="?", help="a built-in name (grpo, ppo, dppo, ...) or module:attribute "
                                                    "(default grpo; with --verl: verl's algorithm keys)")
        p.add_argument("--config", help="a JSON, YAML or TOML file of RunConfig values")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override one value, e.g. --set train.steps=20 --set algo.group_size=4; a bare "
                            "KEY=VALUE word (train.steps=20, as in verl's hydra overrides) does the same")
        p.add_argument("--steps", type=int, help="shorthand for --set train.steps=N")
        p.add_argument("--output-dir", help="shorthand for --set train.output_dir=DIR")
        p.add_argument("--no-progress", action="store_true", help="no progress bar or per-step lines")
        p.add_argument("--verl", action="store_true", help="the bare KEY=VALUE words are verl's hydra keys "
                       "(algorithm.adv_estimator=grpo data.train_batch_size=... actor_rollout_ref....), mapped "
                       "onto flowrl's (docs/verl.md); --set still takes flowrl's keys")
        p.add_argument("--verl-config", metavar="FILE.yaml", help="verl's config tree (as --verl's keys; a word wins)")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error")
    sub.choices["train"].add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                                      help="run N ranks on this machine (torchrun's launcher, without its output)")
    plan = sub.choices["plan"]
    plan.add_argument("--format", choices=("text", "json", "mermaid", "dot"), default="text",
                      help="the plan as text, JSON, or Mermaid or Graphviz DOT source (with --gpus too)")
    plan.add_argument("--gpus", type=int, help="build the pools for this many GPUs and estimate memory per GPU")
    plan.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are on (with --gpus)")
    plan.add_argument("--split", type=float, help="with --gpus: this fraction of the GPUs for the rollout, the "
                                                  "rest for training (default: every role on every GPU)")
    plan.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory of one GPU (with --gpus)")
    plan.add_argument("--prompt-len", type=int, default=256, help="prompt tokens assumed for the estimate")
    plan.add_argument("--gpus-per-node", type=int, default=8, help="GPUs a node has (with --gpus)")
    plan.add_argument("--cluster", help="let the planner choose the layout for this cluster: NODESxGPUSxKIND, "
                      "e.g. 1xH100-80G or 2x8xH100-80G; 'found': the GPUs torch or the Ray cluster sees")
    plan.add_argument("--explain", action="store_true", help="with --cluster: table the candidates")
    plan.add_argument("--write", help="with --cluster: write the chosen layout as a run config file (JSON) that "
                      "flowrl train --config takes")
    plan.add_argument("--costs", help="with --cluster: plan with the cost model a run refined (its plan.json)")
    plan.add_argument("--allow-lora", action="store_true", help="with --cluster: the planner may train LoRA "
                      "adapters (changes the math)")
    sub.add_parser("algorithms", help="list the registered algorithms (the prebuilt graphs), one line each")
    show = sub.add_parser("config", help="print every config field with its default and description, and each "
                                         "registered engine's own options")
    show.add_argument("algorithm", nargs="?", help="also print this algorithm's algo.* options")
    data = sub.add_parser("data", help="write a data set in verl's schema: convert a raw GSM8K or MATH file, or "
                                       "generate arithmetic word problems")
    kinds = data.add_subparsers(dest="kind", required=True)
    for kind in ("gsm8k", "math"):
        convert = kinds.add_parser(kind, help=f"convert a raw {kind} file")
        convert.add_argument("--input", required=True, help="the raw rows: .parquet, .jsonl or a saved datasets folder")
        convert.add_argument("--output", required=True, help="the converted rows: .parquet or .jsonl")
        convert.add_argument("--split", default="train", help="recorded in extra_info.split")
    words = kinds.add_parser("wordproblems", help="generate arithmetic word problems in GSM8K's raw format")
    words.add_argument("--output", required=True, help="a folder: train.parquet, test.parquet and raw/*.jsonl")
    words.add_argument("--train-size", type=int, default=5000, help="training problems")
    words.add_argument("--test-size", type=int, default=500, help="test problems (none also in the training set)")
    words.add_argument("--seed", type=int, default=0, help="the same seed writes the same problems")
    model = sub.add_parser("model", help="prepare a model folder").add_subparsers(dest="action", required=True)
    imports = model.add_parser("import", help="a GGUF file or a Hugging Face folder as the Hugging Face folder "
                                              "flowrl trains from (weights, tokenizer, chat template)")
    imports.add_argument("source", help="a .gguf file or a Hugging Face model folder")
    imports.add_argument("--output", required=True, help="the Hugging Face folder to write")
    imports.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                         help="dtype of the written weights")
    export = sub.add_parser("export", help="write a (sharded) checkpoint's policy as a Hugging Face model folder")
    export.add_argument("checkpoint", help="a step folder, a checkpoints folder or a run's output_dir (its newest "
                                           "intact checkpoint)")
    export.add_argument("--output", required=True, help="the Hugging Face folder to write")
    export.add_argument("--task", help="your own task.name (module:attribute) when the run's is not built in: "
                                       "export imports no code named in a run folder")
    plot = sub.add_parser("plot", help="a PNG of runs' metrics.jsonl (reward, eval accuracy, KL, response length, "
                                       "entropy, step time by node), several runs on shared axes")
    plot.add_argument("runs", nargs="+", metavar="RUN", help="a run's train.output_dir, or its metrics.jsonl")
    plot.add_argument("--output", default="metrics.png", help="the PNG to write (beside it, the plotted series "
                                                              "as .json)")
    trust = sub.add_parser("trust", help="sign a run folder's checkpoints with your key (flowrl.runtime.store.signing): "
                                         "only signed ones resume or export")
    trust.add_argument("folder", help="a step folder, a checkpoints folder or a run's output_dir")
    return parser


def algorithm_lines() -> list[str]:
    """Each registered algorithm's name and the first sentence of its module's docstring."""
    import flowrl.algorithms  # noqa: F401 (registers the prebuilt ones)
    from flowrl.graph.algorithm import ALGORITHMS

    lines = []
    for name in ALGORITHMS:
        fn = ALGORITHMS.get(name).fn
        doc = (sys.modules[fn.__module__].__doc__ or fn.__doc__ or "").split("\n\n")[0]
        lines.append(f"{name:24s} {' '.join(doc.split()).split('. ')[0].rstrip('.')}")
    return lines


def engine_lines() -> list[str]:
    """The options each registered engine adds to (or sets apart from) its section's default engine."""
    from flowrl.config import RunConfig, config_lines
    from flowrl.engines import ROLLOUT_ENGINES, TRAIN_ENGINES

    defaults, lines = RunConfig(), []
    for role, registry in (("rollout", ROLLOUT_ENGINES), ("actor", TRAIN_ENGINES)):
        default, section = getattr(defaults, role), f"roles.{role}"
        shown = set(config_lines(type(default), f"{section}.", default))
        for name in registry:
            if name == default.engine:
                continue
            where, others = section, " (and the other train engines)" * (role == "actor")
            try:
                chosen = registry.get(name)
                if chosen.SECTION is not None:  # an engine of one role (the vLLM teacher)
                    where, others = f"roles.{chosen.SECTION}", ""
                options = [line for line in config_lines(chosen, f"{where}.")
                           if line not in shown and not line.startswith(f"{where}.engine ")]
            except ValueError as err:  # an engine whose package is missing
                options = [f"  ({err})"]
            lines += [f"# {where}.engine={name}{others}: its options beside the ones above", *options]
    return lines


def print_config(algorithm: str | None) -> None:
    from flowrl.config import RunConfig, config_lines, preset_lines, section_lines
    from flowrl.runtime.trainer import resolve_algorithm

    algo = resolve_algorithm(algorithm) if algorithm else None
    roles = algo.roles if algo else ("actor", "critic", "rollout")  # an algorithm's: only the roles it has
    for line in [*config_lines(RunConfig), *section_lines(RunConfig(), roles), *engine_lines(), *preset_lines()]:
        print(line)
    if algo:
        for line in config_lines(algo.config_cls, "algo."):
            print(line)


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
            from flowrl.runtime.auto_plan import print_choice

            print(print_choice(cfg, algo, task, args))
            return 0
        if args.gpus is not None:
            from flowrl.runtime.planning import plan_on_gpus

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
    parser = _parser()
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


_OWN_CODE = (str(Path(__file__).parent), str(Path(__file__).parent.parent / "algorithms"))  # flowrl and its algorithms
_format_warning = warnings.formatwarning


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

        print(f"flowrl: {what}: {redact(' '.join(str(err).split())) or type(err).__name__}"
              f"{'' if user else ' (rerun with --debug for the traceback)'}", file=sys.stderr)
        return EXIT_USER_ERROR if user else EXIT_FAILURE
    except BaseException as err:  # torch.distributed.checkpoint's CheckpointException is no Exception
        if args.debug:
            raise
        lines = str(err).strip().splitlines()
        said = f"{type(err).__name__}({err.code!r}) from code the run called (flowrl never exits itself)" \
            if isinstance(err, SystemExit) else f"{type(err).__name__}: {lines[0] if lines else ''}"
        print(f"flowrl: error: {said} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
