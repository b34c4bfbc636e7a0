"""verl's command line as flowrl's: `flowrl train --verl KEY=VALUE ...` and `--verl-config FILE.yaml`.

`translate(given)` reads the verl keys (flat, dotted) through the table of flowrl.config.verl_keys, with verl's
defaults for the keys left unset, and returns the flowrl algorithm, the `--set` overrides and one line for each
key it cannot honour. Batch sizes keep verl's meaning: data.train_batch_size and ppo_mini_batch_size count
prompts (verl multiplies the mini-batch by rollout.n), *_per_gpu sizes count per GPU of
trainer.n_gpus_per_node x trainer.nnodes. A key whose value would change the math flowrl cannot reproduce is
refused: ValueError, one line naming it.
"""

from __future__ import annotations

from typing import Any

from flowrl.config.verl_keys import AR, BY_KEY, NO_DEFAULT, VERL_SECTIONS, Given, Mapped, as_word
from flowrl.config.verl_algo import algo_options, choose_algorithm


def not_honoured(key: str, value: Any, why: str) -> str:
    return f"{key}={as_word(value)}: not honoured: {why}"


def translate(values: dict[str, Any]) -> Mapped:
    v = Given(values)
    out = Mapped(choose_algorithm(v))
    gpus = int(v("trainer.n_gpus_per_node")) * int(v("trainer.nnodes"))
    for section in (data_keys, model_keys, batch_keys, trainer_keys, optim_keys, rollout_keys, critic_keys,
                    reward_keys):
        section(v, out, gpus)
    out.overrides.update({f"algo.{k}": value for k, value in algo_options(v, out).items()})
    for key in sorted(set(values) - v.read):
        why = ("not a key of verl's trainer config" if key.split(".")[0] not in VERL_SECTIONS else
               "no flowrl counterpart (speed, memory, logging or verl's workers)" if key not in BY_KEY else
               f"not used by this command ({BY_KEY[key].target}: {BY_KEY[key].note})" if BY_KEY[key].target else
               BY_KEY[key].note)
        out.notes.append(not_honoured(key, values[key], why))
    return out


def data_keys(v: Given, out: Mapped, gpus: int) -> None:
    o = out.overrides
    for key, target in (("data.train_files", "data.train_files"), ("data.val_files", "data.val_files"),
                        ("data.seed", "train.seed"), ("data.shuffle", "data.shuffle")):
        if v.has(key) or BY_KEY[key].default is not NO_DEFAULT:
            o[target] = v(key)
    o["train.batch_size"] = int(v("data.train_batch_size"))
    o["data.max_prompt_length"] = int(v("data.max_prompt_length"))
    truncation = v("data.truncation")
    if v("data.filter_overlong_prompts"):
        o["data.truncation"] = "drop"
    elif truncation == "error":
        o["data.truncation"] = "error"
    else:
        o["data.truncation"] = "drop"
        out.notes.append(not_honoured("data.truncation", truncation, "flowrl drops over-long prompts instead"))
    if v("data.prompt_key") != "prompt":
        raise ValueError(f"data.prompt_key={v('data.prompt_key')}: flowrl reads the `prompt` column of verl's schema")


def model_keys(v: Given, out: Mapped, gpus: int) -> None:
    o = out.overrides
    for key, target in (("model.path", "model.path"), ("model.enable_gradient_checkpointing",
                                                       "model.gradient_checkpointing"),
                        ("model.use_remove_padding", "roles.actor.packing"), ("model.lora_rank", "roles.actor.lora_rank"),
                        ("model.lora_alpha", "roles.actor.lora_alpha"),
                        ("actor.fsdp_config.param_offload", "roles.actor.offload_params"),
                        ("actor.fsdp_config.optimizer_offload", "roles.actor.offload_optimizer"),
                        ("ref.fsdp_config.param_offload", "roles.ref.offload_params")):
        if v.has(f"{AR}.{key}"):
            o[target] = v(f"{AR}.{key}")
    if v.has(f"{AR}.model.target_modules") and v(f"{AR}.model.target_modules") != "all-linear":
        o["roles.actor.lora_target_modules"] = v(f"{AR}.model.target_modules")


def batch_keys(v: Given, out: Mapped, gpus: int) -> None:
    """Prompts and per-GPU counts as flowrl's responses over all ranks; token budgets per rank as they are."""
    o, actor, n = out.overrides, f"{AR}.actor", int(v(f"{AR}.rollout.n"))
    o["roles.actor.mini_batch_size"] = int(v(f"{actor}.ppo_mini_batch_size")) * n
    o["roles.actor.epochs"] = int(v(f"{actor}.ppo_epochs"))
    if v(f"{actor}.use_dynamic_bsz"):
        o["roles.actor.max_tokens_per_micro_batch"] = int(v(f"{actor}.ppo_max_token_len_per_gpu"))
    elif v.has(f"{actor}.ppo_micro_batch_size_per_gpu"):
        o["roles.actor.micro_batch_size"] = int(v(f"{actor}.ppo_micro_batch_size_per_gpu")) * gpus
    elif v.has(f"{actor}.ppo_micro_batch_size"):
        o["roles.actor.micro_batch_size"] = int(v(f"{actor}.ppo_micro_batch_size"))
    # the rollout's log-prob passes are the actor's old logprobs; the reference's start from the actor's
    for role, target in (("rollout", "roles.actor"), ("ref", "roles.ref")):
        if v.has(f"{AR}.{role}.log_prob_micro_batch_size_per_gpu"):
            o[f"{target}.forward_micro_batch_size"] = int(v(f"{AR}.{role}.log_prob_micro_batch_size_per_gpu")) * gpus
    for role, target in (("rollout", "roles.actor"), ("ref", "roles.ref")):
        if v(f"{AR}.{role}.log_prob_use_dynamic_bsz", v(f"{actor}.use_dynamic_bsz")) and \
                v.has(f"{AR}.{role}.log_prob_max_token_len_per_gpu"):
            o[f"{target}.forward_max_tokens_per_micro_batch"] = int(v(f"{AR}.{role}.log_prob_max_token_len_per_gpu"))


def optim_keys(v: Given, out: Mapped, gpus: int) -> None:
    o, actor = out.overrides, f"{AR}.actor"
    o["roles.actor.lr"] = float(v(f"{actor}.optim.lr"))
    o["roles.actor.weight_decay"] = float(v(f"{actor}.optim.weight_decay"))
    o["roles.actor.grad_clip"] = float(v(f"{actor}.grad_clip"))
    schedule = v(f"{actor}.optim.lr_scheduler_type") if not v.has(f"{actor}.optim.warmup_style") \
        else v(f"{actor}.optim.warmup_style")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"{actor}.optim.lr_scheduler_type={schedule}: flowrl maps constant and cosine")
    if float(v(f"{actor}.optim.min_lr_ratio")) != 0 and schedule == "cosine":
        raise ValueError(f"{actor}.optim.min_lr_ratio={v(f'{actor}.optim.min_lr_ratio')}: flowrl's cosine decays "
                         f"to 0")
    warmup, ratio = int(v(f"{actor}.optim.lr_warmup_steps")), float(v(f"{actor}.optim.lr_warmup_steps_ratio"))
    per_step = max(1, int(v("data.train_batch_size")) * int(v(f"{AR}.rollout.n"))
                   // max(1, int(v(f"{actor}.ppo_mini_batch_size")) * int(v(f"{AR}.rollout.n")))) \
        * int(v(f"{actor}.ppo_epochs"))
    total = out.overrides["train.steps"]
    warmup_steps = warmup if warmup >= 0 else int(ratio * total)
    if warmup_steps:  # verl's scheduler steps once per training step; flowrl's once per optimizer step
        o["roles.actor.warmup_steps"] = warmup_steps * per_step
    if schedule == "cosine":
        o["roles.actor.lr_schedule"], o["roles.actor.lr_decay_steps"] = "cosine", total * per_step


def rollout_keys(v: Given, out: Mapped, gpus: int) -> None:
    o, r = out.overrides, f"{AR}.rollout"
    name = v(f"{r}.name", "vllm")
    engine = {"vllm": "vllm", "hf": "hf", "sglang": "vllm"}.get(name)
    if engine is None:
        raise ValueError(f"{r}.name={name}: flowrl's rollout engines are vllm and hf")
    if name == "sglang":
        out.notes.append(not_honoured(f"{r}.name", name, "flowrl generates with vllm"))
    o["roles.rollout.engine"] = engine
    o["roles.rollout.max_new_tokens"] = int(v(f"{r}.response_length", v("data.max_response_length")))
    o["roles.rollout.temperature"] = float(v(f"{r}.temperature"))
    o["roles.rollout.top_p"] = float(v(f"{r}.top_p"))
    o["roles.rollout.top_k"] = max(0, int(v(f"{r}.top_k")))
    if v.has(f"{r}.ignore_eos"):
        o["roles.rollout.ignore_eos"] = v(f"{r}.ignore_eos")
    if not v(f"{r}.do_sample"):
        raise ValueError(f"{r}.do_sample=false: flowrl's rollout samples (temperature 0 is not supported)")
    for key, target in (("tensor_model_parallel_size", "tensor_parallel_size"),
                        ("gpu_memory_utilization", "gpu_memory_utilization"), ("enforce_eager", "enforce_eager"),
                        ("max_num_seqs", "max_num_seqs")):
        if v.has(f"{r}.{key}") and engine == "vllm":
            o[f"roles.rollout.{target}"] = v(f"{r}.{key}")
        elif v.has(f"{r}.{key}"):
            out.notes.append(not_honoured(f"{r}.{key}", v(f"{r}.{key}"), f"an option of vllm; the rollout is {name}"))


def critic_keys(v: Given, out: Mapped, gpus: int) -> None:
    """The critic's section: PPO's only (verl too builds a critic for gae alone)."""
    if out.algorithm != "ppo":
        return
    o, actor = out.overrides, f"{AR}.actor"
    o["roles.critic.lr"] = float(v("critic.optim.lr"))
    o["roles.critic.weight_decay"] = float(v("critic.optim.weight_decay"))
    o["roles.critic.grad_clip"] = float(v("critic.grad_clip"))
    for key, target in (("critic.model.fsdp_config.param_offload", "roles.critic.offload_params"),
                        ("critic.model.fsdp_config.optimizer_offload", "roles.critic.offload_optimizer")):
        if v.has(key):
            o[target] = v(key)
    if v.has("critic.model.path") and v("critic.model.path") != v(f"{AR}.model.path"):
        o["roles.critic.model"] = v("critic.model.path")
    if v(actor + ".use_dynamic_bsz") and v.has("critic.ppo_max_token_len_per_gpu"):
        o["roles.critic.max_tokens_per_micro_batch"] = int(v("critic.ppo_max_token_len_per_gpu"))
    critic_sizes(v, out, gpus)


def critic_sizes(v: Given, out: Mapped, gpus: int) -> None:
    """The critic's own update sizes; one it leaves unset is the actor's (verl's critic.yaml interpolates them)."""
    o, n = out.overrides, int(v(f"{AR}.rollout.n"))
    o["roles.critic.mini_batch_size"] = int(v("critic.ppo_mini_batch_size", v(f"{AR}.actor.ppo_mini_batch_size"))) * n
    o["roles.critic.epochs"] = int(v("critic.ppo_epochs", v(f"{AR}.actor.ppo_epochs")))
    if v.has("critic.ppo_micro_batch_size_per_gpu"):
        o["roles.critic.micro_batch_size"] = int(v("critic.ppo_micro_batch_size_per_gpu")) * gpus
    elif "roles.actor.micro_batch_size" in o:
        o["roles.critic.micro_batch_size"] = o["roles.actor.micro_batch_size"]
    if v.has("critic.forward_micro_batch_size_per_gpu"):
        o["roles.critic.forward_micro_batch_size"] = int(v("critic.forward_micro_batch_size_per_gpu")) * gpus


def reward_keys(v: Given, out: Mapped, gpus: int) -> None:
    o = out.overrides
    if v("reward_model.enable"):
        o["model.reward_path"] = v("reward_model.model.path")
    if v.has("custom_reward_function.path") and v("custom_reward_function.path"):
        o["data.reward"] = f"{v('custom_reward_function.path')}:{v('custom_reward_function.name')}"
    manager = v("reward_model.reward_manager", "naive")
    if manager not in ("naive", "dapo"):
        out.notes.append(not_honoured("reward_model.reward_manager", manager, "flowrl scores each row by data.reward"))


def trainer_keys(v: Given, out: Mapped, gpus: int) -> None:
    o = out.overrides
    if v.has("trainer.total_training_steps") and v("trainer.total_training_steps"):
        o["train.steps"] = int(v("trainer.total_training_steps"))
    else:
        o["train.steps"] = epoch_steps(v)
    if v.has("trainer.default_local_dir"):
        o["train.output_dir"] = v("trainer.default_local_dir")
    else:
        o["train.output_dir"] = f"checkpoints/{v('trainer.project_name')}/{v('trainer.experiment_name')}"
    o["checkpoint.every"] = max(0, int(v("trainer.save_freq")))
    o["eval.every"] = max(0, int(v("trainer.test_freq")))
    if v.has("trainer.logger"):
        loggers = v("trainer.logger")
        loggers = [loggers] if isinstance(loggers, str) else list(loggers)
        o["train.loggers"] = [*dict.fromkeys([*loggers, "jsonl"])]
    if v.has("trainer.resume_mode"):
        if v("trainer.resume_mode") not in ("auto", "disable"):
            raise ValueError(f"trainer.resume_mode={v('trainer.resume_mode')}: flowrl resumes from "
                             f"train.output_dir's newest checkpoint (auto) or not at all (disable)")
        o["checkpoint.resume"] = v("trainer.resume_mode") == "auto"
    if int(v("trainer.critic_warmup")):
        raise ValueError(f"trainer.critic_warmup={v('trainer.critic_warmup')}: flowrl updates the actor from the "
                         f"first step")
    for key, target in (("trainer.balance_batch", "train.balance_batch"), ("trainer.device", "train.device"),
                        ("trainer.max_actor_ckpt_to_keep", "checkpoint.keep")):
        if v.has(key) and v(key) is not None:
            o[target] = v(key)
    if gpus > 1:
        out.notes.append(not_honoured("trainer.n_gpus_per_node", v("trainer.n_gpus_per_node"), f"this process is "
                                      f"one rank; start {gpus} with torchrun --nproc-per-node {gpus} (sizes per GPU "
                                      f"are counted for {gpus})"))


def epoch_steps(v: Given) -> int:
    """trainer.total_epochs as steps: epochs x (training rows // data.train_batch_size), verl's dataloader."""
    epochs = int(v("trainer.total_epochs"))
    files = v("data.train_files")
    if not files:
        raise ValueError(f"trainer.total_epochs={epochs}: without data.train_files flowrl counts steps; set "
                         f"trainer.total_training_steps")
    from flowrl.data.dataset import load_rows

    rows = len(load_rows([files] if isinstance(files, str) else list(files), "data.train_files"))
    return max(1, epochs * (rows // int(v("data.train_batch_size"))))
