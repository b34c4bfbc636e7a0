"""benchmarks/verl_preflight.py's stages of the default trainer (trainer.use_v1, sync), in verl's packages: v1 (a
local Ray with main_ppo.run_ppo's ray.init arguments, TransferQueue, the trainer's prepare_step through
AgentLoopWorkerTQ, ReplayBuffer.sample and _compute_advantage) and metrics (the trainer's _compute_metrics, verl's
Tracking with the file logger, and run_verl's reading of that file); stop_v1 ends the Ray and TransferQueue that v1
started."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from verl_preflight_fakes import Handle, LocalTQManager, check, fake_llm_client, run_async

HERE = Path(__file__).resolve().parent


def ray_init_kwargs(config) -> dict:
    """main_ppo.run_ppo's ray.init arguments: verl's runtime_env (get_ppo_ray_runtime_env) merged with the
    config's ray_kwargs.ray_init (the overrides' env_vars among them); num_cpus is the caller's."""
    from omegaconf import OmegaConf

    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    default_runtime_env = get_ppo_ray_runtime_env(config)
    init = config.ray_kwargs.get("ray_init", {})
    if config.transfer_queue.enable:
        default_runtime_env.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    runtime_env = OmegaConf.merge(default_runtime_env, init.get("runtime_env", {}))
    kwargs = OmegaConf.to_container(OmegaConf.create({**init, "runtime_env": runtime_env}))
    kwargs.pop("num_cpus", None)
    return kwargs


def stage_v1(ctx):
    """The default trainer's path (trainer.use_v1, trainer.v1.trainer_mode sync): TaskRunnerV1's TransferQueue,
    PPOTrainer's own prepare_step (dataloader batch as a TensorDict, uid, global_steps, prompts registered in
    TransferQueue, AgentLoopManagerTQ's dispatch), AgentLoopWorkerTQ's agent loops and their TransferQueue puts,
    then the trainer's ReplayBuffer.sample and _compute_advantage (GRPO on what TransferQueue holds)."""
    import ray
    import torch
    from omegaconf import open_dict

    import transfer_queue as tq
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.utils.skip import SkipManager

    config = ctx["config"].copy()
    with open_dict(config):
        config.transfer_queue.enable = True  # TaskRunnerV1.run
    os.environ["TRANSFER_QUEUE_ENABLE"] = "1"
    # TaskRunnerV1.run's tq.init(config.transfer_queue), on a local Ray of 2 logical CPUs. TransferQueue's
    # controller and each storage unit are Ray actors of 1 CPU each (logical CPUs: a claim for scheduling, not a
    # limit): one storage unit here, not the config's 8, to start 2 processes, not 9
    tq_config = config.transfer_queue.copy()
    with open_dict(tq_config):
        tq_config.backend.SimpleStorage.num_data_storage_units = 1
    t = time.perf_counter()
    # no workers prestarted: every actor here runs in the overrides' runtime_env, which those would lack
    ray.init(**ray_init_kwargs(ctx["config"]), address="local", num_cpus=2, include_dashboard=False,
             log_to_driver=False, configure_logging=False, _system_config={"enable_worker_prestart": False})
    tq.init(tq_config)
    started = time.perf_counter() - t
    node_ip = ray.util.get_node_ip_address()
    client, server = fake_llm_client(ctx)
    worker_cls = AgentLoopWorkerTQ.__ray_metadata__.modified_class  # the class under @ray.remote

    async def make_worker():  # in a coroutine: the worker's loop is the running one, as in its actor
        return worker_cls(config, client, None, [Handle(ctx["reward_worker"])])

    worker = run_async(make_worker())
    trainer_cls = get_trainer_cls(config.trainer.v1.trainer_mode)
    trainer = object.__new__(trainer_cls)  # the trainer's data and sampling methods, without its workers
    trainer.config, trainer.trainer_mode = config, config.trainer.v1.trainer_mode
    trainer.parameter_sync_step = config.trainer.v1.get(trainer.trainer_mode, {}).get("parameter_sync_step", 1)
    trainer.tokenizer, trainer.processor = ctx["tokenizer"], ctx["processor"]
    trainer.train_dataloader, trainer.train_dataloader_it, trainer.global_steps = ctx["loader"], None, 1
    trainer.replay_buffer = trainer._build_replay_buffer()
    trainer.agent_loop_manager = LocalTQManager(worker, config.actor_rollout_ref.rollout.agent.num_workers)
    SkipManager.init(config)
    SkipManager.set_step(1)
    trainer.prepare_step()  # _add_batch_to_generate: the batch into TransferQueue and through the agent loops

    listed = tq.kv_list(partition_id="train")
    listed = listed.get("train", listed)
    statuses: dict = {}
    for tag in listed.values():
        statuses[tag.get("status")] = statuses.get(tag.get("status"), 0) + 1
    n, prompts = config.actor_rollout_ref.rollout.n, config.data.train_batch_size
    check(statuses.get("failure", 0) == 0 and statuses.get("success", 0) == prompts * n,
          f"TransferQueue holds {statuses}, want {prompts * n} success and {prompts} finished (a failed agent "
          "loop is logged by AgentLoopWorkerTQ._run_prompt, see above)")
    batch, _ = trainer.replay_buffer.sample(global_steps=1, partition_id="train",
                                            batch_size=prompts // trainer.parameter_sync_step)
    check(len(batch.keys) == prompts * n, f"ReplayBuffer.sample gave {len(batch.keys)} rows")
    # the GPU phases between (the actor's and the reference's compute_log_prob) stand in as the bypass mode of
    # _compute_old_log_prob writes its old_log_probs: the rollout's log-probs, in their TransferQueue layout
    for name in ("old_log_probs", "ref_log_prob"):
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["rollout_log_probs"])
        data[name] = data.pop("rollout_log_probs")
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data)
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["responses", "rm_scores", "advantages", "response_mask"])
    lengths = data["responses"].offsets().diff()
    if ctx["spec"]["lengths"] == "fixed":
        check(set(lengths.tolist()) == {ctx["rollout"].response_length}, f"fixed lengths: {lengths.tolist()[:8]}")
    adv = data["advantages"].to_padded_tensor(padding=0.0)
    check(torch.isfinite(adv).all().item() and adv.abs().sum().item() > 0, "v1 advantages zero or not finite")
    ctx.update(v1_trainer=trainer, v1_batch=batch, v1_metrics=metrics)
    return None, (f"{len(batch.keys)} rows: prepare_step -> AgentLoopWorkerTQ -> TransferQueue {statuses} -> "
                  f"ReplayBuffer.sample -> _compute_advantage; response lengths {lengths.min().item()}.."
                  f"{lengths.max().item()} (Ray at {node_ip} and TransferQueue up in {started:.1f} s)")


def stop_v1() -> None:
    """TransferQueue's actors and the local Ray, if the v1 stage started them."""
    import ray

    if ray.is_initialized():
        try:
            import transfer_queue as tq
            tq.close()
        finally:
            ray.shutdown()


def stage_metrics(ctx):
    """The v1 trainer's _compute_metrics on that batch (the phases' timings made up), verl's Tracking with the
    overrides' loggers (the file logger at VERL_FILE_LOGGER_PATH), and run_verl's reading of that file
    (verl_system.step_lines, verl_result)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator
    from verl.trainer.ppo.utils import need_critic
    from verl.utils.tracking import Tracking

    trainer, batch, config = ctx["v1_trainer"], ctx["v1_batch"], ctx["config"]
    trainer.use_critic = need_critic(config)
    trainer._rollout_moe_lb_metrics_accumulator = RolloutMoELoadBalanceMetricsAccumulator(
        model_config=config.actor_rollout_ref.model)
    trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: config.trainer.n_gpus_per_node)
    path = Path(os.environ.setdefault("VERL_FILE_LOGGER_PATH",  # verl_system.verl_env sets it, as for run_verl
                                      str(Path(ctx["spec_path"]).parent / "metrics.jsonl")))
    logger = Tracking(project_name=config.trainer.project_name, experiment_name=config.trainer.experiment_name,
                      default_backend=config.trainer.logger, config=OmegaConf.to_container(config, resolve=True))
    for step in (1, 2):  # a warm-up step and a timed one, as run_verl reads them
        metrics = dict(ctx["v1_metrics"])
        timing = {"gen": 1.0, "reward": 0.1, "old_log_prob": 0.3, "ref": 0.3, "adv": 0.1, "update_actor": 1.0,
                  "update_weights": 0.2, "step": 3.0}
        trainer._compute_metrics(batch, metrics, timing, global_steps=step, epoch=0)
        logger.log(data=metrics, step=step)
    logger.finish()
    sys.path.insert(0, str(HERE))
    import verl_system
    from bench_workload import Workload

    spec = ctx["spec"]
    wl = Workload(device="cuda", prompts=spec["prompts"], group=spec["group"], new_tokens=spec["new_tokens"],
                  prompt_len=spec["prompt_len"], micro=1, steps=1, warmup=1, lr=1e-7, kl_coef=0.001,
                  lengths=spec["lengths"])
    seen: dict = {}
    lines = verl_system.step_lines(path, seen)
    check([line["step"] for line in lines] == [1, 2], f"the file logger wrote steps {[x['step'] for x in lines]}")
    result = verl_system.verl_result(wl, lines, seen, time.perf_counter(), 0.0, 0)
    for key in ("s_per_step", "response_length_mean", "verl_throughput"):
        check(result[key] is not None, f"run_verl reads no {key} from verl's metrics: keys "
                                       f"{sorted(lines[-1]['data'])[:40]}")
    return None, (f"{len(lines[-1]['data'])} metrics a step in "
                  f"{path.name}; run_verl reads s/step {result['s_per_step']}, response length mean "
                  f"{result['response_length_mean']:.1f}, throughput {result['verl_throughput']:.0f}")
