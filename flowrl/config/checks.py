"""Checks of a loaded RunConfig against the run's roles: a warning for each value with no effect, and
options of two sections that cannot hold together refused in one line."""

from __future__ import annotations

import warnings

from flowrl.graph.role import ROLES, RoleSpec
from flowrl.config.run_config import RunConfig


def used_sections(specs: dict[str, RoleSpec]) -> set[str]:
    """The role sections a run of these roles reads: their own, and those their engines start from."""
    return {*specs, *(section for spec in specs.values() for section in spec.engines)}


def warn_no_effect(cfg: RunConfig, used_sections: set[str]) -> None:
    """Warn for each value set away from its default that this run ignores. `used_sections`: the role sections
    the run's roles read (their own, and those their engines start from: flowrl.graph.role_config)."""
    default = RunConfig()
    if cfg.model.path is not None:
        for key in ("tiny_hidden_size", "tiny_num_layers"):
            if getattr(cfg.model, key) != getattr(default.model, key):
                warnings.warn(f"model.{key} has no effect: model.path is set", stacklevel=2)
    t = cfg.train
    if t.micro_batch_size > t.mini_batch_size:
        warnings.warn(f"train.micro_batch_size={t.micro_batch_size} above train.mini_batch_size={t.mini_batch_size} "
                      f"has no effect: micro-batches never exceed a mini-batch", stacklevel=2)
    trained = sorted(name for name in used_sections if name in ROLES and ROLES.get(name).trainable)
    engines = {name: getattr(cfg.section(name), "engine", None) for name in trained}  # a controller has none
    budgets = {name: engine.model_dump().get("max_tokens_per_micro_batch", 0)
               for name, engine in engines.items() if engine is not None}
    if t.micro_batch_size != default.train.micro_batch_size and budgets and all(budgets.values()):
        named = ", ".join(f"roles.{name}.max_tokens_per_micro_batch={budget}" for name, budget in budgets.items())
        warnings.warn(f"train.micro_batch_size has no effect: {named} groups micro-batches by tokens", stacklevel=2)
    if cfg.task.name not in ("arithmetic", "calculator") and cfg.task.max_operand != default.task.max_operand:
        warnings.warn("task.max_operand has no effect: task.name is neither 'arithmetic' nor 'calculator'",
                      stacklevel=2)
    if t.memory_check is not default.train.memory_check and t.device != "cuda":
        warnings.warn("train.memory_check has no effect: train.device is not 'cuda'", stacklevel=2)
    for name in cfg.roles:
        if name not in used_sections:
            warnings.warn(f"roles.{name}.* has no effect: no role of the algorithm builds on it", stacklevel=2)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks (vLLM 0.26)


def refuse_contradictions(cfg: RunConfig) -> None:
    """Options of two sections that cannot hold together, refused in one line before anything starts (they
    failed after the first step, or in vLLM's start-up)."""
    served = cfg.rollout.model_dump().get("max_lora_rank", 0)  # only engines that serve adapters have it
    trained = cfg.actor.model_dump().get("lora_rank", 0)
    if served and served not in VLLM_LORA_RANKS:
        raise ValueError(f"roles.rollout.max_lora_rank={served}: vLLM takes one of {VLLM_LORA_RANKS}")
    if served and not trained:
        raise ValueError(f"roles.rollout.max_lora_rank={served} serves the actor's LoRA adapter, but "
                         f"roles.actor.lora_rank is 0 (no adapter): set roles.actor.lora_rank, or "
                         f"roles.rollout.max_lora_rank=0 to stream the weights")
    if served and trained > served:
        raise ValueError(f"roles.actor.lora_rank={trained} is above roles.rollout.max_lora_rank={served}: vLLM could "
                         f"not load the adapter; set roles.rollout.max_lora_rank to at least {trained}")
