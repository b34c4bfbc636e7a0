"""A PNG of a run's learning curve from its metrics.jsonl: greedy test accuracy and reward/mean over the run.

    python benchmarks/plot_learning.py runs/smollm2_grpo [runs/smollm2_rloo ...] --output docs/real_model_learning.png

Each RUN is a run's output folder (or its metrics.jsonl); it is labelled by its folder name unless --labels
names it. The x axis is the step, or with --x wall the seconds since the run's start, or with --x train the
steps' own seconds (start-up and evaluation left out), from the wall_clock.jsonl that
benchmarks/real_model_learning.py writes next to metrics.jsonl, or from the metrics rows of
benchmarks/real_model_trl.py. Needs matplotlib
(pip install -e '.[real-model]').
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ACCURACY = "eval/openai/gsm8k/greedy"
REWARD = "reward/mean"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def clock(folder: Path, rows: list[dict], x: str) -> dict[int, float]:
    """{step: seconds} for --x wall or train: from wall_clock.jsonl (benchmarks/real_model_learning.py) or,
    for a run that has none, from the metrics rows themselves (benchmarks/real_model_trl.py writes them)."""
    key = f"{x}_s"
    path = folder / "wall_clock.jsonl"
    source = read_jsonl(path) if path.is_file() else rows
    marks = {r["step"]: r[key] for r in source if key in r}
    if not marks:
        raise ValueError(f"{folder}: --x {x} needs '{key}' in {path.name} or metrics.jsonl (written by "
                         f"benchmarks/real_model_learning.py and real_model_trl.py)")
    return marks


def curves(run: Path, x: str) -> dict[str, tuple[list[float], list[float]]]:
    """{metric: (xs, ys)} for the accuracy and the reward of one run; x is "step", "wall" or "train"."""
    folder = run.parent if run.is_file() else run
    rows = read_jsonl(folder / "metrics.jsonl")
    marks = clock(folder, rows, x) if x != "step" else {r["step"]: r["step"] for r in rows}
    out = {}
    for key in (ACCURACY, REWARD):
        points = [(marks.get(r["step"]), r[key]) for r in rows if key in r]
        points = [(a, b) for a, b in points if a is not None]
        out[key] = ([a for a, _ in points], [b for _, b in points])
    return out


def plot(runs: list[Path], labels: list[str], output: Path, x: str = "step", title: str | None = None) -> Path:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot_learning.py needs matplotlib: pip install -e '.[real-model]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, rew) = plt.subplots(1, 2, figsize=(11, 4))
    top = 0.0
    for run, label in zip(runs, labels):
        data = curves(run, x)
        acc.plot(*data[ACCURACY], marker="o", label=label)
        rew.plot(*data[REWARD], label=label)
        top = max([top, *data[ACCURACY][1], *data[REWARD][1]])
    xlabel = {"wall": "seconds since the start", "train": "training seconds (start-up and evaluation left out)",
              "step": "step"}[x]
    for ax, name in ((acc, "greedy test accuracy (strict #### n)"), (rew, "reward/mean (training samples)")):
        ax.set_xlabel(xlabel)
        ax.set_title(name)
        ax.set_ylim(0, min(1.0, max(0.25, 1.2 * top)))  # small accuracies stay readable
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run output folders (or their metrics.jsonl)")
    parser.add_argument("--output", required=True, type=Path, help="the .png to write")
    parser.add_argument("--labels", nargs="*", help="one label per run (default: the folder names)")
    parser.add_argument("--x", choices=("step", "wall", "train"), default="step")
    parser.add_argument("--title")
    args = parser.parse_args()
    labels = args.labels or [(r.parent if r.is_file() else r).name for r in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"--labels: {len(labels)} labels for {len(args.runs)} runs")
    print(f"wrote {plot(args.runs, labels, args.output, args.x, args.title)}")


if __name__ == "__main__":
    main()
