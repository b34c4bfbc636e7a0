"""roles.rollout.engine=vllm_server at tensor_parallel_size k on the Ray executor: a rollout pool of N GPUs runs
N / k server replicas, one pool rank each, whose Ray bundle holds the k GPUs its server spans
(flowrl.runtime.layout.planning.tensor_parallel_ranks); a k that does not divide N is one line at plan time."""

import pytest

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.runtime.layout.planning import make_plan
from fakes import ParityTask

POOLS = ('placement={{"pools": [{{"name": "train", "roles": ["actor", "ref"], "device": "cuda"}}, '
         '{{"name": "gen", "roles": ["rollout"], "world_size": {}, "device": "cuda"}}]}}')
SERVER = ["train.device=cuda", "roles.rollout.engine=vllm_server"]


def plan(*overrides: str):
    return make_plan(load_run_config(None, [*SERVER, *overrides]), grpo, ParityTask())


def test_a_pool_of_4_gpus_at_tensor_parallel_2_runs_2_servers_of_2_gpus():
    from flowrl.runtime.ray.cluster import bundle, worker_options

    pool = plan("executor.name=ray", POOLS.format(4), "roles.rollout.tensor_parallel_size=2").pools["rollout"]
    assert (pool.world_size, pool.gpus_per_rank) == (2, 2)
    assert bundle(pool) == {"CPU": 0.01, "GPU": 2.0}  # 2 bundles of 2 GPUs: the pool's 4
    assert worker_options(pool, None, 0)["num_gpus"] == 2  # the server's CUDA_VISIBLE_DEVICES: its 2 GPUs
    train = plan("executor.name=ray", POOLS.format(4), "roles.rollout.tensor_parallel_size=2").pools["actor"]
    assert (train.world_size, train.gpus_per_rank) == (1, 1)


def test_tensor_parallel_1_and_other_executors_keep_one_gpu_a_rank():
    pool = plan("executor.name=ray", POOLS.format(4)).pools["rollout"]
    assert (pool.world_size, pool.gpus_per_rank) == (4, 1)
    pool = plan(POOLS.format(4), "roles.rollout.tensor_parallel_size=2").pools["rollout"]  # torchrun: one GPU a rank
    assert (pool.world_size, pool.gpus_per_rank) == (4, 1)


def test_a_layout_that_does_not_divide_is_one_line_at_plan_time():
    with pytest.raises(fl.PlanError) as err:
        plan("executor.name=ray", POOLS.format(3), "roles.rollout.tensor_parallel_size=2")
    assert str(err.value) == ("placement: pool 'gen': roles.rollout.tensor_parallel_size=2 must divide the rollout "
                              "pool's 3 ranks (tensor_parallel_size x data-parallel replicas = ranks)")


def test_an_in_process_tensor_parallel_layout_on_cpu_that_does_not_divide_is_one_line():
    """engine=vllm at tensor_parallel_size 2 on a CPU pool of 3 ranks (its replicas span 2 ranks each): one line
    before any worker starts (on Ray the engine's own check would fail inside a worker, a remote traceback)."""
    cpu = ('placement={"pools": [{"name": "train", "roles": ["actor", "ref"]}, '
           '{"name": "gen", "roles": ["rollout"], "world_size": 3}]}')
    with pytest.raises(fl.PlanError) as err:
        make_plan(load_run_config(None, ["roles.rollout.engine=vllm", "roles.rollout.tensor_parallel_size=2",
                                         "executor.name=ray", cpu]), grpo, ParityTask())
    assert str(err.value).startswith("placement: pool 'gen': roles.rollout.tensor_parallel_size=2 must divide")
    plan = make_plan(load_run_config(None, ["roles.rollout.engine=vllm", "roles.rollout.tensor_parallel_size=3",
                                            "executor.name=ray", cpu]), grpo, ParityTask())
    assert (plan.pools["rollout"].world_size, plan.pools["rollout"].gpus_per_rank) == (3, 1)  # 1 replica of 3
