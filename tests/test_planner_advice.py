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
