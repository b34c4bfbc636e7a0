"""benchmarks/planner_one_gpu.py's parts on CPU (the whole script: `--device cpu`, two minutes a shape, run by
hand): the grid leaves out an engine that is not installed, the chosen engine is read from the written config
with its mode, and the summary's bars on hand figures (the audit's 1.5B: hf_static 9.2 s, vLLM graphs 10.6 s,
eager 24.9 s a step)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import planner_one_gpu as bench  # noqa: E402


def test_an_engine_that_is_not_installed_is_left_out_of_the_grid(monkeypatch):
    monkeypatch.setattr(bench, "find_spec", lambda name: None)
    assert set(bench.grid_runs(tiny=False)) == {"hf_static", "hf_static ckpt+offload"}
    monkeypatch.setattr(bench, "find_spec", lambda name: object())
    assert {bench.engine_of(v) for v in bench.grid_runs(tiny=False).values()} == \
        {"hf_static", "vllm graphs", "vllm eager"}
    assert {bench.engine_of(v) for v in bench.grid_runs(tiny=True).values()} == {"hf_static"}  # sleep: CUDA only


def test_the_chosen_engine_and_mode_come_from_the_written_config():
    assert bench.chosen_engine({}) == "hf_static"
    assert bench.chosen_engine({"roles": {"rollout": {"engine": "vllm", "enforce_eager": False}}}) == "vllm graphs"
    assert bench.chosen_engine({"roles": {"rollout": {"engine": "vllm"}}}) == "vllm eager"  # vLLM's default


def test_the_summary_bars_on_hand_figures():
    grid = {"hf_static": {"ok": True, "s_step": 9.2, "engine": "hf_static"},
            "vllm graphs 0.5 sleep1": {"ok": True, "s_step": 10.6, "engine": "vllm graphs"},
            "vllm eager 0.5 sleep1": {"ok": True, "s_step": 24.9, "engine": "vllm eager"},
            "vllm ckpt+offload": {"ok": False, "s_step": None, "engine": "vllm graphs"}}
    chosen = {"s_step": 10.6, "peak_gib": 60.0, "engine": "vllm graphs", "oom": False,
              "predicted": {"step_s": 10.0, "peak_gib": {"global": 50.0}}}
    out = bench.summary("1.5B", chosen, grid)
    assert out["best_grid"] == "hf_static" and out["ratio"] == 10.6 / 9.2 and not out["ratio_ok"]  # 1.152 > 1.15
    assert out["fastest_engine"] == "hf_static" and not out["engine_ok"]
    assert out["step_over_predicted"] == 1.06 and out["peak_over_predicted"] == 1.2 and not out["peak_ok"]
    fast = bench.summary("1.5B", {**chosen, "s_step": 9.0, "engine": "hf_static"}, grid)
    assert fast["ratio_ok"] and fast["engine_ok"]
