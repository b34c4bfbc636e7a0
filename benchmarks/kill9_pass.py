"""A kill -9 pass over the kinds of run tests/test_fault_injection.py does not cover: a data set scored by
forked scorer processes, sft, rm and a streamed (fl.buffer stream=True) run. Each kind: an uninterrupted run,
then one killed (SIGKILL) at random points after steps 2, 4 and 6 (checkpoint writes included), then rerun to
its end; the rerun's metrics must equal the uninterrupted run's (timing keys aside), each step logged once.
Streamed runs: its thread streamer samples on its own thread, so the rows it trains on depend on timing; there
every step is logged once and the run ends, and equality is reported, not required (docs/reliability.md).

    python benchmarks/kill9_pass.py [KIND ...]      # prints one line per kind; exit 1 if one failed
"""

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import cli_process  # noqa: E402

STEPS = 8
COMMON = [f"train.steps={STEPS}", "checkpoint.every=1", "eval.every=0", "checkpoint.export=false",
          "train.batch_size=8"]


def data_set(folder):
    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": f"{i}+0="}],
             "reward_model": {"ground_truth": str(i)}} for i in range(16)]
    (folder / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "scorers.py").write_text("def exact(solution_str, ground_truth, **_):\n"
                                       "    return float(solution_str.strip().endswith(ground_truth))\n")
    return ["grpo", f"data.train_files={folder / 't.jsonl'}", f"data.reward={folder / 'scorers.py'}:exact",
            "data.reward_workers=2", "algo.group_size=2", "roles.rollout.max_new_tokens=3", "data.shuffle=false"]


def sft(folder):
    rng = random.Random(0)
    rows = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a, b in
            ((rng.randint(0, 9), rng.randint(0, 9)) for _ in range(32))]
    (folder / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["sft", f"data.train_files={folder / 'sft.jsonl'}", "roles.actor.mini_batch_size=8",
            "roles.actor.micro_batch_size=4"]


def rm(folder):
    rows = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": "=" * len(str(a + b))}
            for a in range(6) for b in range(6)]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["rm", f"data.train_files={folder / 'pairs.jsonl'}", "roles.learned_reward.mini_batch_size=8",
            "roles.learned_reward.micro_batch_size=8"]


def streamed(folder):
    return ["grpo_async", "algo.stream=true", "algo.max_staleness=1", "roles.rollout.partial=true",
            "roles.rollout.max_in_flight=8", "algo.group_size=2"]


KINDS = {"data_set": data_set, "sft": sft, "rm": rm, "streamed": streamed}


def command(kind, folder, run):
    algorithm, *sets = KINDS[kind](folder)
    return ["train", algorithm, "--no-progress", "--output-dir", str(folder / run),
            *sum((["--set", s] for s in [*COMMON, *sets]), [])]


def metrics(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("timing_s/")} for row in rows]


def logged(run):
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def kill_after(args, folder, run, step, delay):
    proc = cli_process.start(args, cwd=folder)
    deadline = time.monotonic() + 300
    while proc.is_alive() and logged(run) < step and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    killed = proc.is_alive()
    proc.kill()
    proc.join()
    return killed


def one(kind, folder):
    straight = cli_process.run(*command(kind, folder, "straight"), cwd=folder, timeout=600)
    if straight.returncode != 0:
        return False, f"uninterrupted run failed: {straight.stderr.strip().splitlines()[-1:]}"
    rng = random.Random(0)
    args = command(kind, folder, "killed")
    kills = [kill_after(args, folder, folder / "killed", step, rng.uniform(0.0, 0.3)) for step in (2, 4, 6)]
    last = cli_process.run(*args, cwd=folder, timeout=600)
    steps = [row["step"] for row in metrics(folder / "killed")]
    equal = metrics(folder / "killed") == metrics(folder / "straight")
    ok = last.returncode in (0, 3) and steps == list(range(1, STEPS + 1)) and (equal or kind == "streamed")
    return ok, (f"{sum(kills)} of 3 kills effective, rerun exit {last.returncode}, steps logged {steps}, "
                f"metrics equal to the uninterrupted run's: {equal}")


def main(kinds):
    failed = 0
    for kind in kinds or KINDS:
        with tempfile.TemporaryDirectory() as tmp:
            ok, said = one(kind, Path(tmp))
        print(f"{kind}: {'ok' if ok else 'FAILED'}: {said}", flush=True)
        failed += not ok
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
