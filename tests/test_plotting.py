"""`flowrl plot`: the PNG read back, each plotted point found in its series' colour where the panel's axes put
its (step, value), and the series equal to the runs' metrics.jsonl."""

import json

import numpy as np
import pytest

from flowrl import cli
from flowrl.runtime.observe.plotting import PANELS

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.image import imread  # noqa: E402

RUNS = {  # two runs' metrics: step 0 evaluation alone, as the trainer logs it, then steps with every key
    "grpo-a": [{"eval/reward/mean": 0.0, "step": 0}] + [
        {"reward/mean": 0.1 * s, "actor/kl_loss": 0.01 * s, "response_length/mean": 10.0 + s, "actor/entropy": 2.0 - 0.1 * s,
         "timing_s/rollout.generate": 0.5, "timing_s/actor.update": 1.0 + 0.1 * s, "timing_s/gc/actor.update": 0.01,
         "timing_s/step": 2.0, "step": s, **({"eval/reward/mean": 0.2 * s} if s % 2 == 0 else {})} for s in range(1, 7)],
    "ppo-b": [{"reward/mean": 0.6 - 0.05 * s, "reward/kl": 0.02, "response_length/mean": 14.0 - s,
               "actor/entropy": 1.0, "timing_s/critic.update": 0.8, "step": s} for s in range(1, 5)],
}


def write_runs(tmp_path):
    folders = []
    for name, rows in RUNS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        folders.append(str(tmp_path / name))
    return folders


def expected(panel_keys):
    """Each run's points for a panel, from RUNS (as the test reads the metrics, not as the plot does)."""
    series = {}
    for name, rows in RUNS.items():
        keys = [k for k in panel_keys if any(k in r for r in rows)][:1] if panel_keys else \
            sorted({k for r in rows for k in r if k.startswith("timing_s/") and "/gc/" not in k and k != "timing_s/step"})
        for key in keys:
            series[(name, key.removeprefix("timing_s/"))] = [[r["step"], r[key]] for r in rows if key in r]
    return series


def pixel(panel, step, value):
    (x0, y0, x1, y1), (a, b), (lo, hi) = panel["pixels"], panel["xlim"], panel["ylim"]
    return x0 + (step - a) / (b - a) * (x1 - x0), y1 - (value - lo) / (hi - lo) * (y1 - y0)


def found(image, colour, x, y, radius=3):
    window = image[int(round(y)) - radius:int(round(y)) + radius + 1, int(round(x)) - radius:int(round(x)) + radius + 1, :3]
    return bool((np.abs(window - np.array(to_rgb(colour))).max(axis=-1) < 0.08).any())


def in_box(box, x, y, margin=4):
    return box is not None and box[0] - margin <= x <= box[2] + margin and box[1] - margin <= y <= box[3] + margin


def test_the_png_shows_each_runs_metrics_in_its_panels(tmp_path, capsys):
    output = tmp_path / "plot.png"
    assert cli.main(["plot", *write_runs(tmp_path), "--output", str(output)]) == 0
    image = imread(output)
    drawn = json.loads(output.with_suffix(".json").read_text())["panels"]
    assert [p["title"] for p in drawn] == [title for title, _ in PANELS]
    checked = flipped = 0
    for panel, (_, keys) in zip(drawn, PANELS):
        assert {(s["run"], s["key"]): s["points"] for s in panel["series"]} == expected(keys)
        points = [(s["colour"], *pixel(panel, *p)) for s in panel["series"] for p in s["points"]]
        for colour, x, y in points:
            crowded = any(c != colour and abs(x - u) < 8 and abs(y - v) < 8 for c, u, v in points)
            if in_box(panel["legend"], x, y) or crowded:
                continue  # under the legend, or another series' marker drawn over it
            assert found(image, colour, x, y), f"{panel['title']}: no {colour} at ({x:.0f}, {y:.0f})"
            checked += 1
            (x0, y0, x1, y1) = panel["pixels"]
            flipped += found(image, colour, x, y0 + y1 - y)  # the check upside down mostly finds nothing
    assert checked >= 40 and flipped < checked / 2


def test_a_missing_run_or_a_bad_row_is_one_line(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path / "nowhere")]) == cli.EXIT_USER_ERROR
    assert "nowhere: no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n')
    assert cli.main(["plot", str(tmp_path), "--output", str(tmp_path / "p.png")]) == cli.EXIT_USER_ERROR
    assert "metrics.jsonl line 2: not a metrics row" in capsys.readouterr().err


def test_a_file_flowrl_plot_did_not_write_is_not_overwritten(tmp_path, capsys):
    mine = tmp_path / "photo.png"
    mine.write_bytes(b"mine")
    assert cli.main(["plot", *write_runs(tmp_path), "--output", str(mine)]) == cli.EXIT_USER_ERROR
    assert mine.read_bytes() == b"mine"
    assert cli.main(["plot", str(tmp_path / "ppo-b"), "--output", str(tmp_path / "p.png")]) == 0
    assert cli.main(["plot", str(tmp_path / "ppo-b"), "--output", str(tmp_path / "p.png")]) == 0  # its own: redrawn
