"""The planner plans: pools for a GPU count, a memory estimate per GPU checked against hand-computed bytes."""

import pytest

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.engines.configs import TrainEngineConfig
from flowrl.plan.resources import GIB, ModelShape, Workload, check_fits, estimate, gpu_placement
from fakes import ROLE_CLASSES
import cli_process

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
QWEN05B = dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)


def test_the_parameter_count_of_qwen2_5_0_5b_from_its_config():
    assert ModelShape.from_config(QWEN05B, 2).num_params == 494_032_768  # the published count


def test_the_estimate_per_component_by_hand():
    shape = ModelShape(num_params=1000, num_layers=2, hidden_size=8, num_kv_heads=2, head_dim=4, vocab_size=50,
                       dtype_bytes=2)
    work = Workload(rows=16, micro_batch_size=4, seq_len=10)
    placement = gpu_placement(("actor", "rollout", "ref"), ("rollout",), gpus=2)
    plan = fl.compile_plan(grpo, placement, INPUTS, ROLE_CLASSES)
    actor = TrainEngineConfig.model_validate({"logprob_chunk_tokens": 16})  # the engine's own option
    per_gpu = estimate(plan, shape, work, {"actor": actor, "ref": actor})["global"]
    # actor over 2 ranks: weights 1000 * 2 B / 2 = 1000; gradients 1000; AdamW moments 2000;
    # activations: 4 rows / 2 ranks * 10 tokens * 2 layers * 8 hidden * 34 B = 10880; logits 3 * 16 * 50 * 4 = 9600
    assert per_gpu["actor"] == {"weights": 1000, "gradients": 1000, "optimizer": 2000, "activations": 10880,
                                "logits": 9600}
    # rollout: its own copy (2 ranks: no shared module) 2000 B; KV: 8 rows * 10 * 2 layers * 2 * 2 heads * 4 * 2 B
    assert per_gpu["rollout"] == {"weights": 2000, "kv_cache": 8 * 10 * 2 * 2 * 2 * 4 * 2}
    # ref: weights 1000; forward activations 2 * 10 * 2 * 8 * 4 B = 1280
    assert per_gpu["ref"] == {"weights": 1000, "activations": 1280}
    one_gpu = fl.compile_plan(grpo, gpu_placement(("actor", "rollout", "ref"), ("rollout",), gpus=1), INPUTS,
                              ROLE_CLASSES)
    assert estimate(one_gpu, shape, work)["global"]["rollout"]["weights"] == 0  # the hybrid engine's shared module


def test_a_placement_that_cannot_fit_is_refused_naming_the_pool():
    shape = ModelShape.from_config(QWEN05B, 2)
    plan = fl.compile_plan(grpo, gpu_placement(("actor", "rollout", "ref"), ("rollout",), gpus=4, split=0.25),
                           INPUTS, ROLE_CLASSES)
    assert {p.name: p.world_size for p in plan.pools.values()} == {"train": 3, "generate": 1}
    per_gpu = estimate(plan, shape, Workload(rows=512, micro_batch_size=96, seq_len=384))
    check_fits(plan, per_gpu, 80 * GIB)
    with pytest.raises(fl.PlanError, match=r"pool 'train' needs about .* GiB per GPU \(actor .*, ref .*\), but a "
                                           r"GPU has 8 GiB"):
        check_fits(plan, per_gpu, 8 * GIB)


def test_flowrl_plan_for_a_gpu_count(tmp_path):
    done = cli_process.run("plan", "grpo", "--gpus", "8", "--nodes", "2", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "8 GPUs on 2 node(s)" in done.stdout and "pool global (8 x cuda)" in done.stdout
    # the planner's phase model (flowrl.plan.memory) judges the pools, as `flowrl train` does: the pool's peak and
    # each phase of a step (the per-role table of flowrl.plan.resources is only the fallback now)
    assert "memory per GPU (the planner's phase model; layout colocated 8; hf_static" in done.stdout
    assert "pool global (8 x cuda): peak" in done.stdout and "update" in done.stdout and "plan grpo:" in done.stdout
    bad = cli_process.run("plan", "grpo", "--gpus", "3", "--nodes", "2", cwd=tmp_path, timeout=300)
    assert bad.returncode == 2 and "--gpus 3 must be a positive multiple of --nodes 2" in bad.stderr


def test_placement_auto_builds_the_pools_from_the_cluster_gpus():
    """executor.name=ray on CUDA: every model role on all the cluster's GPUs, or split by executor.rollout_share."""
    from flowrl.config import load_run_config
    from flowrl.runtime.trainer import make_plan
    from fakes import ParityTask

    cfg = load_run_config(None, ["train.device=cuda", "executor.name=ray"])
    plan = make_plan(cfg, grpo, ParityTask(), gpus=4)
    assert {p.name: (p.world_size, p.device) for p in plan.pools.values()} == {"global": (4, "cuda")}
    split = make_plan(load_run_config(None, ["train.device=cuda", "executor.name=ray", "executor.rollout_share=0.25"]),
                      grpo, ParityTask(), gpus=4)
    assert {r: (p.name, p.world_size) for r, p in split.pools.items()} == {
        "actor": ("train", 3), "ref": ("train", 3), "rollout": ("generate", 1)}
    from flowrl.runtime.executor_configs import executor_config

    with pytest.warns(UserWarning, match="executor.rollout_share has no effect"):
        local = load_run_config(None, ["executor.rollout_share=0.5"])
        executor_config(local).warn_no_effect(local)
    with pytest.warns(UserWarning, match="executor.ship_files has no effect: executor.name is not 'ray'"):
        local = load_run_config(None, ["executor.ship_files=false"])
        executor_config(local).warn_no_effect(local)


def test_train_checks_its_plan_against_the_memory_of_a_gpu(tmp_path):
    from flowrl.config import load_run_config
    from flowrl.runtime.layout.memory_check import check_memory
    from flowrl.runtime.trainer import make_plan
    from fakes import ParityTask

    (tmp_path / "config.json").write_text(__import__("json").dumps(QWEN05B))
    cfg = load_run_config(None, ["train.device=cuda", "executor.name=ray", "train.batch_size=64"])
    plan = make_plan(cfg, grpo, ParityTask(), gpus=2)
    check_memory(cfg, plan, tmp_path, 80 * GIB)
    check_memory(cfg, plan, tmp_path, None)  # unknown: nothing checked
    # judged by the planner's phase model: the pool's peak phase against the planner's 95% of a card
    with pytest.raises(fl.PlanError, match=r"pool 'global' needs about .* GiB per GPU at its peak \(predicted for "
                                           r"colocated 2; hf_static.*\), more than 95% of a GPU's 2.0 GiB.*"
                                           r"train.memory_check=false to try anyway"):
        check_memory(cfg, plan, tmp_path, 2 * GIB)
