"""Issue 43's bars on one GPU: the planner's layout against a small hand grid, same card, same run.

For each Qwen2.5 shape (random bf16 weights, benchmarks/common.qwen_model; the 7B with untied embeddings as
published): asks `flowrl plan grpo --cluster found --write` for the chosen layout, then runs `flowrl train` with it
and with each hand-grid variant for `--steps` steps, each in its own process. Each run logs `memory/peak_gib`
(torch's allocated peak less what a sleeping vLLM unmapped, flowrl.engines.device_peak, by
flowrl.runtime.layout.plan_record: the grid runs carry an empty prediction,
plan.predicted.step_s=0, so they log it too) and `timing_s/step` (the median after the first step is read).
Prints one JSON line per run (shape, run, ok, oom, s_step, peak_gib, engine, wall_s, the prediction for the chosen one)
and one summary line per shape: chosen over the best of the grid (bar <= 1.15), whether the chosen engine is
the faster one measured, predicted against measured step time and peak (bar: peak within 15%).
Workload (issue 43's): 16 prompts x 8, 256-token prompts, 1024 new tokens, long-tailed: each response ends at a
length drawn from a log-normal (median a quarter of the cap, sigma 1: benchmarks/forced_lengths.py), the same draws
for every run of a shape (`--lengths fixed`: every row to the cap, as random weights do unforced). The processes
run benchmarks/planner_bench.py's GRPO and task, which set the prompts and the forcing up (hf_static runs as
hf_static_lengths, hf_static with each row's eos_at_B; vLLM with forced_lengths' logits processor).

Where every grid row of an engine (hf_static, vLLM with CUDA graphs) is refused before it loads (at 7B on an 80 GB
card), the grid adds the row a user reaches by setting what the last refusal advises, LoRA left out (advised_rows:
at 7B, vLLM graphs with checkpointing, optimizer offload and the largest token budget that fits), so that every
engine that can train the full model has a measured row.

The grid's vLLM rows (CUDA graphs and eager, both asleep between generations) are left out where vLLM is not
installed (the planner then leaves it out too: flowrl.runtime.layout.auto_plan.installed_engines), so a missing engine
is a row not run, never a crash; the engine compared is the engine and, for vLLM, graphs or eager.

Usage (on the GPU machine): python benchmarks/planner_one_gpu.py [--shapes 0.5B,1.5B,3B,7B] [--steps 4]
On CPU: python benchmarks/planner_one_gpu.py --tiny (or --device cpu; tiny shapes, 2 x 2 rows of 16 new tokens,
planned for the device table's CPU row, `--cluster 1xCPU`, and run in fp32 with train.device=cpu; the vLLM grid
rows are left out: their sleep mode needs CUDA) prints the same lines, to show the script works where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from importlib.util import find_spec
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import forced_lengths  # noqa: E402
from bench_workload import BenchTask  # noqa: E402
from common import qwen_model  # noqa: E402
from planner_grid import ADVISED, GRID, advised_rows, chosen_engine, dominating, engine_of  # noqa: E402

BENCH = Path(__file__).resolve().parent / "planner_bench.py"
ALGO = f"{BENCH}:grpo"  # named by path: flowrl imports it (and its forced-length engine) before the config check

SHAPES = {
    "0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
    "3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, vocab_size=151936),
    "7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
TINY = {name: dict(hidden_size=width, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=2 * width, vocab_size=512)
        for name, width in (("tiny-32", 32), ("tiny-48", 48), ("tiny-64", 64), ("tiny-96", 96))}
WORKLOAD = ["train.device=cuda", "model.dtype=bfloat16", "train.batch_size=16", "algo.group_size=8",
            "roles.rollout.max_new_tokens=1024", "data.max_prompt_length=256", f"task.name={BENCH}:task",
            "eval.every=0", "checkpoint.every=0", "checkpoint.export=false"]
TINY_WORKLOAD = ["model.dtype=float32", "train.batch_size=2", "algo.group_size=2", "roles.actor.mini_batch_size=4",
                 "roles.rollout.max_new_tokens=16", "data.max_prompt_length=256", f"task.name={BENCH}:task",
                 "eval.every=0", "checkpoint.every=0", "checkpoint.export=false"]
LENGTHS_SIGMA = 1.0  # as grpo_vs_trl.py's long-tailed workload
CPU = ["train.device=cpu"]  # after the written config: the tiny run plans for a GPU and runs on the CPU

def grid_runs(tiny: bool) -> dict[str, list[str]]:
    """The hand grid this machine can run: no vLLM row where vLLM is not installed or on the CPU (sleep mode)."""
    vllm = find_spec("vllm") is not None and not tiny
    return {label: values for label, values in GRID.items() if vllm or engine_of(values) == "hf_static"}


def train(folder: Path, out: Path, steps: int, workload: list[str], extra: list[str],
          config: Path | None = None, timeout_s: float = 3600) -> dict:
    cmd = [sys.executable, "-m", "flowrl", "train", ALGO, "--no-progress", "--steps", str(steps),
           "--output-dir", str(out), *(["--config", str(config)] if config else []),
           *[f"--set={kv}" for kv in [*workload, f"model.path={folder}", *extra]]]
    began = time.monotonic()  # a run's whole process (imports, model load, compiles, vLLM's start, every step):
    # what a device call's time is planned from
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "oom": False, "s_step": None, "peak_gib": None, "error": f"over {timeout_s} s"}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] \
        if (out / "metrics.jsonl").exists() else []
    times = [r["timing_s/step"] for r in rows[1:] if "timing_s/step" in r]
    peaks = [r["memory/peak_gib"] for r in rows if "memory/peak_gib" in r]
    record = json.loads((out / "plan.json").read_text()) if (out / "plan.json").exists() else {}
    return {"ok": done.returncode == 0, "oom": "out of memory" in done.stderr.lower(),
            "s_step": statistics.median(times) if times else None, "peak_gib": max(peaks) if peaks else None,
            "error": (done.stderr.strip().splitlines() or [""])[-1] if done.returncode else "",
            "wall_s": round(time.monotonic() - began, 1),
            # each node's measured median seconds, and where the run had a prediction, measured over predicted per
            # node and the cost model refined from the run (flowrl.plan.calibrate.record): what the device table's
            # constants are re-measured from (flowrl/plan/costs.py)
            "node_s": {k.removeprefix("timing_s/"): round(statistics.median(r[k] for r in rows[1:] if k in r), 4)
                       for k in sorted({k for r in rows[1:] for k in r if k.startswith("timing_s/")})},
            **({"node_ratio": record["measured"]["node_ratio"], "refined": record["refined"]}
               if record.get("measured", {}).get("node_ratio") else {})}


def plan(folder: Path, out: Path, cluster: str, workload: list[str]) -> dict | None:
    """The planner's written config (None where it refused: its line is printed)."""
    done = subprocess.run([sys.executable, "-m", "flowrl", "plan", ALGO, "--cluster", cluster, "--explain",
                           "--write", str(out), *[f"--set={kv}" for kv in [*workload, f"model.path={folder}"]]],
                          capture_output=True, text=True, timeout=600)
    print(done.stdout + done.stderr[-500:], file=sys.stderr)
    return json.loads(out.read_text()) if out.exists() else None


def summary(name: str, chosen: dict, grid: dict[str, dict]) -> dict:
    measured = {label: r for label, r in grid.items() if r["ok"] and r["s_step"]}
    best = min(measured, key=lambda label: measured[label]["s_step"], default=None)
    out = {"shape": name, "summary": True, "chosen_s_step": chosen.get("s_step"), "best_grid": best,
           "best_grid_s_step": measured[best]["s_step"] if best else None, "chosen_oom": chosen.get("oom")}
    if chosen.get("s_step") and best:
        out["ratio"] = chosen["s_step"] / measured[best]["s_step"]
        out["ratio_ok"] = out["ratio"] <= 1.15
        fastest = {e: min((r["s_step"] for r in measured.values() if r["engine"] == e), default=None)
                   for e in ("hf_static", "vllm graphs", "vllm eager")}
        timed = {e: t for e, t in fastest.items() if t is not None}
        out["fastest_engine"] = min(timed, key=timed.get) if len(timed) > 1 else None
        out["engine_ok"] = out["fastest_engine"] in (None, chosen["engine"])
    predicted = chosen.get("predicted") or {}
    if predicted.get("step_s") and chosen.get("s_step"):
        out["step_over_predicted"] = chosen["s_step"] / predicted["step_s"]
    if predicted.get("peak_gib") and chosen.get("peak_gib"):
        out["peak_over_predicted"] = chosen["peak_gib"] / max(predicted["peak_gib"].values())
        out["peak_ok"] = abs(out["peak_over_predicted"] - 1) <= 0.15
    return out


def write_model(folder: Path, shape: dict, dtype: torch.dtype, device: str, timeout_s: float = 900) -> None:
    """The shape's random checkpoint, drawn on `device` (a 7B's fp32 init takes minutes on the CPU, seconds on
    the GPU) in a process of its own, so that none of its GPU memory stays in this one beside the runs."""
    child = multiprocessing.get_context("spawn").Process(
        target=qwen_model, args=(str(folder), BenchTask.chars, shape, 2048, dtype), kwargs={"device": device})
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        raise SystemExit(f"writing the {folder.name} model took over {timeout_s:.0f} s")
    if child.exitcode:
        raise SystemExit(f"writing the {folder.name} model failed (exit {child.exitcode})")


def forced(engine: str) -> list[str]:
    """Where responses end at drawn lengths, hf_static runs as hf_static_lengths (hf_static with each row's
    eos_at_B; vLLM's forcing is its logits-processor plugin, benchmarks/planner_bench.py)."""
    return ["roles.rollout.engine=hf_static_lengths"] if engine == "hf_static" and \
        os.environ.get(forced_lengths.LENGTHS_ENV) else []


def fresh(base: Path, suffix: str = "") -> Path:
    """base-N+suffix for the first N not taken: a run again in a kept --workdir (after a fix, on a warm machine)
    gets its own plan file (`flowrl plan --write` keeps one that exists) and its own run folder."""
    return next(path for n in range(1000) if not (path := base.with_name(f"{base.name}{n}{suffix}")).exists())


def run_shape(name: str, shape: dict, tmp: str, tiny: bool, steps: int, grid: dict[str, list[str]],
              runs: set[str] | None = None, run_dominated: bool = False) -> None:
    """One shape: the planner's written layout and each grid row, a JSON line each, then the summary line.
    `runs` (None: all) names the runs this call makes ("chosen" and grid labels): a shape's runs can be spread over
    several device calls with one --workdir, each run's line kept in the folder for the summary of the last call.
    A DOMINATED row one of whose chain ran to its end (in this call or an earlier one) is skipped: it cannot be
    the grid's best (`run_dominated` runs it anyway)."""
    dtype, (workload, after) = (torch.float32, (TINY_WORKLOAD, CPU)) if tiny else (torch.bfloat16, (WORKLOAD, []))
    folder = Path(tmp) / name
    if not (folder / "config.json").exists():  # a --workdir keeps the model
        write_model(folder, shape, dtype, "cpu" if tiny else "cuda")
    lines = Path(tmp) / f"{name}-runs.jsonl"
    done = {r["run"]: r for r in map(json.loads, lines.read_text().splitlines())} if lines.exists() else {}

    def record(label: str, got: dict) -> None:
        done[label] = {"shape": name, "run": label, **got}
        print(json.dumps(done[label]), flush=True)
        with lines.open("a") as out:
            out.write(json.dumps(done[label]) + "\n")

    if runs is None or "chosen" in runs:
        chosen_file = fresh(Path(tmp) / f"{name}-plan", ".json")
        written = plan(folder, chosen_file, "1xCPU" if tiny else "found", workload)
        if written is None:
            record("chosen", {"ok": False, "s_step": None, "error": "refused by the planner", "engine": None})
        else:
            engine = chosen_engine(written)
            record("chosen", {**train(folder, fresh(Path(tmp) / f"{name}-chosen"), steps, [],
                                      [*forced(engine), *after], chosen_file),
                              "engine": engine,
                              "predicted": {k: written["plan"]["predicted"][k]
                                            for k in ("layout", "step_s", "peak_gib")}})
    def row(label: str, extra: list[str], i: int) -> None:
        # an empty prediction: the run logs memory/peak_gib (flowrl.runtime.layout.plan_record)
        got = train(folder, fresh(Path(tmp) / f"{name}-{i}"), steps, workload,
                    [*extra, *forced(engine_of(extra)), *after, "plan.predicted.step_s=0"])
        record(label, {**got, "engine": engine_of(extra), **({} if label in grid else {"values": extra})})

    for i, (label, extra) in enumerate(grid.items()):
        if runs is not None and label not in runs:
            continue
        if not run_dominated and (base := dominating(label, done)):
            print(json.dumps({"shape": name, "run": label, "skipped": f"{base} ran to its end in "
                              f"{done[base]['s_step']:.2f} s/step: this row adds recompute or offload to it"}),
                  flush=True)
            continue
        row(label, extra, i)
    if runs is None or ADVISED in runs:
        for i, (label, extra) in enumerate(advised_rows(grid, done).items(), start=len(grid)):
            if label not in done:
                row(label, extra, i)
    if "chosen" in done:
        print(json.dumps(summary(name, done["chosen"], {k: v for k, v in done.items() if k != "chosen"})),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=None, help="comma-separated (default: all of the mode's shapes)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run of the script)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same as --tiny")
    parser.add_argument("--runs", default=None, help=f"comma-separated: 'chosen', grid labels and '{ADVISED}' "
                        "(the rows the refusals advise, advised_rows) (default: all)")
    parser.add_argument("--run-dominated", action="store_true",
                        help="run the checkpointing and checkpointing-and-offload rows even where a row of their "
                             "chain ran with room (DOMINATED)")
    parser.add_argument("--lengths", choices=("variable", "fixed"), default="variable",
                        help="variable: long-tailed drawn lengths (issue 43's workload); fixed: every row to the cap")
    parser.add_argument("--workdir", default=None,
                        help="a folder kept between calls (models and each run's line); default: a temporary one")
    args = parser.parse_args()
    tiny = args.tiny or args.device == "cpu"
    shapes = TINY if tiny else SHAPES
    names = args.shapes.split(",") if args.shapes else list(shapes)
    if unknown := [name for name in names if name not in shapes]:
        parser.error(f"--shapes: {', '.join(unknown)} not among {', '.join(shapes)}")
    grid = grid_runs(tiny)
    print(json.dumps({"device": "cpu" if tiny else torch.cuda.get_device_name(0), "steps": args.steps,
                      "workload": TINY_WORKLOAD if tiny else WORKLOAD, "grid": list(grid),
                      "vllm_installed": find_spec("vllm") is not None}), flush=True)
    runs = set(args.runs.split(",")) if args.runs else None
    if runs and (unknown := runs - {"chosen", ADVISED, *grid}):
        parser.error(f"--runs: {', '.join(sorted(unknown))} not among chosen, {ADVISED}, {', '.join(grid)}")
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() if args.workdir is None else nullcontext(args.workdir) as tmp:
        if args.lengths == "variable":  # every process draws from the first: each run of a shape the same lengths
            rows = 4 if tiny else 128
            cap = 16 if tiny else 1024
            forced_lengths.write_draws(forced_lengths.draw_lengths(4 * rows * (args.steps + 1), cap, LENGTHS_SIGMA),
                                       tmp)
        for name in names:
            run_shape(name, shapes[name], tmp, tiny, args.steps, grid, runs, args.run_dominated)


if __name__ == "__main__":
    main()
