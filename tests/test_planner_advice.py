"""A refusal names every option that would make it fit (issue 43.3): `flowrl train` on one 80 GiB GPU with a
7B model and nothing else set is refused naming activation checkpointing, the optimizer offload and LoRA, each
with the token budget it needs; every named set, applied, passes the same check."""

import json

import pytest

import flowrl as fl
from flowrl.algorithms import grpo
from flowrl.config import load_run_config
from flowrl.engines.memory import GIB
from flowrl.runtime.layout.memory_check import check_memory
from flowrl.runtime.layout.planning import make_plan
from fakes import ParityTask

QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False)
WORKLOAD = ["train.device=cuda", "model.dtype=bfloat16", "train.batch_size=4", "algo.group_size=8",
            "roles.rollout.max_new_tokens=1024", "data.max_prompt_length=256"]


def test_7b_on_one_80_gib_gpu_is_refused_naming_checkpointing_offload_and_lora(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    cfg = load_run_config(None, WORKLOAD)
    plan = make_plan(cfg, grpo, ParityTask())
    with pytest.raises(fl.PlanError) as err:
        check_memory(cfg, plan, tmp_path, 80 * GIB)
    line = str(err.value)
    assert "\n" not in line and "train.memory_check=false" in line
    named = line.split("it would fit with ")[1].split(" (`flowrl plan")[0].split("; or ")
    assert any("model.gradient_checkpointing=true" in f for f in named)
    assert any("roles.actor.offload_optimizer=true" in f for f in named)
    assert any("roles.actor.lora_rank=64" in f for f in named)
    for fix in named:  # each named set of options, applied, fits
        fixed = load_run_config(None, [*WORKLOAD, *fix.split(" + ")])
        check_memory(fixed, make_plan(fixed, grpo, ParityTask()), tmp_path, 80 * GIB)
    # on 40 GiB only LoRA does (full training holds 4 x 14.2 GiB of weights, gradients and the reference)
    with pytest.raises(fl.PlanError) as err:
        check_memory(cfg, plan, tmp_path, 40 * GIB)
    assert "lora_rank=64" in str(err.value) and "offload_optimizer=true" not in str(err.value)


VLLM_GRAPHS = ["roles.rollout.engine=vllm", "roles.rollout.gpu_memory_utilization=0.5",
               "roles.rollout.free_cache_engine=1", "roles.rollout.enforce_eager=false"]
STEP_16X8 = [*WORKLOAD, "train.batch_size=16"]


def refusal(tmp_path, values: list[str]) -> str:
    cfg = load_run_config(None, [*STEP_16X8, *values])
    with pytest.raises(fl.PlanError) as err:
        check_memory(cfg, make_plan(cfg, grpo, ParityTask()), tmp_path, 80 * GIB)
    return str(err.value)


def passes(tmp_path, values: list[str]) -> None:
    cfg = load_run_config(None, [*STEP_16X8, *values])
    check_memory(cfg, make_plan(cfg, grpo, ParityTask()), tmp_path, 80 * GIB)


def test_the_token_budget_advised_is_the_largest_that_fits(tmp_path):
    """7B, vLLM with CUDA graphs asleep at level 1, checkpointing and the optimizer offloaded, 16 x 8 rows of 256 +
    1024 tokens on one 80 GiB card (issue 43's hand grid): refused; the budget it names is the largest power of two
    that fits (twice it is refused), not the one sequence a micro-batch (2048 tokens) with which the set was found:
    the fewest micro-batches, the one a user following the advice runs."""
    pytest.importorskip("vllm")
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    base = [*VLLM_GRAPHS, "model.gradient_checkpointing=true", "roles.actor.offload_optimizer=true"]
    line = refusal(tmp_path, base)
    named = line.split("it would fit with ")[1].split(" (`flowrl plan")[0].split("; or ")
    budget = next(f for f in named if "lora_rank" not in f)
    tokens = int(budget.split(" + ")[0].split("=")[1])
    assert budget == f"roles.actor.max_tokens_per_micro_batch={tokens} + roles.ref.max_tokens_per_micro_batch={tokens}"
    assert tokens > 2048 and tokens & (tokens - 1) == 0
    passes(tmp_path, [*base, *budget.split(" + ")])
    refusal(tmp_path, [*base, *budget.replace(str(tokens), str(2 * tokens)).split(" + ")])


def test_vllm_refused_for_want_of_room_names_what_makes_room(tmp_path):
    """vLLM's build-time refusal (half the card not free beside the 7B's train engines) names the sets of options
    that make room, as a peak over the card does; each, applied, passes the same check."""
    pytest.importorskip("vllm")
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    line = refusal(tmp_path, [*VLLM_GRAPHS, "model.gradient_checkpointing=true"])
    assert line.startswith("placement: vLLM would not start: gpu_memory_utilization=0.5 of the card is not free")
    assert "\n" not in line and "it would fit with " in line
    named = line.split("it would fit with ")[1].split(" (`flowrl plan")[0].split("; or ")
    assert any("roles.actor.offload_optimizer=true" in f for f in named)
    for fix in named:
        passes(tmp_path, [*VLLM_GRAPHS, "model.gradient_checkpointing=true", *fix.split(" + ")])
