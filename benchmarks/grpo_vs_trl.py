"""A GRPO step four ways on one card: flowrl, TRL's GRPOTrainer without and with vLLM (colocated), a
hand-written loop.

Workload (shared/PERF_NOTES.md): the Qwen2.5-0.5B shape with random weights (bf16 on CUDA), sdpa; 64 prompts
of 128 tokens x 8 samples = 512 rows of up to 256 new tokens at temperature 1; k3 KL to the reference (coef
0.001); one AdamW step per batch. `--lengths fixed`: EOS suppressed, every response runs to the cap;
`--lengths variable`: each row ends with EOS at a length drawn from a log-normal (median cap / 4, --sigma,
capped at the cap), the same draws for every system (benchmarks/forced_lengths.py). Prints seconds per step
of each system (mean over --steps steps after --warmup), useful tokens (response tokens through EOS) per
second of step, flowrl's rollout tok/s, update MFU, sync/sleep timings, memory and sampler-vs-trainer logprob
gap, peak GPU memory and the ratios; each system also as one `RESULT {json}` line (and appended to --jsonl).
Systems that hold a vLLM engine need a process each (one sleep-mode vLLM per process): run them one
--systems at a time and combine with --report. Usage (flowrl need not be pip-installed; run from anywhere):
  python benchmarks/grpo_vs_trl.py --device cuda [--steps 3] [--lengths variable] [--jsonl runs.jsonl]
  python benchmarks/grpo_vs_trl.py --systems trl_vllm --jsonl runs.jsonl; python benchmarks/grpo_vs_trl.py \
      --report runs.jsonl
  python benchmarks/grpo_vs_trl.py --device cpu --small --steps 1
  python benchmarks/grpo_vs_trl.py --systems flowrl --grid 16x8:256,64x8:256,16x8:1024,64x8:1024 --jsonl runs.jsonl
(--grid: one process, each PROMPTSxGROUP:NEW_TOKENS item in turn, each system on each; benchmarks/bench_grid.py)
The parts: bench_workload.py (Workload, BenchTask, the clock), flowrl_system.py (flowrl's runner),
trl_systems.py (TRL's runners and the hand-written loop), bench_report.py (the printed summary).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import bench_grid  # noqa: E402
import forced_lengths  # noqa: E402
from common import QWEN05B, SMALL, qwen_model  # noqa: E402
# after the imports above, as before the split: bench_workload.START (the zero of first_step_s_since_start)
import bench_workload  # noqa: E402
from bench_report import report, report_file  # noqa: E402
from bench_workload import BenchTask, Workload  # noqa: E402
from flowrl_system import run_flowrl  # noqa: E402
from trl_systems import run_plain, run_trl, run_trl_vllm  # noqa: E402

FULL_RUN = dict(prompts=64, group=8, new_tokens=256, micro=32)
SMALL_RUN = dict(prompts=4, group=2, new_tokens=8, micro=4)
SYSTEMS = ("flowrl", "trl", "trl_vllm", "plain")
FAST_SETS = ("roles.rollout.engine=hf_static", "roles.actor.compile=true", "roles.actor.forward_micro_batch_size=128",
             "roles.critic.forward_micro_batch_size=128")
"""The flowrl options of the H200 runs (docs/benchmarks.md); `train.device=cuda` alone picks them
(the preset cuda, flowrl.config.presets, tests/test_cuda_defaults.py)."""

RUNNERS = {"flowrl": run_flowrl, "trl": run_trl, "trl_vllm": run_trl_vllm, "plain": run_plain}


def measured(name: str, wl: Workload, path: str, draws_from: int = 0) -> dict:
    """One system's result (or its error), with peak GPU memory; frees what it held before the next.
    `draws_from`: the process's draw counter at the workload's start (--grid: the item's first draw)."""
    gc.collect()
    if wl.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    print(f"--- running {name}", flush=True)
    try:
        result = RUNNERS[name](wl, path)
    except Exception as err:  # report the failing system and go on with the others
        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err}"}
    gc.collect()
    if wl.device == "cuda":
        # a system in processes of its own (verl) reports its peak itself: this process's is only a floor; flowrl's
        # step_peak_gib is this process's, less what its sleeping vLLM unmapped (torch counts it: device_peak)
        raw = torch.cuda.max_memory_allocated() / 2**30 if "step_peak_gib" not in result else 0.0
        result["peak_gib"] = max(raw, result.get("step_peak_gib", 0.0),
                                 result.get("peak_gib") or 0.0,
                                 *[v for k, v in result.get("memory_max", {}).items() if k.startswith("peak_gib")])
        torch.cuda.empty_cache()
        result["left_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
    if wl.variable:  # rows that took a draw in this workload so far (expected: rows x steps per system)
        result["draws_taken"] = forced_lengths.process_draws().next - draws_from
    if result.get("s_per_step"):
        result["useful_tokens_per_step"] = wl.useful_tokens()
        result["useful_tok_per_step_s"] = wl.useful_tokens() / result["s_per_step"]
    return result


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="tiny model and batch, for a CPU smoke run")
    for flag in ("prompts", "group", "new-tokens", "micro"):
        p.add_argument(f"--{flag}", type=int, help=f"default {FULL_RUN[flag.replace('-', '_')]} "
                                                   f"({SMALL_RUN[flag.replace('-', '_')]} with --small)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed steps per system")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--lr", type=float, default=1e-7, help="AdamW learning rate (all systems)")
    p.add_argument("--kl-coef", type=float, default=0.001)
    p.add_argument("--lengths", choices=("fixed", "variable"), default="fixed",
                   help="fixed: EOS suppressed, all rows run to the cap; variable: EOS at log-normal drawn lengths")
    p.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma of the variable lengths")
    p.add_argument("--profile", nargs="?", const="update", default="", choices=("update", "generate"),
                   help="flowrl: one more step after the timed ones, its update (the default) or its rollout's "
                        "generate under torch's profiler (printed tables); generate: then one under cProfile")
    p.add_argument("--label", default="", help="suffix of flowrl's name in the results (flowrl-LABEL)")
    p.add_argument("--flowrl-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra flowrl config override, e.g. roles.rollout.micro_batch_size=512 (repeatable)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", help="write the results here")
    p.add_argument("--jsonl", help="append one line per system here")
    p.add_argument("--grid", help="PROMPTSxGROUP:NEW_TOKENS,... (e.g. 16x8:256,64x8:1024): run every system "
                                  "on each of these sizes in turn, in this one process (micro capped at the rows)")
    p.add_argument("--report", help="print the ratios of the systems in this JSONL file (one workload each) "
                                    "and exit")
    return p.parse_args()


def workload(args: argparse.Namespace, item: dict | None = None) -> Workload:
    """The workload of the options, with a --grid item's sizes in place of --prompts/--group/--new-tokens."""
    preset = SMALL_RUN if args.small else FULL_RUN
    sizes = {k: getattr(args, k) or v for k, v in preset.items()} | (item or {})
    wl = Workload(device=args.device, prompt_len=args.prompt_len, steps=args.steps, warmup=args.warmup, lr=args.lr,
                  kl_coef=args.kl_coef, lengths=args.lengths, sigma=args.sigma, profile=args.profile,
                  flowrl_sets=args.flowrl_set,
                  shape=SMALL if args.small else QWEN05B, **sizes)
    wl.micro = min(wl.micro, wl.rows)
    if wl.steps < 1 or wl.warmup < 0:
        raise SystemExit("--steps must be >= 1 and --warmup >= 0")
    if wl.rows % wl.micro:
        raise SystemExit(f"--micro {wl.micro} must divide prompts x group = {wl.rows}"
                         + (f" (--grid item {wl.prompts}x{wl.group}:{wl.new_tokens})" if item else ""))
    return wl


def setup_lengths(wl: Workload, draws: list[int], systems: list[str], folder: str) -> None:
    """The variable workload's draws for this process (--grid: all items'), and the hooks that apply them."""
    forced_lengths.write_draws(draws, folder)
    forced_lengths.register_flowrl_engine()
    if "trl_vllm" in systems or ("flowrl" in systems and wl.flowrl_engine() == "vllm"):
        forced_lengths.install_vllm_plugin(folder + "/plugin")


def run_item(wl: Workload, systems: list[str], path: str, span: tuple[int, int], args, card: str) -> dict:
    """Every system on one workload (--grid: one item, its draws `span` of the process's), a RESULT line each."""
    bench_workload.ITEM_START = time.perf_counter()
    print(f"workload: {wl.shape} {wl.dtype_name} on {card}; {wl.prompts} prompts x {wl.group} = {wl.rows} rows, "
          f"{wl.prompt_len} prompt + {wl.new_tokens} new tokens; micro-batch {wl.micro}; lr {wl.lr}; "
          f"{wl.steps} timed steps after {wl.warmup} warm-up; {wl.lengths} lengths", flush=True)
    if wl.variable:
        bench_grid.start_item(span)
    results = {}
    for name in systems:
        key = f"{name}-{args.label}" if args.label and name == "flowrl" else name
        results[key] = measured(name, wl, path, draws_from=span[0])
        line = {"system": key, "workload": asdict(wl), "device_name": card, "result": results[key]}
        print("RESULT " + json.dumps(line), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(line) + "\n")
    return results


def main() -> None:
    args = parse_args()
    if args.report:
        return report_file(args.report)
    if args.grid and (args.prompts or args.group or args.new_tokens):
        raise SystemExit("--grid gives each item's prompts, group and new tokens: drop --prompts/--group/--new-tokens")
    workloads = [workload(args, item) for item in bench_grid.parse_grid(args.grid)] if args.grid else [workload(args)]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(systems) - set(RUNNERS):
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {list(RUNNERS)}")
    transformers.utils.logging.disable_progress_bar()
    first = workloads[0]
    bench_grid.warn_vllm(len(workloads), systems, first.flowrl_engine())
    card = torch.cuda.get_device_name() if first.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        draws, spans = bench_grid.draw_layout(workloads) if first.variable else ([], [(0, 0)] * len(workloads))
        if first.variable:
            setup_lengths(first, draws, systems, tmp)
        max_positions = max(1536, first.prompt_len + max(wl.new_tokens for wl in workloads))
        path = qwen_model(tmp + "/model", BenchTask.chars, first.shape, max_positions, getattr(torch, first.dtype_name))
        runs = [(wl, run_item(wl, systems, path, span, args, card)) for wl, span in zip(workloads, spans)]
    summaries = []
    for wl, results in runs:
        print(f"=== results: {wl.prompts}x{wl.group}, {wl.new_tokens} new, {wl.lengths}")
        summaries.append({"workload": asdict(wl), "device_name": card, "results": results, "ratios": report(results)})
    if args.json:
        Path(args.json).write_text(json.dumps(summaries if args.grid else summaries[0], indent=2))


if __name__ == "__main__":
    main()
