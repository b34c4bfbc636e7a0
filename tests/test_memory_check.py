"""One memory model (issue 43.2): `flowrl train`'s check judges the run's configured layout with the planner's
phase model (flowrl.plan.memory), the one `flowrl plan --cluster --explain` prints. Shapes are config.json files
only (no weights); the GPU's memory is the one thing replaced (the Ray executor's query, flowrl.runtime.ray.cluster
.gpu_memory, which is what `flowrl train` asks under executor.name=ray with pools given by hand)."""

import json
from dataclasses import replace

import pytest

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.engines.memory import GIB, ModelShape
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.costs import DEVICES
from flowrl.runtime import trainer
from flowrl.runtime.layout.auto_plan import choose
from flowrl.config.candidate import configured
from flowrl.runtime.layout.memory_check import check_run, judge
from flowrl.runtime.layout.planning import make_plan
from fakes import ParityTask
from test_planner_advice import QWEN25_7B
from test_resources import QWEN05B

# the workload: 16 prompts x 8 samples, 256 prompt + 1024 new tokens
WORKLOAD = ["train.device=cuda", "model.dtype=bfloat16", "train.batch_size=16", "algo.group_size=8",
            "roles.rollout.max_new_tokens=1024", "data.max_prompt_length=256"]


def pools(world: int) -> str:
    return "placement=" + json.dumps({"pools": [{"name": "global", "roles": ["actor", "rollout", "ref"],
                                                 "world_size": world, "device": "cuda"}]})


@pytest.fixture(autouse=True)
def one_node(monkeypatch):
    """No torchrun node size left in the environment by an earlier test: the layouts here are one node's."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


@pytest.fixture
def gpu(monkeypatch):
    """An 80 GiB card as the run's GPU memory query answers; counts the queries."""
    from flowrl.runtime.ray import cluster

    asked = []
    monkeypatch.setattr(cluster, "gpu_memory", lambda: asked.append(1) or 80 * GIB)
    return asked


def run_config(tmp_path, shape: dict, *values: str):
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(shape))
    return load_run_config(None, [*WORKLOAD, "executor.name=ray", f"model.path={tmp_path / 'model'}",
                                  f"train.output_dir={tmp_path / 'out'}", *values])


def test_the_audit_case_is_refused_by_train_naming_the_fixes(tmp_path, gpu):
    """7B with offload_optimizer + checkpointing on one 80 GiB GPU: issue 43's audit (on a27447d) saw the older
    estimate pass it and the run die at 76.8 GiB allocated; the phase model predicts more than the card (its
    update phase), so setup refuses before anything loads, naming what would fit."""
    cfg = run_config(tmp_path, QWEN25_7B, pools(1), "roles.actor.offload_optimizer=true",
                     "model.gradient_checkpointing=true")
    with pytest.raises(fl.PlanError) as err:
        trainer.setup(cfg, grpo, ParityTask())
    line = str(err.value)
    assert "\n" not in line and "pool 'global' needs about" in line and "80.0 GiB" in line
    assert "train.memory_check=false to try anyway" in line and "roles.actor.lora_rank=64" in line
    peak = float(line.split("needs about ")[1].split(" GiB")[0])
    # by hand, the update phase of the one GPU (the highest): 7,615,616,512 parameters x 2 B = 15,231,233,024 B
    # each for the actor's weights, the reference's and the actor's gradients (the moments wait on the CPU);
    # checkpointed activations of a micro-batch of 64 rows x 1280 tokens: the 28 layers' inputs (2 B x 3584) and
    # one compiled layer recomputed (18 h + 6 i B: 18 x 3584 + 6 x 18,944 = 178,176):
    # 81,920 x (28 x 2 x 3584 + 178,176) = 31,037,849,600 B; logits, 4096 tokens at a time, compiled: 6 B a token
    # and vocabulary entry, 6 x 4096 x 152,064 = 3,737,124,864 B; the static KV cache hf_static holds between
    # generations: 128 rows x 1280 tokens x 28 layers x 2 x 4 KV heads x 128 x 2 B = 9,395,240,960 B; 2 GiB overhead
    by_hand = 2 * GIB + 3 * 15_231_233_024 + 31_037_849_600 + 3_737_124_864 + 9_395_240_960
    assert round(by_hand / GIB, 1) == peak == 85.7  # above the card: the run measured 76.8 GiB when it ran out
    assert gpu == [1]


def test_the_05b_defaults_that_ran_out_of_memory_on_an_h100_are_refused(tmp_path, gpu):
    """0.5B, the cuda preset's compiled actor at its default 64-row micro-batches of 256 + 1024 tokens: on an H100
    (2026-12-07) the run died at 77.6 GiB allocated, after the older estimate (34 h bytes a token and layer
    compiled) had put it at 71 GiB and let it start. Compiled layers keep 18 h + 6 i: by hand, 81,920 tokens x
    24 layers x (18 x 896 + 6 x 4864) B = 89,087,016,960 B (83.0 GiB) of activations alone, above the card."""
    assert 81_920 * 24 * (18 * 896 + 6 * 4864) == 89_087_016_960
    cfg = run_config(tmp_path, QWEN05B, pools(1))
    with pytest.raises(fl.PlanError, match=r"pool 'global' needs about 9\d\.\d GiB .* it would fit with "):
        trainer.setup(cfg, grpo, ParityTask())


def test_a_vllm_layout_the_engine_refuses_is_refused_at_check_time(tmp_path, gpu):
    """TP 4 on a pool of 2 GPUs, and TP 4 on 4 GPUs of a model with 14 heads: refused before anything loads
    (the model folder has no weights), with the engine's own reason."""
    vllm = ["roles.rollout.engine=vllm", "roles.rollout.tensor_parallel_size=4"]
    cfg = run_config(tmp_path, QWEN05B, pools(2), *vllm, "train.batch_size=16", "roles.actor.mini_batch_size=128")
    with pytest.raises(fl.PlanError, match=r"^placement: roles.rollout.tensor_parallel_size=4 does not divide the "
                                           r"rollout pool's 2 GPUs \(or train.memory_check=false"):
        trainer.setup(cfg, grpo, ParityTask())
    cfg = run_config(tmp_path, QWEN05B, pools(4), *vllm)
    with pytest.raises(fl.PlanError, match=r"tensor_parallel_size=4 does not divide the model's 14 attention heads"):
        trainer.setup(cfg, grpo, ParityTask())


def test_a_layout_that_fits_has_the_peak_the_planner_prints(tmp_path):
    """0.5B on one H100 with 32-row micro-batches: accepted, and its predicted peak is the figure `flowrl plan
    --cluster 1xH100-80G --explain` prints for the same candidate (Choice.explain's table, every row). (The
    default 64 rows of 1280 tokens are refused: on an H100 they ran out of memory, 2026-12-07.)"""
    card = DEVICES["H100-80G"].memory_bytes
    cfg = run_config(tmp_path, QWEN05B, pools(1), "roles.actor.micro_batch_size=32", "roles.ref.micro_batch_size=32")
    plan = make_plan(cfg, grpo, ParityTask())
    judged = judge(cfg, plan, ModelShape.from_config(QWEN05B, 2), 256, card)
    layout = configured(cfg, plan, card)
    choice, _ = choose(cfg.model_copy(update={"placement": "auto"}), grpo, ParityTask(),
                       ClusterConfig.parse("1xH100-80G"))
    same = [s for s in choice.scored if s.cand == layout.cand]
    assert len(same) == 1 and same[0].fit.peak["global"] == judged.peak  # one model, one number
    row = [line for line in choice.explain(top=len(choice.scored)).splitlines()
           if line.endswith("  " + layout.cand.label())]
    assert float(row[0].split()[1]) == round(judged.peak / GIB, 1)
    assert "pool global (1 x cuda): peak" in judged.table


def test_memory_check_false_skips_it(tmp_path):
    """train.memory_check=false: `flowrl train`'s gate (check_run, as trainer.setup calls it) neither asks the
    GPU's memory nor refuses the audit case; true refuses it."""
    asked = []
    args = [QWEN25_7B, pools(1), "roles.actor.offload_optimizer=true", "model.gradient_checkpointing=true"]
    cfg = run_config(tmp_path, *args, "train.memory_check=false")
    check_run(cfg, make_plan(cfg, grpo, ParityTask()), tmp_path / "model", lambda: asked.append(1) or 80 * GIB)
    assert asked == []
    cfg = run_config(tmp_path, *args)
    with pytest.raises(fl.PlanError, match="train.memory_check=false to try anyway"):
        check_run(cfg, make_plan(cfg, grpo, ParityTask()), tmp_path / "model", lambda: asked.append(1) or 80 * GIB)
    assert asked == [1]


def test_a_layout_the_candidate_cannot_express_warns_and_uses_the_per_role_sum(tmp_path):
    """roles.rollout.engine=hf (transformers' generate, not a planner engine): one warning, the old estimate."""
    cfg = run_config(tmp_path, QWEN05B, pools(1), "roles.rollout.engine=hf", "roles.actor.micro_batch_size=32")
    with pytest.warns(UserWarning, match=r"memory check: roles.rollout.engine=hf: the planner models hf_static "
                                         r"and vllm; judged by the per-role sum"):
        judged = judge(cfg, make_plan(cfg, grpo, ParityTask()), ModelShape.from_config(QWEN05B, 2), 256, 80 * GIB)
    assert set(judged.per_gpu["global"]) == {"actor", "rollout", "ref"} and judged.peak == 0


QWEN25_1_5B = dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True)


def test_the_layout_flowrl_plan_writes_passes_trains_check_with_the_planned_peak(tmp_path):
    """`flowrl plan --cluster 1xH100-80G --write FILE`, then `flowrl train --config FILE`: the check translates
    the written placement and options back into the planner's candidate, with the peak the plan predicted."""
    from flowrl.runtime.layout.auto_plan import write

    cfg = run_config(tmp_path, QWEN25_1_5B)
    choice, values = choose(cfg.model_copy(update={"placement": "auto"}), grpo, ParityTask(),
                            ClusterConfig.parse("1xH100-80G"))
    write(values, {}, tmp_path / "plan.json")
    written = load_run_config(str(tmp_path / "plan.json"), [*WORKLOAD, f"model.path={tmp_path / 'model'}"])
    plan = make_plan(written, grpo, ParityTask())
    card = DEVICES["H100-80G"].memory_bytes
    cand, best = configured(written, plan, card).cand, choice.best.cand
    if best.token_budget:  # micro-batches grouped by tokens: the plan leaves roles.<name>.micro_batch_size out
        cand, best = replace(cand, micro_batch_size=0), replace(best, micro_batch_size=0)
    assert cand == best
    assert judge(written, plan, ModelShape.from_config(QWEN25_1_5B, 2), 256, card).peak == \
        max(choice.best.fit.peak.values())
