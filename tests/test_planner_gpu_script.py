"""benchmarks/planner_one_gpu.py's parts on CPU (the whole script: `--device cpu`, two minutes a shape, run by
hand): the grid leaves out an engine that is not installed, the chosen engine is read from the written config
with its mode, and the summary's bars on hand figures (the audit's 1.5B: hf_static 9.2 s, vLLM graphs 10.6 s,
eager 24.9 s a step)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import planner_grid  # noqa: E402
import planner_one_gpu as bench  # noqa: E402


def test_an_engine_that_is_not_installed_is_left_out_of_the_grid(monkeypatch):
    monkeypatch.setattr(bench, "find_spec", lambda name: None)
    assert set(bench.grid_runs(tiny=False)) == {"hf_static", "hf_static ckpt", "hf_static ckpt+offload"}
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


def test_a_run_reports_its_node_medians_and_the_refined_cost_model(tmp_path, monkeypatch):
    """What the device table is re-measured from: each node's median seconds after the first step, and the chosen
    run's measured-over-predicted ratios and refined model from its plan.json (flowrl.plan.calibrate.record)."""
    import json
    import subprocess

    rows = [{"timing_s/step": 9.0, "timing_s/generate": 8.0, "memory/peak_gib": 3.0},  # compiles: left out
            {"timing_s/step": 2.0, "timing_s/generate": 1.0, "timing_s/update": 0.5, "memory/peak_gib": 4.0},
            {"timing_s/step": 4.0, "timing_s/generate": 3.0, "timing_s/update": 0.7, "memory/peak_gib": 3.5}]
    record = {"measured": {"node_ratio": {"generate": 0.8}}, "refined": {"device": "H100-80G",
                                                                       "scale": {"generate": 0.8}, "fixed_s": 0.1}}

    def fake_run(cmd, **kwargs):
        out = Path(cmd[cmd.index("--output-dir") + 1])
        out.mkdir(parents=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if "--config" in cmd:
            (out / "plan.json").write_text(json.dumps(record))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    clock = iter([100.0, 212.5])  # the process's whole wall time, what a device call is planned from
    monkeypatch.setattr(bench.time, "monotonic", lambda: next(clock))
    grid = bench.train(tmp_path / "m", tmp_path / "grid", 3, [], [])
    monkeypatch.undo()
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert grid["s_step"] == 3.0 and grid["peak_gib"] == 4.0 and grid["wall_s"] == 112.5
    assert grid["node_s"] == {"generate": 2.0, "step": 3.0, "update": 0.6} and "refined" not in grid
    chosen = bench.train(tmp_path / "m", tmp_path / "chosen", 3, [], [], config=tmp_path / "plan.yaml")
    assert chosen["node_ratio"] == {"generate": 0.8} and chosen["refined"]["scale"] == {"generate": 0.8}


def test_a_shapes_runs_span_calls_and_the_last_call_sums_them_all(tmp_path, monkeypatch, capsys):
    """--runs and --workdir: a 7B shape's grid does not fit one device call. The model is written once, each call
    runs only the runs it names, and a call's summary reads the lines every earlier call kept in the folder."""
    import json

    made, trained = [], []
    monkeypatch.setattr(bench, "write_model", lambda folder, *a: made.append(folder) or
                        (Path(folder).mkdir(parents=True), (Path(folder) / "config.json").write_text("{}")))
    plans, outs = [], []
    monkeypatch.setattr(bench, "plan", lambda folder, out, cluster, workload: plans.append(out) or out.touch() or {
        "roles": {"rollout": {"engine": "hf_static"}},
        "plan": {"predicted": {"layout": "colocated 1", "step_s": 4.0, "peak_gib": {"global": 10.0}}}})
    times = {"chosen": 4.4, "hf_static": 4.0, "hf_static ckpt+offload": 5.0}

    def fake_train(folder, out, steps, workload, extra, config=None):
        label = "chosen" if config else next(k for k, v in bench.GRID.items() if all(e in extra for e in v)
                                             and len(v) == len(extra) - 1)
        trained.append(label)
        outs.append(out)
        out.mkdir()
        return {"ok": True, "oom": False, "s_step": times[label], "peak_gib": 10.5, "error": ""}

    monkeypatch.setattr(bench, "train", fake_train)
    grid = {k: bench.GRID[k] for k in ("hf_static", "hf_static ckpt+offload")}
    bench.run_shape("0.5B", {}, str(tmp_path), False, 2, grid, {"chosen"})
    bench.run_shape("0.5B", {}, str(tmp_path), False, 2, grid, {"hf_static"})
    capsys.readouterr()
    bench.run_shape("0.5B", {}, str(tmp_path), False, 2, grid, {"hf_static ckpt+offload"}, run_dominated=True)
    assert len(made) == 1 and trained == ["chosen", "hf_static", "hf_static ckpt+offload"]
    bench.run_shape("0.5B", {}, str(tmp_path), False, 2, grid, {"chosen"})  # again, after a fix: its own files
    assert len(set(plans)) == 2 and len(set(outs)) == 4
    last = [json.loads(line) for line in capsys.readouterr().out.splitlines()][-1]
    assert last["summary"] and last["best_grid"] == "hf_static" and last["ratio"] == 4.4 / 4.0
    assert last["step_over_predicted"] == 4.4 / 4.0 and last["peak_over_predicted"] == 1.05


def test_hf_static_runs_as_hf_static_lengths_only_where_lengths_are_drawn(monkeypatch):
    monkeypatch.delenv(bench.forced_lengths.LENGTHS_ENV, raising=False)
    assert bench.forced("hf_static") == []
    monkeypatch.setenv(bench.forced_lengths.LENGTHS_ENV, "/draws/lengths.json")
    assert bench.forced("hf_static") == ["roles.rollout.engine=hf_static_lengths"]
    assert bench.forced("vllm graphs") == [] and bench.forced("vllm eager") == []  # vLLM's plugin forces them


def test_the_model_is_written_in_a_child_process_and_loads(tmp_path):
    """write_model draws the checkpoint in a spawned process (on the GPU there, so none of its memory stays in the
    harness beside the runs); the folder it leaves loads through transformers with the shape asked for."""
    from transformers import AutoConfig

    shape = bench.TINY["tiny-32"]
    bench.write_model(tmp_path / "m", shape, bench.torch.float32, "cpu")
    config = AutoConfig.from_pretrained(tmp_path / "m")
    assert (config.hidden_size, config.num_hidden_layers) == (shape["hidden_size"], shape["num_hidden_layers"])


def test_writing_the_model_has_a_deadline(tmp_path):
    """A write that outlives its deadline is killed and named, never waited on for ever."""
    import pytest

    with pytest.raises(SystemExit, match="writing the m model took over 0 s"):
        bench.write_model(tmp_path / "m", bench.TINY["tiny-32"], bench.torch.float32, "cpu", timeout_s=0.01)


def test_a_row_that_only_adds_recompute_and_offload_to_a_base_that_ran_is_skipped(tmp_path, monkeypatch, capsys):
    """DOMINATED: 'hf_static ckpt+offload' runs where neither 'hf_static ckpt' nor 'hf_static' ran to its end
    (7B), and a row is skipped where a row of its chain ran (it cannot be the grid's best): 'vllm graphs ckpt'
    and, two links up, 'vllm ckpt+offload' after 'vllm graphs 0.5 sleep1' ran; --run-dominated runs it anyway."""
    import json

    monkeypatch.setattr(bench, "write_model", lambda folder, *a: (Path(folder).mkdir(parents=True),
                                                                   (Path(folder) / "config.json").write_text("{}")))
    fits = {"hf_static": False, "hf_static ckpt": False, "vllm graphs 0.5 sleep1": True}
    trained = []

    def fake_train(folder, out, steps, workload, extra, config=None):
        label = next(k for k, v in bench.GRID.items() if all(e in extra for e in v) and len(v) == len(extra) - 1)
        trained.append(label)
        ok = fits.get(label, True)
        return {"ok": ok, "oom": not ok, "s_step": 5.0 if ok else None, "peak_gib": 10.0, "error": ""}

    monkeypatch.setattr(bench, "train", fake_train)
    bench.run_shape("7B", {}, str(tmp_path), False, 2, bench.GRID, set(bench.GRID))
    assert trained == ["hf_static", "vllm graphs 0.5 sleep1", "hf_static ckpt", "hf_static ckpt+offload",
                       "vllm eager 0.5 sleep1"]
    skipped = [r for r in map(json.loads, capsys.readouterr().out.splitlines()) if "skipped" in r]
    assert [r["run"] for r in skipped] == ["vllm graphs ckpt", "vllm ckpt+offload"]
    assert all(r["skipped"].startswith("vllm graphs 0.5 sleep1 ran to its end") for r in skipped)
    trained.clear()
    bench.run_shape("7B", {}, str(tmp_path), False, 2, bench.GRID, {"vllm ckpt+offload"}, run_dominated=True)
    assert trained == ["vllm ckpt+offload"]


def test_a_base_row_near_the_cards_memory_does_not_rule_its_variant_out(monkeypatch):
    """A base that peaked above PRESSED of the card may have been slowed by the allocator: its variant runs."""
    class Props:
        total_memory = 80 * 2**30

    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_properties", lambda i: Props())
    assert planner_grid.unpressed(71.9) and not planner_grid.unpressed(72.0) and not planner_grid.unpressed(None)


REFUSED_7B = ("flowrl: error: placement: pool 'global' needs about 78.0 GiB per GPU at its peak (predicted for "
              "colocated 1; vllm graphs tp1x1 mem 0.5 sleep 1; micro 64; ckpt, offload-opt), more than 95% of a GPU's "
              "79.2 GiB; it would fit with roles.actor.lora_rank=64; or roles.actor.max_tokens_per_micro_batch=65536 + "
              "roles.ref.max_tokens_per_micro_batch=65536 (`flowrl plan ALGO --cluster found --explain` chooses among "
              "them) (or train.memory_check=false to try anyway)")
LORA_ONLY = ("flowrl: error: placement: pool 'global' needs about 85.7 GiB per GPU at its peak (...); it would fit "
             "with roles.actor.lora_rank=64 (`flowrl plan ALGO --cluster found --explain` chooses among them)")


def test_the_advice_a_user_follows_keeps_the_math():
    """The first set a refusal names without LoRA (7B's vLLM row, 2026-12-08's refusal text); none where LoRA
    alone would fit or nothing is advised."""
    assert planner_grid.advice_values(REFUSED_7B) == ["roles.actor.max_tokens_per_micro_batch=65536",
                                               "roles.ref.max_tokens_per_micro_batch=65536"]
    assert planner_grid.advice_values(LORA_ONLY) is None
    assert planner_grid.advice_values("flowrl: error: CUDA out of memory") is None


def test_an_engine_whose_grid_rows_were_all_refused_gets_the_row_its_last_refusal_advises(tmp_path, monkeypatch,
                                                                                           capsys):
    """7B: every hf_static row is refused naming LoRA alone (no row: the math stays), every vLLM graphs row is
    refused, the last one naming a token budget: one more row, 'vllm ckpt+offload + advice', runs with the last
    row's values and the budget, and counts in the summary; an engine with a row that ran gets none."""
    import json

    monkeypatch.setattr(bench, "write_model", lambda folder, *a: (Path(folder).mkdir(parents=True),
                                                                   (Path(folder) / "config.json").write_text("{}")))
    monkeypatch.setattr(bench, "plan", lambda folder, out, cluster, workload: out.touch() or {
        "roles": {"rollout": {"engine": "vllm", "enforce_eager": False}},
        "plan": {"predicted": {"layout": "colocated 1", "step_s": 40.0, "peak_gib": {"global": 74.0}}}})
    errors = {"vllm ckpt+offload": REFUSED_7B, "vllm graphs 0.5 sleep1": "flowrl: error: placement: vLLM would "
              "not start: gpu_memory_utilization=0.5 of the card is not free beside the train engines' 56.7 GiB"}
    trained = []

    def fake_train(folder, out, steps, workload, extra, config=None):
        if config:
            return {"ok": True, "oom": False, "s_step": 24.0, "peak_gib": 70.0, "error": ""}
        label = next((k for k, v in bench.GRID.items() if all(e in extra for e in v) and len(v) == len(extra) - 1),
                     "advised")
        trained.append((label, [e for e in extra if e != "plan.predicted.step_s=0"]))
        if label == "advised":
            return {"ok": True, "oom": False, "s_step": 25.0, "peak_gib": 71.0, "error": ""}
        if label == "vllm eager 0.5 sleep1":
            return {"ok": True, "oom": False, "s_step": 40.0, "peak_gib": 71.0, "error": ""}
        return {"ok": False, "oom": False, "s_step": None, "peak_gib": None,
                "error": errors.get(label, LORA_ONLY)}

    monkeypatch.setattr(bench, "train", fake_train)
    bench.run_shape("7B", {}, str(tmp_path), False, 2, bench.GRID)
    advised = [values for label, values in trained if label == "advised"]
    assert advised == [[*bench.GRID["vllm ckpt+offload"], "roles.actor.max_tokens_per_micro_batch=65536",
                        "roles.ref.max_tokens_per_micro_batch=65536"]]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    row = next(r for r in lines if r.get("run") == "vllm ckpt+offload + advice")
    assert row["engine"] == "vllm graphs" and row["values"] == advised[0]
    last = lines[-1]
    assert last["best_grid"] == "vllm ckpt+offload + advice" and last["ratio"] == 24.0 / 25.0
    assert last["fastest_engine"] == "vllm graphs" and last["engine_ok"]
    capsys.readouterr()
    bench.run_shape("7B", {}, str(tmp_path), False, 2, bench.GRID, {bench.ADVISED})  # kept: not run again
    assert len([label for label, _ in trained if label == "advised"]) == 1
