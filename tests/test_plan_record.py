"""A run records its plan's prediction against what it measured (flowrl.runtime.layout.plan_record) and writes the cost
model refined from its own steps, which the next plan takes (`flowrl plan --costs RUN/plan.json`)."""

import json
import statistics
from importlib.util import find_spec

import pytest

from flowrl.config import load_run_config
from flowrl.plan.calibrate import PlanSection, Prediction, load_refined
from flowrl.plan.cluster import ClusterConfig
from flowrl.runtime.layout import auto_plan
from flowrl.runtime.data_tasks import run_task
from flowrl.runtime.trainer import resolve_algorithm, train


def test_a_run_records_predicted_against_measured_and_the_next_plan_uses_its_costs(tmp_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", "train.steps=3", "checkpoint.every=0"])
    algo, task, cluster = resolve_algorithm(cfg.algorithm), run_task(cfg), ClusterConfig.parse("1xH100-80G")
    _, values = auto_plan.choose(cfg, algo, task, cluster)
    pred = Prediction.model_validate(values["plan.predicted"])
    history = train(cfg.model_copy(update={"plan": PlanSection(predicted=pred)}), progress=False)
    for row in history:
        assert row["plan/predicted_step_s"] == pred.step_s
        assert row["plan/step_ratio"] == row["timing_s/step"] / pred.step_s
        assert row["plan/peak_ratio"] == row["memory/peak_gib"] / max(pred.peak_gib.values()) and row["memory/peak_gib"] > 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in logged if "timing_s/step" in row]
    assert len(steps) == 3
    for row in steps:  # the metrics file carries both: predicted and measured step time and peak memory
        assert row["plan/predicted_step_s"] == pred.step_s and row["timing_s/step"] > 0
        assert row["plan/predicted_peak_gib"] == max(pred.peak_gib.values()) and row["memory/peak_gib"] > 0
        assert row["plan/step_ratio"] == pytest.approx(row["timing_s/step"] / pred.step_s)
        assert row["plan/peak_ratio"] == pytest.approx(row["memory/peak_gib"] / max(pred.peak_gib.values()))
    saved = json.loads((tmp_path / "run" / "plan.json").read_text())
    generate = next(n for n in pred.nodes if n.category == "generate")
    # the median over steps 2 and 3 (the first compiles) of measured over predicted generation seconds
    ratio = statistics.median(r[f"timing_s/{generate.name}"] for r in history[1:]) / generate.seconds
    assert abs(saved["refined"]["scale"]["generate"] - ratio) <= 1e-9 * ratio
    assert saved["measured"]["step_s"] == statistics.median(r["timing_s/step"] for r in history[1:])
    costs = load_refined(str(tmp_path / "run" / "plan.json"))
    assert costs.scaled("generate", 1.0) == saved["refined"]["scale"]["generate"]
    _, again = auto_plan.choose(cfg, algo, task, cluster, costs=costs)
    assert again["plan.predicted"]["scale"] == saved["refined"]["scale"]  # the next plan runs on the run's costs


def test_a_plan_picks_no_engine_that_is_not_installed(tmp_path, monkeypatch):
    """With vLLM absent the chosen rollout engine is hf_static, and the explain table scores no vLLM layout."""
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "model.dtype=bfloat16"])
    algo, task, cluster = resolve_algorithm(cfg.algorithm), run_task(cfg), ClusterConfig.parse("1xH100-80G")
    installed = auto_plan.choose(cfg, algo, task, cluster)[0]
    monkeypatch.setattr(auto_plan, "find_spec", lambda name: None if name == "vllm" else object())
    absent = auto_plan.choose(cfg, algo, task, cluster)[0]
    assert {s.cand.engine for s in absent.scored} == {"hf_static"}
    assert {s.cand.engine for s in installed.scored} == ({"hf_static", "vllm"} if find_spec("vllm") else {"hf_static"})
