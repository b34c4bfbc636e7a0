"""Generation dumps (debug.dump_rollouts_every, debug.dump_eval) and profiling (debug.profile_steps) in short
GRPO runs on the tiny model, on CPU."""

import csv
import json

import pytest
import torch
from tensordict import TensorDict

from flowrl.config import load_run_config
from flowrl.engines.models.folders import load_tokenizer
from flowrl.runtime.store.dumps import Dumps
from flowrl.runtime.observe.profiling import node_table
from flowrl.runtime.trainer import train

datasets = pytest.importorskip("datasets", reason="reading the dumps back needs datasets: pip install -e '.[data]'")

GRPO = ["train.batch_size=2", "algo.group_size=2", "algo.kl_coef=0", "roles.rollout.max_new_tokens=4",
        "checkpoint.export=false"]


def test_rollout_and_eval_dumps_hold_each_rows_fields_and_read_back_with_datasets(tmp_path):
    cfg = load_run_config(None, GRPO + ["train.steps=2", "debug.dump_rollouts_every=1", "debug.dump_eval=true",
                                        "eval.every=2", "eval.prompts=3", f"train.output_dir={tmp_path}"])
    history = train(cfg, progress=False)
    for step, logged in enumerate(history, start=1):
        rows = datasets.Dataset.from_json(str(tmp_path / "rollouts" / f"step_{step:06d}.jsonl"))
        assert set(rows.column_names) == {"prompt", "response", "reward", "advantages", "policy_version",
                                          "trained_version", "step", "uid"}
        assert len(rows) == 4 and set(rows["step"]) == {step} and set(rows["policy_version"]) == {step - 1}
        assert sum(rows["reward"]) / 4 == pytest.approx(logged["reward/mean"], abs=1e-6)
        for row in rows:  # GRPO: one advantage per response token (at most 4), the row's normalised score
            assert 1 <= len(row["advantages"]) <= 4 and len(set(row["advantages"])) == 1
        groups = [rows["advantages"][i][0] + rows["advantages"][i + 1][0] for i in (0, 2)]
        assert groups == pytest.approx([0.0, 0.0], abs=1e-5)  # a group's two advantages sum to 0
        assert all(p.endswith("=") for p in rows["prompt"])  # "a+b="
    for step in (0, 2):  # before the first step and after the last
        rows = datasets.Dataset.from_json(str(tmp_path / "eval" / f"step_{step:06d}.jsonl"))
        assert len(rows) == 3 and set(rows["advantages"]) == {None}
    assert sum(rows["reward"]) / 3 == pytest.approx(history[-1]["eval/reward/mean"], abs=1e-6)


def test_a_dump_file_stops_at_its_row_and_byte_bounds(tmp_path, tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    ids = torch.tensor([tok.encode("1+2=", add_special_tokens=False)] * 5)
    batch = TensorDict(prompt_ids=ids, prompt_mask=torch.ones_like(ids), response_ids=ids, uid=torch.arange(5),
                       response_mask=torch.ones_like(ids), scores=torch.arange(5.0), batch_size=[5])
    path = Dumps(tmp_path, tok, max_rows=3).write("rollouts", batch, 7)
    lines = path.read_text().splitlines()
    assert path.name == "step_000007.jsonl" and [json.loads(line)["reward"] for line in lines] == [0.0, 1.0, 2.0]
    size = len(lines[0].encode()) + 1
    path = Dumps(tmp_path, tok, max_bytes=2 * size + 1).write("rollouts", batch, 8)
    assert len(path.read_text().splitlines()) == 2 and path.stat().st_size <= 2 * size + 1


def test_node_table_by_hand():
    steps = [{"timing_s/step": 2.0, "timing_s/a": 1.5, "timing_s/b": 0.5, "reward/mean": 1.0},
             {"timing_s/step": 2.0, "timing_s/a": 0.5, "timing_s/b": 1.5}]
    assert node_table(steps) == [{"node": "a", "total_s": 2.0, "mean_s": 1.0, "share": 0.5},
                                 {"node": "b", "total_s": 2.0, "mean_s": 1.0, "share": 0.5}]


def test_profile_steps_write_a_chrome_trace_and_a_node_time_table(tmp_path):
    cfg = load_run_config(None, GRPO + ["train.steps=3", "debug.profile_steps=[2, 3]", "eval.every=0",
                                        f"train.output_dir={tmp_path}"])
    history = train(cfg, progress=False)
    trace = json.loads((tmp_path / "profile" / "trace.json").read_text())
    names = {event.get("name") for event in trace["traceEvents"]}
    assert {"flowrl step 2", "flowrl step 3"} <= names and "flowrl step 1" not in names
    assert any("aten::" in str(name) for name in names)  # the model's operators ran inside
    assert {"rollout.generate", "actor.update"} <= names  # each graph node's range (flowrl.runtime.scheduling)
    with open(tmp_path / "profile" / "node_times.csv") as f:
        table = {row["node"]: row for row in csv.DictReader(f)}
    assert {"rollout.generate", "reward.score", "group_advantage", "actor.update"} <= set(table)
    profiled = history[1:]
    for node, row in table.items():
        assert float(row["total_s"]) == pytest.approx(sum(s[f"timing_s/{node}"] for s in profiled))
        assert 0 <= float(row["share"]) <= 1
    assert "Self CPU" in (tmp_path / "profile" / "ops.txt").read_text()


@pytest.mark.parametrize("steps", ["[3, 2]", "[0, 1]", "[1]"])
def test_a_bad_profile_range_is_named(steps):
    with pytest.raises(ValueError, match="debug.profile_steps: .*1 <= first <= last"):
        load_run_config(None, [f"debug.profile_steps={steps}"])
