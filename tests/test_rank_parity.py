"""One run at any world size: two torchrun (gloo) ranks, a 2-rank Ray pool and one process train alike.

The rollout samples each prompt's group from its uid (rank_parity.UidSeededRollout), so which rank draws a
prompt changes no sample; what is left to agree is each executor's per-rank share of the (global) train.*
batch sizes and dynamic sampling (fl.fill) over ranks. The metrics compared are those every executor
computes exactly over the whole batch; a loss or advantage mean is a mean of per-rank means and differs with
the ranks' token counts, so it is left out (the updates agree: grad norms and final weights are compared).
"""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train
from rank_parity import ROLES

ray = pytest.importorskip("ray")

EXACT = ("reward/mean", "response_length/mean", "response_length/clip_ratio", "sampling/kept_fraction",
         "sampling/rounds", "sampling/groups", "actor/grad_norm", "actor/ratio_mean", "actor/clipfrac",
         "actor/approx_kl")
COMMON = ["algorithm=dapo", "task.name=fakes:ParityTask", "train.batch_size=4", "algo.group_size=4",
          "roles.actor.mini_batch_size=16", "roles.actor.micro_batch_size=8", "roles.actor.forward_micro_batch_size=8",
          "eval.every=0", "checkpoint.every=0"]
RUNS = {"split": [*COMMON, "train.steps=3", "algo.dynamic_sampling=false"],
        "fill": [*COMMON, "train.steps=5", "algo.max_sampling_rounds=8"]}
POOL = 'placement={"pools": [{"name": "global", "roles": ["actor", "rollout"], "world_size": 2}]}'


def runs_in(folder: Path, *extra: str) -> dict[str, list[str]]:
    return {name: [*overrides, *extra, f"train.output_dir={folder / name}"] for name, overrides in RUNS.items()}


TORCHRUN_RUNS = RUNS  # both, in conftest.torchrun_parity's one launch of two ranks (beside test_k0_parity's)


@pytest.fixture(scope="module")
def torchrun_runs(torchrun_parity):
    """Both runs on two torchrun ranks (rank_parity.main); a refused run holds its error line."""
    return torchrun_parity


@pytest.fixture(scope="module")
def ray_runs(tmp_path_factory, ray_local):
    """Both runs on one Ray pool of two ranks, on the session's local cluster (conftest.ray_local)."""
    folder = tmp_path_factory.mktemp("ray")
    results = {}
    for name, overrides in runs_in(folder, "executor.name=ray", POOL).items():
        try:
            results[name] = train(load_run_config(None, [*ROLES, *overrides]), progress=False)
        except ValueError as err:  # a refused run
            results[name] = str(err)
    return folder, results


def exact(rows, keys=EXACT):
    assert isinstance(rows, list), rows  # not an error line
    return [{k: row[k] for k in keys if k in row} for row in rows]


def assert_same(rows, expected, keys=EXACT):
    got, want = exact(rows, keys), exact(expected, keys)
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for step, (a, b) in enumerate(zip(got, want), start=1):
        assert a == pytest.approx(b, abs=1e-6), f"step {step}"


def weights(folder: Path):
    return AutoModelForCausalLM.from_pretrained(folder / "final").state_dict()


def test_torchrun_and_a_ray_pool_give_each_rank_the_same_share_of_the_batch_sizes(torchrun_runs, ray_runs):
    """train.* batch sizes are global: 16 responses a step over 2 ranks -> 8 rows, mini-batch 8, micro-batch 4
    and forward micro-batch 4 on each rank, whichever executor (torchrun kept forward_micro_batch_size=8)."""
    rows = ("rank/rows", "rank/mini_batch_size", "rank/micro_batch_size", "rank/forward_micro_batch_size")
    (_, spmd), (_, pool) = torchrun_runs, ray_runs
    for run in (spmd["split"], pool["split"]):
        assert [[row[k] for k in rows] for row in exact(run, rows)] == [[8, 8, 4, 4]] * 3
    assert_same(spmd["split"], pool["split"])
    assert len({row["reward/mean"] for row in spmd["split"]}) > 1  # the policy moves


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    return folder, train(load_run_config(None, [*ROLES, *runs_in(folder)["fill"]]), progress=False)


def test_dynamic_sampling_at_two_ranks_equals_one_process(torchrun_runs, ray_runs, one_process):
    """fl.fill gathers every rank's surviving groups, refills with more rounds, deals them out evenly."""
    folder, alone = one_process
    assert any(row["sampling/rounds"] > 1 for row in alone)  # refilled
    assert any(row["sampling/kept_fraction"] < 1 for row in alone) and all(row["sampling/groups"] == 4 for row in alone)
    final = weights(folder / "fill")
    for where, runs in (torchrun_runs, ray_runs):
        assert_same(runs["fill"], alone)
        theirs = weights(where / "fill")
        assert all(torch.allclose(final[k], theirs[k], atol=1e-5) for k in final)
