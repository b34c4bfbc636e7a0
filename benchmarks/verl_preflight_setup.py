"""benchmarks/verl_preflight.py's first stages, in verl's packages: imports, config (hydra's composition with the
overrides, validate_config, the workers' dataclasses), tokenizer (HFModelConfig, its chat template, verl's
continuous token builder), dataset (RLHFDataset and the trainer's StatefulDataLoader) and reward (RewardLoopWorker
with benchmarks/verl_reward.py). Each takes the shared context, adds what later stages use, and returns (result,
one-line note)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from verl_preflight_fakes import check, run_async


def stage_imports(ctx):
    import tensordict
    import transformers
    import verl

    import verl.experimental.agent_loop  # noqa: F401
    import verl.experimental.reward_loop  # noqa: F401
    import verl.trainer.main_ppo  # noqa: F401
    import verl.trainer.ppo.ray_trainer  # noqa: F401
    import verl.trainer.ppo.v1.trainer_sync  # noqa: F401
    import verl.utils.tracking  # noqa: F401

    vllm = "vllm" in sys.modules
    return None, (f"verl {verl.__version__}, transformers {transformers.__version__}, tensordict "
                  f"{tensordict.__version__}, python {sys.version.split()[0]}; vllm imported: {vllm}")


def stage_config(ctx):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.device import auto_set_device

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(config_name="ppo_trainer", overrides=ctx["spec"]["overrides"])
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    OmegaConf.resolve(config)  # TaskRunner.run / TaskRunnerV1.run
    from ray import cloudpickle
    config = cloudpickle.loads(cloudpickle.dumps(config))  # as Ray hands it to the TaskRunner and every worker
    built = {}
    for key in ("actor_rollout_ref.rollout", "actor_rollout_ref.model", "actor_rollout_ref.actor",
                "actor_rollout_ref.rollout.checkpoint_engine"):  # engine_workers.py, agent_loop.py, ray_trainer.py
        built[key] = omega_conf_to_dataclass(OmegaConf.select(config, key))
    if need_reference_policy(config):  # the ref config as engine_workers.py's init_model renames it first
        ref = config.actor_rollout_ref.ref.copy()
        with open_dict(ref):
            ref.ppo_mini_batch_size = config.actor_rollout_ref.actor.ppo_mini_batch_size
            ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
            ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
            ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
        built["actor_rollout_ref.ref"] = omega_conf_to_dataclass(ref)
    ctx["config"], ctx["rollout"] = config, built["actor_rollout_ref.rollout"]
    built = {k.replace("actor_rollout_ref.", "").replace("rollout.", ""): v for k, v in built.items()}
    rollout = ctx["rollout"]
    check(rollout.agent.default_agent_loop == "single_turn_agent",
          f"default agent loop {rollout.agent.default_agent_loop}")
    return config, (f"use_v1={config.trainer.use_v1}, agent loop {rollout.agent.default_agent_loop} x "
                    f"{rollout.agent.num_workers} workers, n={rollout.n}, prompt/response length "
                    f"{rollout.prompt_length}/{rollout.response_length}, ignore_eos={rollout.ignore_eos}, "
                    f"max_model_len={rollout.max_model_len}, reference={need_reference_policy(config)}, "
                    f"critic={need_critic(config)}; dataclasses: {', '.join(built)}")


def stage_tokenizer(ctx):
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    config = ctx["config"]
    model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    tokenizer, processor = model_config.tokenizer, model_config.processor
    if model_config.get("custom_chat_template", None) is not None:  # as AgentLoopWorker.__init__
        tokenizer.chat_template = model_config.custom_chat_template
    model_type = getattr(model_config.hf_config, "model_type", None)
    builder = create_continuous_token_builder(tokenizer, hf_model_type=model_type,
                                              chat_template_kwargs=config.data.get("apply_chat_template_kwargs", {}),
                                              mm_processor_kwargs=config.data.get("mm_processor_kwargs", {}),
                                              processor=processor)
    newline = tokenizer.encode("\n", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    check(len(newline) == 1, f"'\\n' encodes to {newline}")
    check(tokenizer.eos_token_id is not None and tokenizer.pad_token_id is not None,
          f"eos {tokenizer.eos_token_id}, pad {tokenizer.pad_token_id}")
    saved = json.loads((Path(model_config.local_path) / "tokenizer_config.json").read_text()).get("chat_template")
    check(model_config.get("custom_chat_template", None) == saved,  # the override's quoting through hydra
          f"model.custom_chat_template {model_config.get('custom_chat_template', None)!r}, the copy's {saved!r}")
    text = "abcxyz"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    check(rendered == text, f"the chat template renders {rendered!r}")
    ctx.update(model_config=model_config, tokenizer=tokenizer, processor=processor, newline=newline[0],
               im_end=im_end)
    return None, (f"{type(tokenizer).__name__} ({len(tokenizer)} tokens), model_type {model_type}, processor "
                  f"{type(processor).__name__ if processor is not None else None}, builder {type(builder).__name__}, "
                  f"eos {tokenizer.eos_token_id} pad {tokenizer.pad_token_id} '\\n' {newline[0]} <|im_end|> {im_end}")


def stage_dataset(ctx):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    config, tokenizer, spec = ctx["config"], ctx["tokenizer"], ctx["spec"]
    dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, ctx["processor"], is_train=True,
                                max_samples=config.data.get("train_max_samples", -1))
    loader = StatefulDataLoader(dataset=dataset, batch_size=config.data.get("gen_batch_size", None)
                                or config.data.train_batch_size, num_workers=config.data["dataloader_num_workers"],
                                drop_last=True, collate_fn=collate_fn, sampler=create_rl_sampler(config.data, dataset))
    val = create_rl_dataset(config.data.val_files, config.data, tokenizer, ctx["processor"], is_train=False,
                            max_samples=config.data.get("val_max_samples", -1))
    batch = next(iter(loader))
    check(len(batch["raw_prompt"]) == spec["prompts"], f"{len(batch['raw_prompt'])} prompts in the first batch")
    first = list(batch["raw_prompt"][0])
    check(first[0]["role"] == "user" and len(first[0]["content"]) == spec["prompt_len"], f"raw_prompt {first}")
    ids = tokenizer.apply_chat_template(first, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    check(len(ids) == spec["prompt_len"], f"the first prompt renders to {len(ids)} tokens, not {spec['prompt_len']}")
    ctx.update(dataset=dataset, loader=loader, batch_dict=batch)
    return None, (f"{type(dataset).__name__}: {len(dataset)} rows (val {len(val)}), batch of "
                  f"{len(batch['raw_prompt'])}, keys {sorted(batch)}")


def stage_reward(ctx):
    import numpy as np
    import torch

    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo.reward import resolve_reward_manager_cls

    config, tokenizer = ctx["config"], ctx["tokenizer"]
    resolve_reward_manager_cls(config)  # RewardLoopManager.__init__
    worker = RewardLoopWorker(config, None)
    sys.path.insert(0, str(Path(config.reward.custom_reward_function.path).parent))
    from verl_reward import compute_score

    prompt = tokenizer.encode("abc", add_special_tokens=False)
    response = tokenizer.encode("hello", add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + response])
    data = DataProto.from_dict(
        tensors={"prompts": torch.tensor([prompt]), "responses": torch.tensor([response]), "input_ids": ids,
                 "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1])[None]},
        non_tensors={"data_source": np.array(["flowrl_bench"], dtype=object),
                     "reward_model": np.array([{"style": "rule", "ground_truth": "a"}], dtype=object),
                     "extra_info": np.array([{"index": 0}], dtype=object),
                     "raw_prompt": np.array([[{"role": "user", "content": "abc"}]], dtype=object)})
    out = run_async(worker.compute_score(data))
    decoded = tokenizer.decode(response, skip_special_tokens=True)
    want = compute_score("flowrl_bench", decoded, "a")
    check(abs(out["reward_score"] - want) < 1e-9, f"reward {out} for {decoded!r}, compute_score gives {want}")
    ctx["reward_worker"] = worker
    return None, (f"{type(worker.reward_manager).__name__} -> compute_score {out['reward_score']:.3f} for "
                  f"{decoded!r}; reward_extra_info keys {sorted(out.get('reward_extra_info', {}))}")
