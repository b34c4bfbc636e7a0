"""At k = 0 (fully on-policy) one run trains alike on every executor: one process, two torchrun (gloo) ranks, and
Ray with the rollout streamed from 1, 2 and 4 replicas (flowrl.runtime.offpolicy.spread_runner) on a pool of its own.

The engine is deterministic per sample (rank_parity.SampleSeededRollout: each sample generated alone, seeded by
its prompt's uid and its place in the group), so which process, rank or replica samples a prompt, and when,
changes no token. grpo_async at max_staleness=0 streams where it can (the local executor, Ray) and samples the
whole batch with `generate` under torchrun, where fl.buffer(stream=True) runs in one process only; streamed or
not, a k = 0 step draws, samples and trains its own prompts within the step. Compared: every metric that is
exact over the whole batch, each step, and the final weights.
"""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train
import rank_parity  # noqa: F401  (registers the sample-seeded rollout roles)

ray = pytest.importorskip("ray")

COMMON = ["algorithm=grpo_async", "task.name=fakes:ParityTask", "train.steps=3", "train.batch_size=4",
          "algo.group_size=4", "algo.max_staleness=0", "algo.kl_coef=0.0", "roles.rollout.max_new_tokens=4",
          "roles.actor.mini_batch_size=16", "roles.actor.micro_batch_size=8", "roles.actor.forward_micro_batch_size=8",
          "eval.every=0", "checkpoint.every=0"]
STREAMED = ['roles={"rollout": "sample_seeded_rollout"}', "algo.stream=true"]
GENERATED = ['roles={"rollout": "sample_seeded_generate"}', "algo.stream=false"]
REPLICAS = ('placement={{"pools": [{{"name": "train", "roles": ["actor"]}}, '
            '{{"name": "gen", "roles": ["rollout"], "world_size": {}}}]}}')
EXACT = ("reward/mean", "response_length/mean", "response_length/clip_ratio", "actor/grad_norm",
         "actor/ratio_mean", "actor/clipfrac", "actor/approx_kl")


def run(folder: Path, *overrides: str) -> list[dict]:
    return train(load_run_config(None, [*COMMON, *overrides, f"train.output_dir={folder}"]), progress=False)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    return folder, run(folder, *STREAMED)


TORCHRUN_RUNS = {"k0": [*COMMON, *GENERATED]}  # trained in conftest.torchrun_parity's one launch


@pytest.fixture(scope="module")
def torchrun_ranks(torchrun_parity):
    """Two gloo ranks sharing the pool: each samples half the prompts (rank_parity.main)."""
    folder, results = torchrun_parity
    return folder / "k0", results["k0"]


def exact(rows: list[dict]) -> list[dict]:
    assert isinstance(rows, list), rows  # not an error line
    return [{k: row[k] for k in EXACT if k in row} for row in rows]


def assert_same_run(got, want) -> None:
    (got_folder, got_rows), (want_folder, want_rows) = got, want
    a, b = exact(got_rows), exact(want_rows)
    assert [sorted(r) for r in a] == [sorted(r) for r in b] and len(a) == 3
    for step, (x, y) in enumerate(zip(a, b), start=1):
        assert x == pytest.approx(y, abs=1e-6), f"step {step}"
    mine = AutoModelForCausalLM.from_pretrained(got_folder / "final").state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(want_folder / "final").state_dict()
    assert all(torch.allclose(mine[k], theirs[k], atol=1e-5) for k in theirs)


def test_streamed_and_generated_k0_steps_are_one_run(one_process, tmp_path):
    folder, rows = one_process
    assert all(row["buffer/staleness/max"] == 0 and row["buffer/dropped"] == 0 for row in rows)
    assert len({row["reward/mean"] for row in rows}) > 1 or len({row["actor/grad_norm"] for row in rows}) > 1
    assert_same_run((tmp_path, run(tmp_path, *GENERATED)), one_process)


def test_torchrun_two_ranks_equal_one_process(torchrun_ranks, one_process):
    assert_same_run(torchrun_ranks, one_process)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_ray_with_1_2_and_4_rollout_replicas_equals_one_process(ray_local, one_process, tmp_path, replicas):
    rows = run(tmp_path, *STREAMED, "executor.name=ray", REPLICAS.format(replicas))
    assert all(row["buffer/dropped"] == 0 for row in rows)
    assert_same_run((tmp_path, rows), one_process)


def test_ray_with_two_replicas_of_two_ranks_each_equals_one_process(ray_local, one_process, tmp_path):
    """A pool of 4 ranks at tensor parallel 2 (rank_parity.TwoRankReplicaRollout): 2 replicas, each led by its
    rank 0 (pool ranks 0 and 2, so the groups' mean leader rank is 1 when both serve 2 of a step's 4 groups) with
    its rank 1 stepping the same requests; the trained rows are one process's."""
    rows = run(tmp_path, 'roles={"rollout": "tp2_sample_seeded_rollout"}', "algo.stream=true", "executor.name=ray",
               REPLICAS.format(4))
    assert all(row["buffer/dropped"] == 0 and row["rollout/leader_rank"] == 1.0 for row in rows), rows
    assert_same_run((tmp_path, rows), one_process)
