"""`flowrl plot RUN [RUN ...]`: a run's metrics.jsonl as one PNG of six panels (reward, eval accuracy, KL,
response length, entropy, step time by node), several runs on shared axes, with matplotlib's Agg canvas (no
display, no pyplot state).

Beside the PNG a sidecar JSON (same name, .json) records what was drawn: each panel's series (run, key, colour,
the (step, value) points) and where each panel's axes lie in the PNG's pixels with their data limits, so a
reader (tests/test_plotting.py) can check the picture's pixels against the metrics.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean",)),
    ("eval accuracy", ("eval/reward/mean",)),
    # the first a run logs: distillation's KL to the teacher, the loss's, the reward's
    ("KL", ("actor/distill_kl", "actor/kl_loss", "reward/kl", "actor/approx_kl")),
    ("response length", ("response_length/mean",)),
    ("entropy", ("actor/entropy",)),
    ("step time by node (s)", ()),  # every timing_s/<node> but gc and the whole step
)
"""Each panel's title and the metric keys it plots (the first one the run has)."""

MARKER = "flowrl plot"
STYLES = ("-", "--", ":", "-.")


def read_metrics(run: str) -> tuple[str, dict[str, list[tuple[int, float]]]]:
    """(label, {key: [(step, value), ...]}) from RUN/metrics.jsonl (or the file itself); one line names a bad
    file or row."""
    path = Path(run)
    file = path / "metrics.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{run}: no metrics.jsonl (give a run's train.output_dir or its metrics.jsonl)")
    series: dict[str, list[tuple[int, float]]] = {}
    for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise ValueError(f"{file} line {number}: not a metrics row (a JSON object with a step)") from None
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                series.setdefault(key, []).append((step, float(value)))
    return (path.name if path.is_dir() else path.parent.name) or str(path), series


def panel_series(metrics: dict[str, list[tuple[int, float]]], keys: tuple[str, ...]) -> dict[str, list]:
    """The series a panel draws from one run: the first of `keys` it has, or (keys empty) each node's time."""
    if keys:
        key = next((k for k in keys if k in metrics), None)
        return {key: metrics[key]} if key else {}
    return {k.removeprefix("timing_s/"): points for k, points in sorted(metrics.items())
            if k.startswith("timing_s/") and not k.startswith("timing_s/gc/") and k != "timing_s/step"}


def unique_labels(runs: list[str], labels: list[str]) -> list[str]:
    return labels if len(set(labels)) == len(labels) else [str(Path(run)) for run in runs]


def plot_runs(runs: list[str], output: str) -> Path:
    """Draw every run's panels into `output` (a PNG) and its sidecar; returns the PNG's path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    out = Path(output)
    sidecar = out.with_suffix(".json")
    if out.exists() and not (sidecar.is_file() and MARKER in sidecar.read_text(errors="replace")[:200]):
        raise ValueError(f"--output {output}: exists and is not a plot flowrl plot wrote; choose another file")
    loaded = [read_metrics(run) for run in runs]
    labels = unique_labels(runs, [label for label, _ in loaded])
    figure = Figure(figsize=(15, 8), dpi=100)
    canvas = FigureCanvasAgg(figure)
    axes = figure.subplots(2, 3).flatten()
    colours = [f"C{i % 10}" for i in range(10)]
    drawn: list[dict[str, Any]] = []
    nodes = sorted({node for _, metrics in loaded for node in panel_series(metrics, ())})
    for ax, (title, keys) in zip(axes, PANELS):
        lines = []
        for r, (label, (_, metrics)) in enumerate(zip(labels, loaded)):
            for name, points in panel_series(metrics, keys).items():
                colour = colours[nodes.index(name) % 10] if not keys else colours[r % 10]
                style = STYLES[r % len(STYLES)] if not keys else "-"
                steps, values = zip(*points)
                ax.plot(steps, values, style, color=colour, marker="o", markersize=4,
                        label=f"{label}: {name}" if not keys or len(loaded) > 1 else name)
                lines.append({"run": label, "key": name, "colour": _hex(colour), "points": [list(p) for p in points]})
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if lines:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        drawn.append({"title": title, "series": lines})
    figure.tight_layout()
    canvas.draw()
    height = figure.bbox.height
    for ax, panel in zip(axes, drawn):
        box = ax.get_window_extent()
        legend = ax.get_legend().get_window_extent() if ax.get_legend() else None
        panel.update(pixels=[box.x0, height - box.y1, box.x1, height - box.y0], xlim=list(ax.get_xlim()),
                     ylim=list(ax.get_ylim()), legend=legend and [legend.x0, height - legend.y1, legend.x1,
                                                                  height - legend.y0])
    out.parent.mkdir(parents=True, exist_ok=True)
    canvas.print_png(str(out))
    sidecar.write_text(json.dumps({"written_by": MARKER, "runs": [str(r) for r in runs], "panels": drawn}, indent=1))
    return out


def _hex(colour: str) -> str:
    from matplotlib.colors import to_hex

    return to_hex(colour)
