"""The memory estimate under the train engine's options: offload and LoRA lower it as the engines do."""

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.engines.configs import TrainEngineConfig
from flowrl.plan.resources import ModelShape, Workload, estimate, gpu_placement
from fakes import ROLE_CLASSES
from test_resources import INPUTS, QWEN05B

SHAPE = ModelShape.from_config(QWEN05B, 2)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def per_gpu(gpus=2, **options):
    """The estimate with the actor's engine options (the reference runs on the same engine config)."""
    placement = gpu_placement(("actor", "rollout", "ref"), ("rollout",), gpus=gpus)
    plan = fl.compile_plan(grpo, placement, INPUTS, ROLE_CLASSES)
    work = Workload(rows=256, micro_batch_size=16, seq_len=1024)
    actor = TrainEngineConfig.model_validate({"logprob_chunk_tokens": 4096, **options})
    return estimate(plan, SHAPE, work, {"actor": actor, "ref": actor})["global"]


def test_lora_params_of_qwen2_5_0_5b_by_hand():
    # per layer and rank: q 896+896, k 896+128, v 896+128, o 896+896, gate/up 896+4864 each, down 4864+896
    per_layer = 1792 + 1024 + 1024 + 1792 + 3 * 5760
    assert SHAPE.lora_params(8, TARGETS) == 24 * 8 * per_layer == 4_399_104


def test_each_option_lowers_the_actor_and_lora_frees_the_reference():
    full = per_gpu()
    total = {name: sum(parts.values()) for name, parts in full.items()}
    offload = per_gpu(offload_params=True)["actor"]
    assert offload["optimizer"] == 0 and sum(offload.values()) < total["actor"]
    layer = (SHAPE.num_params - SHAPE.embedding_params()) // 24
    assert offload["weights"] == (SHAPE.embedding_params() + 2 * layer) * 2  # the root and two layers unsharded
    optimizer = per_gpu(offload_optimizer=True)["actor"]
    assert optimizer["optimizer"] < full["actor"]["optimizer"] and optimizer["weights"] == full["actor"]["weights"]
    lora = per_gpu(lora_rank=8, lora_target_modules=list(TARGETS))
    assert lora["actor"]["weights"] == full["actor"]["weights"]
    assert lora["actor"]["optimizer"] == 2 * 4_399_104 * 2 // 2  # AdamW's moments of the adapters only
    assert lora["actor"]["gradients"] == 4_399_104 * 2 // 2
    assert lora["ref"]["weights"] == 0 and full["ref"]["weights"] > 0  # the actor's module, adapters off


def test_each_engine_config_owns_its_estimate():
    class Measured(TrainEngineConfig):  # an engine that knows its own footprint
        def estimate_memory(self, shape, load, *, trainable=True, base_lent=False):
            return {"weights": 7 if trainable else 3, "ranks": load.ranks}

    placement = gpu_placement(("actor", "rollout", "ref"), ("rollout",), gpus=2)
    plan = fl.compile_plan(grpo, placement, INPUTS, ROLE_CLASSES)
    work = Workload(rows=256, micro_batch_size=16, seq_len=1024)
    per_gpu = estimate(plan, SHAPE, work, {"actor": Measured(), "ref": Measured()})["global"]
    assert per_gpu["actor"] == {"weights": 7, "ranks": 2} and per_gpu["ref"] == {"weights": 3, "ranks": 2}
    assert set(per_gpu["rollout"]) == {"weights", "kv_cache"}  # not given: the default rollout engine's


def test_a_runs_estimate_asks_each_roles_own_engine_config():
    from flowrl.algorithms import ppo
    from flowrl.config import load_run_config
    from flowrl.config.candidate import engines as role_engines
    from flowrl.runtime.layout.planning import make_plan
    from fakes import ParityTask

    cfg = load_run_config(None, ["train.device=cuda", "roles.actor.lora_rank=8",
                                 "roles.critic.offload_optimizer=true"])
    engines = role_engines(cfg, make_plan(cfg, ppo, ParityTask(), gpus=2))
    assert set(engines) == {"actor", "ref", "critic", "rollout"}
    assert engines["actor"].lends_base() and not engines["critic"].lends_base()  # the actor's LoRA, not the critic's
    assert engines["critic"].offload_optimizer and not engines["actor"].offload_optimizer
