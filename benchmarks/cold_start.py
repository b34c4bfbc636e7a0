"""Cold start: seconds from a fresh `flowrl train` process to its first finished steps (issue 21: <= 90 s to
the first finished step for the Qwen2.5-0.5B shape on a cold machine).

The parent writes a random-weight checkpoint of the Qwen2.5-0.5B shape (--tiny: benchmarks.common.SMALL),
then starts `python -m flowrl train` on it in a child process with empty torch.compile caches
(TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR in a new temporary folder: nothing compiled by an earlier
run is reused) and follows the child's output_dir/metrics.jsonl. Each row it finds is printed at once as a
JSON line with the seconds since the child started (`since_start_s`) and the row's timings; row "step" 0 is
the evaluation before the first step (eval.every > 0). The last line is the summary
(`first_step_s`: start to the first finished step). The defaults are the measured H200 run: the static-cache
engine (roles.rollout.engine=hf_static, compiled on CUDA), compiled train passes (roles.actor.compile) and a
200-prompt greedy evaluation at step 0; --set adds or overrides any value.

    PYTHONPATH=. python benchmarks/cold_start.py                      # the H200 run
    PYTHONPATH=. python benchmarks/cold_start.py --cache-dir /tmp/cc; ... --cache-dir /tmp/cc   # cold, warm
    PYTHONPATH=. python benchmarks/cold_start.py --device cpu --tiny --steps 1 --new-tokens 16  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

POLL_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="the tiny model of the same architecture (CPU smoke)")
    p.add_argument("--steps", type=int, default=2, help="train.steps")
    p.add_argument("--prompts", type=int, default=64, help="train.batch_size (prompts a step; 8 samples each)")
    p.add_argument("--new-tokens", type=int, default=256, help="roles.rollout.max_new_tokens")
    p.add_argument("--eval-prompts", type=int, default=200, help="eval.prompts (0: no evaluation)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more flowrl config values")
    p.add_argument("--child-log", help="keep the child's output here (TORCH_LOGS=recompiles in the environment "
                                       "adds each recompile's reason)")
    p.add_argument("--cache-dir", help="the torch.compile caches' folder, kept (default: a new temporary one); "
                                       "a second run with the same folder measures a warm start")
    p.add_argument("--timeout-s", type=float, default=540.0, help="the child is killed after this long")
    p.add_argument("--stacks-every", type=float, default=0.0,
                   help="the child writes every thread's stack to its log this often (seconds; 0: never): where a "
                        "start that finishes no step spends its time")
    return p.parse_args(argv)


def flowrl_sets(args: argparse.Namespace, model: str, out: str) -> list[str]:
    evaluation = [f"eval.every={args.steps}", f"eval.prompts={args.eval_prompts}"] \
        if args.eval_prompts else ["eval.every=0"]
    return [f"model.path={model}", f"model.dtype={'bfloat16' if args.device == 'cuda' else 'float32'}",
            f"train.device={args.device}", f"train.steps={args.steps}", f"train.batch_size={args.prompts}",
            "algo.group_size=8", f"roles.rollout.max_new_tokens={args.new_tokens}",
            "roles.rollout.engine=hf_static", "roles.actor.compile=true", f"train.output_dir={out}",
            "checkpoint.every=0", "checkpoint.export=false", "checkpoint.resume=false", "train.loggers=console,jsonl",
            *evaluation, *args.set]


def build_model(folder: str, tiny: bool) -> str:
    import torch

    from benchmarks.common import QWEN05B, SMALL, qwen_model
    from flowrl.data.builtin.arithmetic import ArithmeticTask

    return qwen_model(folder, ArithmeticTask.chars, SMALL if tiny else QWEN05B, 2048,
                      torch.float32 if tiny else torch.bfloat16)


def follow(child: subprocess.Popen, metrics: Path, start: float, deadline: float) -> list[dict]:
    """Prints each new row of `metrics` as it appears, until the child exits or the deadline passes."""
    rows: list[dict] = []
    while True:
        done = child.poll() is not None
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        for line in lines[len(rows):]:
            if not line.endswith("}"):
                break  # a row being written: read it on the next poll
            row = {**json.loads(line), "since_start_s": round(time.perf_counter() - start, 1)}
            rows.append(row)
            print(json.dumps({"event": "row", "at_step": row.get("step"), "since_start_s": row["since_start_s"],
                              **_timings(row)}), flush=True)
        if done:
            return rows
        if time.perf_counter() > deadline:
            child.kill()
            child.wait()
            print(json.dumps({"event": "timeout", "since_start_s": round(time.perf_counter() - start, 1)}),
                  flush=True)
            return rows
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(tmp + "/model", args.tiny)
        caches = Path(args.cache_dir or Path(tmp) / "compile_caches")
        cache_mb = _size_mb(caches)
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
               "TRITON_CACHE_DIR": str(caches / "triton"), "PYTHONUNBUFFERED": "1",
               # each compile's start and end, timestamped, in the child's log: where the seconds go (the H200
               # run of 2026-12-04 finished no step in 230 s and its log said nothing about why)
               "TORCH_LOGS": os.environ.get("TORCH_LOGS", "dynamo,recompiles"),
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        command = [sys.executable, *_entry(args.stacks_every), "train", "grpo", "--no-progress",
                   *(f"--set={s}" for s in flowrl_sets(args, model, tmp + "/out"))]
        print(json.dumps({"event": "start", "command": command[1:]}), flush=True)
        start = time.perf_counter()
        log_path = Path(args.child_log or Path(tmp) / "child.log")
        with open(log_path, "w") as log:
            child = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            rows = follow(child, Path(tmp) / "out" / "metrics.jsonl", start, start + args.timeout_s)
        steps = [r for r in rows if r.get("step", 0) >= 1]
        tail = log_path.read_text().splitlines()[-5:] if child.returncode else []
        print(json.dumps({
            "event": "summary", "returncode": child.returncode, "total_s": round(time.perf_counter() - start, 1),
            "eval_done_s": rows[0]["since_start_s"] if rows and rows[0].get("step") == 0 else None,
            "first_step_s": steps[0]["since_start_s"] if steps else None,
            "first_step_timing_s": _timings(steps[0]) if steps else {},
            "last_step_timing_s": _timings(steps[-1]) if len(steps) > 1 else {}, "error_tail": tail,
            "cache_mb_before": cache_mb, "cache_mb_after": _size_mb(caches)}), flush=True)


def _entry(stacks_every: float) -> list[str]:
    """`python -m flowrl`, or the same behind benchmarks/sample_stacks.py (a stack dump every `stacks_every` s)."""
    return [str(Path(__file__).with_name("sample_stacks.py")), str(stacks_every), "flowrl"] if stacks_every \
        else ["-m", "flowrl"]


def _size_mb(folder: Path) -> float:
    return round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20, 1) \
        if folder.exists() else 0.0


def _timings(row: dict) -> dict:
    """The row's node timings (timing_s/...), rounded."""
    return {k: round(v, 2) for k, v in row.items() if k.startswith("timing_s/")}


if __name__ == "__main__":
    main()
