"""verl's hydra keys and the flowrl keys they become (`flowrl train --verl KEY=VALUE ...`): the one table the
translation (flowrl.config.verl_map) reads and docs/verl.md is generated from (tests/test_verl_keys.py checks
both), each key with verl's default where that default changes the math (verl/trainer/config/*.yaml).

A key listed with no flowrl key, or any other key of verl's sections (VERL_SECTIONS: speed, memory, logging,
verl's workers), is accepted and named as not honoured; a key outside them is named as not verl's. A key whose
value would change what is trained and that flowrl cannot reproduce is refused by the translation in one line.

`Given` reads a command's values through the table; `Mapped` is what the translation makes of them (the
algorithm, the overrides, the notes), both shared by verl_map and verl_algo.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

NO_DEFAULT = object()
AR = "actor_rollout_ref"


@dataclass(frozen=True)
class VerlKey:
    key: str
    target: str  # the flowrl key(s) it sets; "" when flowrl has no counterpart
    note: str = ""  # how the value is converted, or why it is not honoured
    default: Any = NO_DEFAULT  # verl's default, applied when the command leaves the key unset


def _k(key: str, target: str, note: str = "", default: Any = NO_DEFAULT) -> VerlKey:
    return VerlKey(key, target, note, default)


PER_GPU = "x trainer.n_gpus_per_node x trainer.nnodes (flowrl counts over all ranks)"
DYNAMIC = "with use_dynamic_bsz"
VLLM_ONLY = "with rollout.name=vllm"

TABLE: tuple[VerlKey, ...] = (
    _k("algorithm.adv_estimator", "algorithm", "gae: ppo, grpo: grpo (gspo with loss_mode=gspo; dapo with "
       "filter_groups, an overlong buffer or clip_ratio_high != clip_ratio_low), rloo, reinforce_plus_plus: "
       "reinforce_pp, reinforce_plus_plus_baseline, remax, opo, gpg, grpo_passk", "gae"),
    _k("algorithm.gamma", "algo.gamma", default=1.0),
    _k("algorithm.lam", "algo.lam", default=1.0),
    _k("algorithm.norm_adv_by_std_in_grpo", "algo.norm_by_std", default=True),
    _k("algorithm.use_kl_in_reward", "algo.kl_coef", "k1 KL in the token rewards: ppo, reinforce_pp", False),
    _k("algorithm.kl_penalty", "algo.kl_coef", "with use_kl_in_reward: kl (k1) only, as flowrl's KL in the reward", "kl"),
    _k("algorithm.kl_ctrl.kl_coef", "algo.kl_coef", "with use_kl_in_reward", 0.001),
    _k("algorithm.kl_ctrl.type", "algo.kl_ctrl", "ppo", "fixed"),
    _k("algorithm.kl_ctrl.target_kl", "algo.target_kl", "ppo", 0.1),
    _k("algorithm.kl_ctrl.horizon", "algo.horizon", "ppo", 10000),
    _k("algorithm.filter_groups.enable", "algo.dynamic_sampling", "dapo", False),
    _k("algorithm.filter_groups.metric", "", "seq_reward or acc: flowrl drops groups of equal scores"),
    _k("algorithm.filter_groups.max_num_gen_batches", "algo.max_sampling_rounds", "dapo; 0 (unlimited): "
       "flowrl's default rounds"),
    _k("algorithm.use_pf_ppo", "", "refused when true: `flowrl train pf_ppo`", False),
    _k("algorithm.rollout_correction.rollout_is", "algo.rollout_correction.is_level", "null: off"),
    _k("algorithm.rollout_correction.rollout_is_threshold", "algo.rollout_correction.is_threshold"),
    _k("algorithm.rollout_correction.rollout_rs", "algo.rollout_correction.rs_level", "null: off"),
    _k("algorithm.rollout_correction.rollout_rs_threshold", "algo.rollout_correction.rs_threshold"),
    _k("data.train_files", "data.train_files"),
    _k("data.val_files", "data.val_files"),
    _k("data.train_batch_size", "train.batch_size", "prompts per step, as verl's", 1024),
    _k("data.max_prompt_length", "data.max_prompt_length", default=512),
    _k("data.max_response_length", "roles.rollout.max_new_tokens", default=512),
    _k("data.filter_overlong_prompts", "data.truncation", "true: drop", False),
    _k("data.truncation", "data.truncation", "error: error; left, right, middle: not honoured (dropped)", "error"),
    _k("data.shuffle", "data.shuffle", default=True),
    _k("data.seed", "train.seed"),
    _k("data.prompt_key", "", "flowrl reads the `prompt` column: refused otherwise", "prompt"),
    _k("data.return_raw_chat", "", "flowrl applies the chat template itself"),
    _k("data.gen_batch_size", "", "DAPO's generation batch: flowrl's fill generates train.batch_size at a time"),
    _k(f"{AR}.model.path", "model.path"),
    _k(f"{AR}.model.enable_gradient_checkpointing", "model.gradient_checkpointing"),
    _k(f"{AR}.model.use_remove_padding", "roles.actor.packing", "rows packed without padding"),
    _k(f"{AR}.model.lora_rank", "roles.actor.lora_rank"),
    _k(f"{AR}.model.lora_alpha", "roles.actor.lora_alpha"),
    _k(f"{AR}.model.target_modules", "roles.actor.lora_target_modules", "all-linear: flowrl's default list"),
    _k(f"{AR}.actor.ppo_mini_batch_size", "roles.actor.mini_batch_size", "prompts, x rollout.n (responses)", 256),
    _k(f"{AR}.actor.ppo_micro_batch_size_per_gpu", "roles.actor.micro_batch_size", PER_GPU),
    _k(f"{AR}.actor.ppo_micro_batch_size", "roles.actor.micro_batch_size", "responses over all ranks"),
    _k(f"{AR}.actor.use_dynamic_bsz", "roles.actor.max_tokens_per_micro_batch", "true: token budgets", False),
    _k(f"{AR}.actor.ppo_max_token_len_per_gpu", "roles.actor.max_tokens_per_micro_batch", DYNAMIC, 16384),
    _k(f"{AR}.actor.ppo_epochs", "roles.actor.epochs", default=1),
    _k(f"{AR}.actor.clip_ratio", "algo.clip", "or algo.clip_low and algo.clip_high", 0.2),
    _k(f"{AR}.actor.clip_ratio_low", "algo.clip_low", "algo.clip when equal to clip_ratio_high"),
    _k(f"{AR}.actor.clip_ratio_high", "algo.clip_high", "algo.clip when equal to clip_ratio_low"),
    _k(f"{AR}.actor.clip_ratio_c", "algo.dual_clip", default=3.0),
    _k(f"{AR}.actor.loss_agg_mode", "algo.loss_agg_mode", default="token-mean"),
    _k(f"{AR}.actor.entropy_coeff", "algo.entropy_coef", default=0.0),
    _k(f"{AR}.actor.use_kl_loss", "algo.kl_coef", "KL as a loss: grpo, rloo, gspo", False),
    _k(f"{AR}.actor.kl_loss_coef", "algo.kl_coef", "with use_kl_loss", 0.001),
    _k(f"{AR}.actor.kl_loss_type", "algo.kl_coef", "with use_kl_loss: low_var_kl (k3) only, as flowrl's KL loss", "low_var_kl"),
    _k(f"{AR}.actor.policy_loss.loss_mode", "algorithm", "vanilla, or gspo", "vanilla"),
    _k(f"{AR}.actor.grad_clip", "roles.actor.grad_clip", default=1.0),
    _k(f"{AR}.actor.optim.lr", "roles.actor.lr", default=1e-6),
    _k(f"{AR}.actor.optim.weight_decay", "roles.actor.weight_decay", default=0.01),
    _k(f"{AR}.actor.optim.lr_warmup_steps", "roles.actor.warmup_steps", "steps x optimizer steps per step", -1),
    _k(f"{AR}.actor.optim.lr_warmup_steps_ratio", "roles.actor.warmup_steps", "x train.steps", 0.0),
    _k(f"{AR}.actor.optim.lr_scheduler_type", "roles.actor.lr_schedule", "constant or cosine", "constant"),
    _k(f"{AR}.actor.optim.warmup_style", "roles.actor.lr_schedule", "the older name of lr_scheduler_type"),
    _k(f"{AR}.actor.optim.min_lr_ratio", "", "0 only: flowrl's cosine decays to 0", 0.0),
    _k(f"{AR}.actor.fsdp_config.param_offload", "roles.actor.offload_params"),
    _k(f"{AR}.actor.fsdp_config.optimizer_offload", "roles.actor.offload_optimizer"),
    _k(f"{AR}.actor.shuffle", "", "flowrl's mini-batches keep the rows' order"),
    _k(f"{AR}.actor.ulysses_sequence_parallel_size", "", "no sequence parallelism in flowrl"),
    _k(f"{AR}.actor.strategy", "", "flowrl shards with FSDP2 under torchrun"),
    _k(f"{AR}.rollout.name", "roles.rollout.engine", "vllm: vllm, hf: hf, sglang: vllm"),
    _k(f"{AR}.rollout.n", "algo.group_size", "ppo: 1 only", 1),
    _k(f"{AR}.rollout.temperature", "roles.rollout.temperature", default=1.0),
    _k(f"{AR}.rollout.top_p", "roles.rollout.top_p", default=1.0),
    _k(f"{AR}.rollout.top_k", "roles.rollout.top_k", "-1: 0 (off)", -1),
    _k(f"{AR}.rollout.response_length", "roles.rollout.max_new_tokens", "default data.max_response_length"),
    _k(f"{AR}.rollout.ignore_eos", "roles.rollout.ignore_eos"),
    _k(f"{AR}.rollout.log_prob_micro_batch_size_per_gpu", "roles.actor.forward_micro_batch_size",
       f"the actor's old logprobs, {PER_GPU}"),
    _k(f"{AR}.rollout.log_prob_use_dynamic_bsz", "roles.actor.forward_max_tokens_per_micro_batch", "true: budgets"),
    _k(f"{AR}.rollout.log_prob_max_token_len_per_gpu", "roles.actor.forward_max_tokens_per_micro_batch", DYNAMIC),
    _k(f"{AR}.rollout.tensor_model_parallel_size", "roles.rollout.tensor_parallel_size", VLLM_ONLY),
    _k(f"{AR}.rollout.gpu_memory_utilization", "roles.rollout.gpu_memory_utilization", VLLM_ONLY),
    _k(f"{AR}.rollout.enforce_eager", "roles.rollout.enforce_eager", VLLM_ONLY),
    _k(f"{AR}.rollout.max_num_seqs", "roles.rollout.max_num_seqs", VLLM_ONLY),
    _k(f"{AR}.rollout.mode", "", "flowrl's rollout is called by the graph (async: fl.buffer, docs/async.md)"),
    _k(f"{AR}.rollout.do_sample", "", "true only", True),
    _k(f"{AR}.ref.log_prob_micro_batch_size_per_gpu", "roles.ref.forward_micro_batch_size",
       f"{PER_GPU}; unset: the actor's"),
    _k(f"{AR}.ref.fsdp_config.param_offload", "roles.ref.offload_params"),
    _k(f"{AR}.ref.log_prob_use_dynamic_bsz", "roles.ref.forward_max_tokens_per_micro_batch", "true: budgets"),
    _k(f"{AR}.ref.log_prob_max_token_len_per_gpu", "roles.ref.forward_max_tokens_per_micro_batch", DYNAMIC),
    _k("critic.optim.lr", "roles.critic.lr", "ppo", 1e-5),
    _k("critic.optim.weight_decay", "roles.critic.weight_decay", "ppo", 0.01),
    _k("critic.grad_clip", "roles.critic.grad_clip", "ppo", 1.0),
    _k("critic.cliprange_value", "algo.value_clip", "ppo", 0.5),
    _k("critic.model.path", "roles.critic.model", "ppo; when not the actor's"),
    _k("critic.model.enable_gradient_checkpointing", "", "model.gradient_checkpointing is the actor's"),
    _k("critic.model.fsdp_config.param_offload", "roles.critic.offload_params", "ppo"),
    _k("critic.model.fsdp_config.optimizer_offload", "roles.critic.offload_optimizer", "ppo"),
    _k("critic.ppo_micro_batch_size_per_gpu", "roles.critic.micro_batch_size", f"ppo, {PER_GPU}; unset: the "
       "actor's"),
    _k("critic.forward_micro_batch_size_per_gpu", "roles.critic.forward_micro_batch_size", f"ppo, {PER_GPU}; "
       "unset: its micro batch"),
    _k("critic.ppo_max_token_len_per_gpu", "roles.critic.max_tokens_per_micro_batch", "ppo, with use_dynamic_bsz"),
    _k("critic.use_dynamic_bsz", "", "the actor's use_dynamic_bsz decides"),
    _k("critic.ppo_mini_batch_size", "roles.critic.mini_batch_size", "ppo; prompts, x rollout.n (responses); "
       "unset: the actor's"),
    _k("critic.ppo_epochs", "roles.critic.epochs", "ppo; unset: the actor's"),
    _k("reward_model.enable", "model.reward_path", "true: reward_model.model.path", False),
    _k("reward_model.model.path", "model.reward_path", "with reward_model.enable"),
    _k("reward_model.reward_manager", "", "naive or dapo (its overlong buffer: algorithm dapo)"),
    _k("reward_model.overlong_buffer.enable", "algo.overlong_buffer_len", "dapo"),
    _k("reward_model.overlong_buffer.len", "algo.overlong_buffer_len", "dapo"),
    _k("reward_model.overlong_buffer.penalty_factor", "algo.overlong_penalty", "dapo"),
    _k("reward_model.reward_kwargs.overlong_buffer_cfg.enable", "algo.overlong_buffer_len", "dapo"),
    _k("reward_model.reward_kwargs.overlong_buffer_cfg.len", "algo.overlong_buffer_len", "dapo"),
    _k("reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "algo.overlong_penalty", "dapo"),
    _k("reward_model.reward_kwargs.max_resp_len", "", "flowrl's overlong penalty counts to max_new_tokens"),
    _k("custom_reward_function.path", "data.reward", "path:name"),
    _k("custom_reward_function.name", "data.reward", "path:name", "compute_score"),
    _k("trainer.total_training_steps", "train.steps"),
    _k("trainer.total_epochs", "train.steps", "x rows // data.train_batch_size, without total_training_steps", 30),
    _k("trainer.project_name", "train.output_dir", "checkpoints/PROJECT/EXPERIMENT, as verl's", "verl_examples"),
    _k("trainer.experiment_name", "train.output_dir", "checkpoints/PROJECT/EXPERIMENT, as verl's", "gsm8k"),
    _k("trainer.default_local_dir", "train.output_dir"),
    _k("trainer.save_freq", "checkpoint.every", "-1: 0 (flowrl still saves at the end)", -1),
    _k("trainer.test_freq", "eval.every", "-1: 0 (off)", -1),
    _k("trainer.val_before_train", "", "flowrl evaluates before the first step whenever it evaluates"),
    _k("trainer.logger", "train.loggers", "jsonl always added (metrics.jsonl, for `flowrl plot`)"),
    _k("trainer.n_gpus_per_node", "", "the ranks come from torchrun or Ray; sizes per GPU count it", 8),
    _k("trainer.nnodes", "", "as trainer.n_gpus_per_node", 1),
    _k("trainer.resume_mode", "checkpoint.resume", "auto: true, disable: false"),
    _k("trainer.critic_warmup", "", "0 only: refused otherwise", 0),
    _k("trainer.balance_batch", "train.balance_batch"),
    _k("trainer.device", "train.device", "cuda or cpu"),
    _k("trainer.max_actor_ckpt_to_keep", "checkpoint.keep"),
    _k("trainer.log_val_generations", "", "debug.dump_eval writes every evaluation's rows"),
    _k("trainer.use_legacy_worker_impl", "", "verl's worker choice"),
)

BY_KEY = {entry.key: entry for entry in TABLE}

VERL_SECTIONS = (AR, "critic", "reward_model", "custom_reward_function", "trainer", "algorithm", "data",
                 "global_profiler", "ray_kwargs", "transfer_queue", "reward_manager")


class Given:
    """The verl values a command set, read through the table: every key read is one the table lists (so
    docs/verl.md names it), and each read is recorded, so the keys nothing read can be named."""

    def __init__(self, values: dict[str, Any]):
        self.values, self.read = values, set()

    def __call__(self, key: str, default: Any = None) -> Any:
        assert key in BY_KEY, f"{key} is read but not in flowrl.config.verl_keys.TABLE"
        self.read.add(key)
        if key in self.values:
            return self.values[key]
        entry = BY_KEY[key].default
        return default if entry is NO_DEFAULT else entry

    def has(self, key: str) -> bool:
        self.read.add(key)
        return key in self.values


@dataclass
class Mapped:
    algorithm: str
    overrides: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def words(self) -> list[str]:
        """The overrides as `key=value` words flowrl's loader parses back to the same values."""
        return [f"{key}={as_word(value)}" for key, value in self.overrides.items()]

    def command(self) -> str:
        return shlex.join(["flowrl", "train", self.algorithm, *self.words()])


def as_word(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value  # a path or a name: read back as the same string
        return json.dumps(value)  # "1" or "true" as a string
    return json.dumps(value)


def table_markdown() -> str:
    """docs/verl.md's table: every key, the flowrl key it sets, the note, and verl's default applied."""
    lines = ["| verl key | flowrl key | how | verl default applied |", "|---|---|---|---|"]
    for e in TABLE:
        default = "" if e.default is NO_DEFAULT else f"`{e.default!r}`"
        lines.append(f"| `{e.key}` | {f'`{e.target}`' if e.target else 'not honoured'} | {e.note} | {default} |")
    return "\n".join(lines) + "\n"
