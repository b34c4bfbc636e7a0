"""Checks of a loaded RunConfig against the run's roles: a warning for each value with no effect, and
options of two sections that cannot hold together refused in one line."""

from __future__ import annotations

import warnings

from flowrl.graph.role import ROLES, RoleSpec
from flowrl.graph.role_config import RoleConfig
from flowrl.roles.configs import UPDATE_SIZES, TrainedRoleConfig, TrainRoleConfig
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
    trained = sorted(name for name in used_sections if name in ROLES and ROLES.get(name).trainable)
    for name in trained:
        _warn_sizes(name, cfg.section(name))
    if cfg.task.name not in ("arithmetic", "calculator") and cfg.task.max_operand != default.task.max_operand:
        warnings.warn("task.max_operand has no effect: task.name is neither 'arithmetic' nor 'calculator'",
                      stacklevel=2)
    if t.memory_check is not default.train.memory_check and t.device != "cuda":
        warnings.warn("train.memory_check has no effect: train.device is not 'cuda'", stacklevel=2)
    for name in cfg.roles:
        if name not in used_sections and not _sizes_only(cfg.roles[name]):
            warnings.warn(f"roles.{name}.* has no effect: no role of the algorithm builds on it", stacklevel=2)


def _warn_sizes(name: str, section: RoleConfig) -> None:
    """A trained role's micro_batch_size above its mini_batch_size, or set where its engine groups micro-batches
    by tokens, has no effect."""
    if not isinstance(section, TrainedRoleConfig):  # a controller (kl_ctrl) has no engine and no sizes
        return
    if section.micro_batch_size > section.mini_batch_size:
        warnings.warn(f"roles.{name}.micro_batch_size={section.micro_batch_size} above roles.{name}.mini_batch_size="
                      f"{section.mini_batch_size} has no effect: micro-batches never exceed a mini-batch", stacklevel=3)
    budget = section.engine.model_dump().get("max_tokens_per_micro_batch", 0)
    if budget and section.micro_batch_size != type(section).model_fields["micro_batch_size"].default:
        warnings.warn(f"roles.{name}.micro_batch_size has no effect: roles.{name}.max_tokens_per_micro_batch={budget} "
                      f"groups micro-batches by tokens", stacklevel=3)


def _sizes_only(section: RoleConfig | dict) -> bool:
    """A section holding only update sizes (a deprecated train.* key's or the cuda preset's, which every role
    that has them gets): no warning where its role is not in the run."""
    if not isinstance(section, TrainRoleConfig):
        return False
    sizes = {key: getattr(section, key) for key in section.model_fields_set & set(UPDATE_SIZES)}
    return section == type(section).model_validate(sizes)


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
