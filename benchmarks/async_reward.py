"""grpo_async's reward against synchronous GRPO's: the README quick start (built-in arithmetic task and tiny model,
local executor, CPU, 50 steps) per setting and seed.

Settings (`--settings`, comma-separated):
  grpo        synchronous GRPO (`flowrl train grpo`), the reference
  async0      grpo_async, max_staleness 0: its default token-level truncated IS weight pi_old / pi_rollout
              multiplies the loss, and the sampler's logprobs differ from the trainer's by float rounding, so it
              is close to grpo, not equal
  async0_off  the same with `algo.rollout_correction.is_level=off`: grpo's loss, so it must equal grpo exactly
  async0s     k = 0, streamed: streaming's own effect, without staleness
  async1      k = 1, batched
  async1s     k = 1, streamed (`algo.stream=true`)
  async2sp    k = 2, streamed, partial rollouts (`roles.rollout.partial=true`: in-flight responses stop at an
              update and continue under the new weights)

Each run (`train.seed` = seed) prints one JSON line: the mean reward of the last 10 steps, the reward curve as the
mean of each 10 steps, the mean response length of the last 10, steps/s (the first step, which builds and warms up,
left out), mean staleness and dropped rows; a k = 0 setting also says whether its per-step reward, pg_loss and
grad_norm equal grpo's of the same seed bit for bit. At the end one line per setting: mean and sample sd over seeds
of the last-10 reward, and for an async setting its difference to grpo in units of the pooled seed sd and of the sd
of the difference (sqrt(sd_a^2/n_a + sd_g^2/n_g)); "within noise" is |diff| <= 2 sd of the difference (a Welch
t-test where scipy is installed). A seed fixes the tiny model's weights and the prompts, so the paired difference
(per seed, its mean against 2 sd / sqrt(seeds)) is also given. Evaluation, checkpoints and export are off: they do
not change the training (the default 50-step grpo run still logs reward/mean 0.023 -> 0.551). The batched settings
repeat exactly; a streamed run does not (which samples share a generate call, and which groups finish first, depend
on timing), so its seeds vary more.

Usage: OMP_NUM_THREADS=1 python benchmarks/async_reward.py [--steps 50] [--seeds 3] [--first-seed 0]
       [--settings grpo,async1] [--out results.json] [--smoke]
       python benchmarks/async_reward.py --from-log run1.log run2.log   (summarise earlier runs' lines)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train

SETTINGS = {
    "grpo": ["algorithm=grpo"],
    "async0": ["algorithm=grpo_async", "algo.max_staleness=0"],
    "async0_off": ["algorithm=grpo_async", "algo.max_staleness=0", "algo.rollout_correction.is_level=off"],
    "async0s": ["algorithm=grpo_async", "algo.max_staleness=0", "algo.stream=true"],
    "async1": ["algorithm=grpo_async", "algo.max_staleness=1"],
    "async1s": ["algorithm=grpo_async", "algo.max_staleness=1", "algo.stream=true"],
    "async2sp": ["algorithm=grpo_async", "algo.max_staleness=2", "algo.stream=true", "roles.rollout.partial=true"],
}
EXACT_KEYS = ("reward/mean", "actor/pg_loss", "actor/grad_norm")
LAST = 10


def run(setting: str, seed: int, steps: int, folder: Path) -> list[dict[str, float]]:
    """The per-step metrics of one training run."""
    overrides = [f"train.output_dir={folder}", f"train.seed={seed}", f"train.steps={steps}", "eval.every=0",
                 "checkpoint.export=false", "checkpoint.every=0", *SETTINGS[setting]]
    return train(load_run_config(None, overrides), progress=False)


def summarise(setting: str, seed: int, rows: list[dict[str, float]], wall_s: float) -> dict:
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]  # a streamed step may score no group
    timed = rows[1:] or rows
    return {"setting": setting, "seed": seed, "steps": len(rows),
            "reward_last10": round(statistics.fmean(rewards[-LAST:]), 4),
            "reward_first": round(rewards[0], 4),
            "reward_every10": [round(statistics.fmean(rewards[i:i + LAST]), 4) for i in range(0, len(rewards), LAST)],
            "steps_without_reward": len(rows) - len(rewards),
            "steps_per_s": round(len(timed) / sum(r["timing_s/step"] for r in timed), 3),
            "length_last10": round(statistics.fmean(r.get("response_length/mean", 0.0) for r in rows[-LAST:]), 3),
            "staleness": round(statistics.fmean(r.get("buffer/staleness/mean", 0.0) for r in rows), 3),
            "dropped": statistics.fmean(r.get("buffer/dropped", 0.0) for r in rows),
            "wall_s": round(wall_s, 1)}


def exact_match(rows: list[dict[str, float]], reference: list[dict[str, float]]) -> dict:
    """Whether every step's EXACT_KEYS equal the reference run's bit for bit, and the largest reward gap."""
    equal = all(a.get(k) == b.get(k) for a, b in zip(rows, reference) for k in EXACT_KEYS)
    gap = max(abs(a.get("reward/mean", 0.0) - b.get("reward/mean", 0.0)) for a, b in zip(rows, reference))
    return {"equal_to_grpo": equal and len(rows) == len(reference), "max_reward_gap": round(gap, 6)}


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Welch's two-sided p-value where scipy is installed, else None."""
    try:
        from scipy.stats import ttest_ind
    except ImportError:
        return None
    return float(ttest_ind(a, b, equal_var=False).pvalue)


def compare(name: str, runs: list[dict]) -> dict:
    """Mean and sd over seeds of the last-10 reward; for a setting other than grpo its difference to grpo (the
    unpaired verdict, and the paired one over the seeds both ran: a seed fixes the tiny model and the prompts)."""
    mine = {r["seed"]: r["reward_last10"] for r in runs if r["setting"] == name}
    grpo = {r["seed"]: r["reward_last10"] for r in runs if r["setting"] == "grpo"}
    values, reference = list(mine.values()), list(grpo.values())
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    out = {"summary": name, "seeds": len(values), "reward_last10_mean": round(statistics.fmean(values), 4),
           "reward_last10_sd": round(sd, 4),
           "steps_per_s": round(statistics.fmean(r["steps_per_s"] for r in runs if r["setting"] == name), 3)}
    if name == "grpo" or min(len(values), len(reference)) < 2:
        return out  # one seed: no noise to measure
    ref_sd = statistics.stdev(reference)
    diff = statistics.fmean(values) - statistics.fmean(reference)
    pooled = math.sqrt((sd ** 2 + ref_sd ** 2) / 2)
    sd_diff = math.sqrt(sd ** 2 / len(values) + ref_sd ** 2 / len(reference))
    out.update({"diff_to_grpo": round(diff, 4), "diff_in_pooled_sd": round(diff / pooled, 2) if pooled else None,
                "sd_of_diff": round(sd_diff, 4)})
    p = welch_p(values, reference)
    if p is not None:
        out.update({"welch_p": round(p, 4), "within_noise": p >= 0.05})
    else:
        out["within_noise"] = abs(diff) <= 2 * sd_diff
    paired = [mine[seed] - grpo[seed] for seed in sorted(mine.keys() & grpo.keys())]
    if len(paired) > 1:
        sd_paired = statistics.stdev(paired) / math.sqrt(len(paired))
        out.update({"paired_diff": round(statistics.fmean(paired), 4), "paired_sd_of_diff": round(sd_paired, 4),
                    "paired_within_noise": abs(statistics.fmean(paired)) <= 2 * sd_paired})
    return out


def run_all(names: list[str], seeds: range, steps: int) -> list[dict]:
    """Every setting for every seed, seed by seed (grpo first: the k = 0 settings compare against it)."""
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            reference = None
            for name in sorted(names, key=lambda n: n != "grpo"):
                start = time.perf_counter()
                rows = run(name, seed, steps, Path(tmp) / f"{name}_{seed}")
                line = summarise(name, seed, rows, time.perf_counter() - start)
                if name == "grpo":
                    reference = rows
                elif name.startswith("async0") and reference is not None:
                    line.update(exact_match(rows, reference))
                runs.append(line)
                print(json.dumps(line), flush=True)
    return runs


def read_log(paths: list[str]) -> list[dict]:
    """The per-run JSON lines of earlier logs of this script (other lines skipped; a later run of the same
    setting and seed replaces an earlier one)."""
    lines = (line for path in paths for line in Path(path).read_text().splitlines() if line.startswith("{"))
    return list({(r["setting"], r["seed"]): r for r in map(json.loads, lines) if "setting" in r}.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=3, help="runs per setting, train.seed = first-seed, ...")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--settings", default="grpo,async0,async0_off,async0s,async1,async1s,async2sp",
                        help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument("--from-log", nargs="+", default=[], help="run nothing: summarise the per-run lines of "
                                                                    "these logs (an interrupted or split run)")
    parser.add_argument("--out", default="", help="also write every run and the summary to this JSON file")
    parser.add_argument("--smoke", action="store_true", help="2 steps, 1 seed: checks the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.seeds = 2, 1
    names = args.settings.split(",")
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        parser.error(f"--settings: unknown {unknown}; known: {', '.join(SETTINGS)}")
    if args.from_log:
        runs = [r for r in read_log(args.from_log) if r["setting"] in names]
    else:
        runs = run_all(names, range(args.first_seed, args.first_seed + args.seeds), args.steps)
    summary = [compare(n, runs) for n in names if any(r["setting"] == n for r in runs)]
    for line in summary:
        print(json.dumps(line), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
