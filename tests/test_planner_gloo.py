"""The planner's choice run for real: `flowrl plan ALGO --cluster NxH100-80G --write` then torchrun with N CPU
ranks over gloo (the tiny model) on the written config; the run completes and records predicted against
measured (plan/* metrics, plan.json)."""

import json
import subprocess
import sys

import pytest

import cli_process


@pytest.mark.parametrize("algo,ranks", [("grpo", 2), ("rloo", 2), ("grpo", 4)])
def test_the_chosen_layout_runs_over_gloo_and_records_its_prediction(tmp_path, algo, ranks):
    chosen = tmp_path / "chosen.json"
    plan = cli_process.run("plan", algo, "--cluster", f"{ranks}xH100-80G", "--write", str(chosen), "--set",
                           "train.batch_size=8", cwd=tmp_path, timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    written = json.loads(chosen.read_text())
    assert sum(p["world_size"] for p in written["placement"]["pools"]) == ranks
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "-m", "flowrl", "train",
           algo, "--config", str(chosen), "--set", "train.device=cpu", "--steps", "2", "--no-progress",
           "--output-dir", str(tmp_path / "run")]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    predicted = written["plan"]["predicted"]
    for row in rows[-2:]:
        assert row["plan/predicted_step_s"] == predicted["step_s"]
        assert row["plan/step_ratio"] == pytest.approx(row["timing_s/step"] / predicted["step_s"])
        assert row["memory/peak_gib"] > 0
    saved = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert saved["predicted"] == predicted and saved["measured"]["step_s"] > 0 and saved["refined"]["scale"]
