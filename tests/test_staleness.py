"""Staleness measured per row: behind fl.buffer each trained row records the weights that sampled its oldest token
(`policy_version`) and the weights it trained (`trained_version`), in the batch and in the rollout dumps; at
k = 2 with streamed partial rollouts on the tiny model (one process, and Ray over 2 rollout replicas) no row is more than 2 versions stale, the per-step counts
`buffer/rows_staleness_<s>` are the dumps' own, and what was dropped is counted."""

import json
from collections import Counter

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train

K2 = ["algorithm=grpo_async", "task.name=fakes:ParityTask", "train.batch_size=4", "algo.group_size=4",
      "train.steps=4", "algo.max_staleness=2", "algo.stream=true", "roles.rollout.partial=true",
      "roles.rollout.max_new_tokens=8", "eval.every=0", "checkpoint.every=0", "checkpoint.export=false",
      "debug.dump_rollouts_every=1"]


TWO_REPLICAS = ['executor.name=ray', 'algo.kl_coef=0.0', 'placement={"pools": [{"name": "train", "roles": ["actor"]}, '
                '{"name": "gen", "roles": ["rollout"], "world_size": 2}]}']


def test_k2_streamed_partial_rows_are_at_most_two_versions_stale(tmp_path):
    check_bounded(tmp_path, train(load_run_config(None, [*K2, f"train.output_dir={tmp_path}"]), progress=False))


def test_k2_on_ray_over_two_rollout_replicas_is_bounded_alike(ray_local, tmp_path):
    run = load_run_config(None, [*K2, *TWO_REPLICAS, f"train.output_dir={tmp_path}"])
    check_bounded(tmp_path, train(run, progress=False))


def check_bounded(tmp_path, history):
    staleness = []
    for step, logged in enumerate(history, start=1):
        rows = [json.loads(line) for line in (tmp_path / "rollouts" / f"step_{step:06d}.jsonl").open()]
        assert {row["trained_version"] for row in rows} == {step - 1}  # step s trains the weights of s - 1 updates
        here = Counter(row["trained_version"] - row["policy_version"] for row in rows)
        assert set(here) <= {0, 1, 2} and min(here) >= 0
        assert {s: logged[f"buffer/rows_staleness_{s}"] for s in range(3)} == {s: here[s] for s in range(3)}
        assert logged["buffer/staleness/max"] == max(here) and len(rows) + logged["buffer/dropped"] == 16
        staleness.append(here)
    assert staleness[0] == {0: 16}  # the first step trains what the first weights sampled
    assert any(here[1] + here[2] for here in staleness[1:])  # later steps train rows sampled ahead, under older weights
