"""The command line's arguments: `flowrl train|plan|algorithms|config|data|model|export|plot|trust` and each
one's options (argparse; flowrl.cli.commands parses and runs them). Imports nothing heavy, so `flowrl --help` answers at
once."""

from __future__ import annotations

import argparse


def command_parser() -> argparse.ArgumentParser:
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
