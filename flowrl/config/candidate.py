"""A run config's own layout as the planner's Candidate, so `flowrl train` judges it with the planner's model.

`configured` reads the compiled plan's pools (the trained and frozen roles on one pool; the rollout on it,
colocated, or on a pool of its own) and the engines' options (the rollout's engine, vLLM's
tensor_parallel_size / gpu_memory_utilization / free_cache_engine; the train engines' offload_optimizer /
offload_params / lora_rank / max_tokens_per_micro_batch / compile; model.gradient_checkpointing; the micro-batch
size) into flowrl.plan.candidates.Candidate on a cluster of the GPUs the run uses, each of `gpu_bytes`.
A layout the Candidate cannot express (a role on a pool of its own beyond the rollout's, a role with a model of
its own or a reward model, a rollout engine other than hf_static or vLLM, trained roles with different engine
options, an engine option the phase model leaves at its default) raises Unexpressible naming what, in one line.
vLLM's enforce_eager decides whether its share holds a CUDA graph pool (flowrl.plan.memory.cuda_graphs) and
the decode step's cost (flowrl.plan.simulate).
`workload` and `batch_sizes` are what placement=auto (flowrl.runtime.layout.auto_plan) reads from the same config.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.config.run_config import RunConfig
from flowrl.engines.configs import ROLLOUT_ENGINES, EngineConfig
from flowrl.engines.hf.configs import HFStaticRolloutConfig, HFTrainConfig
from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.cluster import ClusterConfig, nearest_device
from flowrl.plan.memory import Roles
from flowrl.plan.planner import Plan
from flowrl.roles.configs import EngineRoleConfig, ScoreHeadConfig, TrainedRoleConfig

MEAN_SHARE = 0.5  # expected mean response length as a share of max_new_tokens (long-tailed work)
SAME = ("offload_optimizer", "offload_params", "lora_rank", "max_tokens_per_micro_batch")
DEFAULTED = ("logprob_chunk_tokens", "forward_max_tokens_per_micro_batch", "lora_target_modules")


class Unexpressible(ValueError):
    """The run's layout has something the planner's Candidate cannot say."""


@dataclass(frozen=True)
class Layout:
    cand: Candidate
    roles: Roles
    cluster: ClusterConfig
    batch: dict[str, int]  # the batch sizes the engines divide over a pool's ranks
    pools: dict[str, str]  # the phase model's pool ("global", "train", "gen") -> the run's pool name
    trained: tuple[str, ...]
    frozen: tuple[str, ...]
    follower: str | None  # the rollout
    policy: str | None  # the role whose weights it follows


def batch_sizes(cfg: RunConfig, plan: Plan) -> dict[str, int]:
    """Rows per micro-batch, mini-batch and no-grad pass, and epochs: the one place the planner reads them, from
    the first trained role's section (the policy's: roles.<name>.micro_batch_size, ...)."""
    sized = [section for role in plan.pools if plan.specs[role].trainable
             and isinstance(section := cfg.section(role, plan.specs[role]), TrainedRoleConfig)]
    t = sized[0] if sized else TrainedRoleConfig.model_validate({})
    return {"micro_batch_size": t.micro_batch_size, "mini_batch_size": t.mini_batch_size,
            "forward_micro_batch_size": t.forward_micro_batch_size or t.micro_batch_size, "epochs": t.epochs}


def workload(cfg: RunConfig, plan: Plan, prompt_len: int) -> Work:
    """One step's load: the batch's rows times the graph's samples per prompt, prompts of data.max_prompt_length
    (else `prompt_len`) tokens, responses up to max_new_tokens (long-tailed: MEAN_SHARE of it on average)."""
    n = max([node.row_multiplier() for node in plan.nodes] or [1])
    new, sizes = cfg.rollout.max_new_tokens, batch_sizes(cfg, plan)
    return Work(rows=cfg.train.batch_size * n, prompt_len=cfg.data.max_prompt_length or prompt_len,
                response_len=new, mean_response_len=new * MEAN_SHARE, mini_batch_size=sizes["mini_batch_size"],
                epochs=sizes["epochs"])


def engines(cfg: RunConfig, plan: Plan) -> dict[str, EngineConfig]:
    """Each placed role's engine config: the one its section holds (roles.<name>)."""
    sections = {role: cfg.section(role, plan.specs[role]) for role in plan.pools}
    return {role: section.engine for role, section in sections.items() if isinstance(section, EngineRoleConfig)}


def split_roles(plan: Plan) -> tuple[list[str], list[str], list[str]]:
    """The placed roles as (trained, frozen, followers: the roles that follow another's weights)."""
    followers = [r for r in plan.pools if plan.specs[r].weights_from and not plan.specs[r].trainable]
    trained = [r for r in plan.pools if plan.specs[r].trainable]
    return trained, [r for r in plan.pools if r not in trained and r not in followers], followers


def configured(cfg: RunConfig, plan: Plan, gpu_bytes: int, gpus_per_node: int | None = None) -> Layout:
    """The run's layout as a Candidate on the GPUs its pools use (one node of them unless `gpus_per_node`)."""
    trained, frozen, followers = split_roles(plan)
    if not plan.pools:
        raise Unexpressible("no model role is placed on a pool")
    engine = engines(cfg, plan)
    _check_sections(cfg, plan, engine, trained + frozen + followers)
    pool, rollout_pool = _pools(plan, trained + frozen, followers)
    split = rollout_pool is not None and rollout_pool.name != pool.name
    follower = followers[0] if followers else None
    rollout = _rollout_options(follower, engine[follower], split) if follower else {}
    cand = Candidate(train_gpus=pool.world_size, rollout_gpus=rollout_pool.world_size if split else 0,
                     gradient_checkpointing=cfg.model.gradient_checkpointing,
                     micro_batch_size=batch_sizes(cfg, plan)["micro_batch_size"],
                     **_train_options(trained, frozen, engine), **rollout)
    gpus = cand.train_gpus + cand.rollout_gpus
    per_node = gpus_per_node or gpus
    cluster = ClusterConfig(nodes=-(-gpus // per_node), gpus_per_node=per_node, device=nearest_device(gpu_bytes),
                            memory_gib=gpu_bytes / 2**30)
    names = {"train": pool.name} if not follower else \
        {"train": pool.name, "gen": rollout_pool.name} if split else {"global": pool.name}
    batch = {k: v for k, v in batch_sizes(cfg, plan).items() if k in ("mini_batch_size", "forward_micro_batch_size")}
    return Layout(cand, _roles(plan, trained, frozen, follower, engine), cluster, batch, names, tuple(trained),
                  tuple(frozen), follower, plan.specs[follower].weights_from if follower else None)


def _pools(plan: Plan, home_roles: list[str], followers: list[str]):
    """(the trained and frozen roles' pool, the rollout's pool or None)."""
    if len(followers) > 1:
        raise Unexpressible(f"roles {', '.join(followers)} each follow weights; the planner models one rollout")
    home = {plan.pools[r].name for r in home_roles}
    if len(home) > 1:
        raise Unexpressible(f"the trained and frozen roles sit on pools {', '.join(sorted(home))}; the planner "
                            f"models them on one pool")
    rollout_pool = plan.pools[followers[0]] if followers else None
    return (plan.pools[home_roles[0]] if home_roles else rollout_pool), rollout_pool


def _roles(plan: Plan, trained: list[str], frozen: list[str], follower: str | None,
           engine: dict[str, EngineConfig]) -> Roles:
    lent = {plan.specs[f].base_of in trained and engine[plan.specs[f].base_of].lends_base() for f in frozen}
    if len(lent) > 1:
        raise Unexpressible(f"of the frozen roles {', '.join(frozen)} some read a LoRA base and some load weights")
    # compiled layers save less for the backward (18 h + 6 i bytes a token, not 24 h + 8 i): one uncompiled trained
    # role (the cuda preset compiles the actor, not a critic) counts them all uncompiled, the larger
    return Roles(trained=len(trained), frozen=len(frozen), frozen_lent=lent == {True}, rollout=follower is not None,
                 compile=bool(trained) and all(engine[r].compile for r in trained))


def _check_sections(cfg: RunConfig, plan: Plan, engine: dict[str, EngineConfig], roles: list[str]) -> None:
    for role in roles:
        section = cfg.section(role, plan.specs[role])
        if role not in engine:
            raise Unexpressible(f"role {role!r} has no engine section (roles.{role}) the planner can read")
        if section.model is not None:
            raise Unexpressible(f"roles.{role}.model={section.model}: the planner models one model's shape")
        if isinstance(section, ScoreHeadConfig) or not (plan.specs[role].trainable or plan.specs[role].base_of
                                                         or plan.specs[role].weights_from):
            raise Unexpressible(f"role {role!r} loads a model of its own (a reward model: model.reward_path); the "
                                f"planner models the policy's shape")
        if plan.pools[role].device != "cuda":
            raise Unexpressible(f"pool {plan.pools[role].name!r} is on {plan.pools[role].device}")


def _train_options(trained: list[str], frozen: list[str], engine: dict[str, EngineConfig]) -> dict:
    for role in trained + frozen:
        if not isinstance(engine[role], HFTrainConfig):
            raise Unexpressible(f"roles.{role}.engine={engine[role].engine}: the planner models trained and "
                                f"frozen roles on the hf train engine")
        for name in DEFAULTED:
            if getattr(engine[role], name) != HFTrainConfig.model_fields[name].get_default(call_default_factory=True):
                raise Unexpressible(f"roles.{role}.{name} is set; the planner's candidate keeps its default")
    if not trained:
        return {}
    first = engine[trained[0]]
    for role in trained[1:]:
        for name in SAME:
            if getattr(engine[role], name) != getattr(first, name):
                raise Unexpressible(f"roles.{role}.{name} differs from roles.{trained[0]}.{name}; the planner "
                                    f"models one set of train engine options")
    for role in frozen:
        if engine[role].max_tokens_per_micro_batch != first.max_tokens_per_micro_batch:
            raise Unexpressible(f"roles.{role}.max_tokens_per_micro_batch differs from roles.{trained[0]}'s; the "
                                f"planner models one token budget")
    return {"offload_optimizer": first.offload_optimizer, "offload_params": first.offload_params,
            "lora_rank": first.lora_rank, "token_budget": first.max_tokens_per_micro_batch}


def _rollout_options(role: str, engine: EngineConfig, split: bool) -> dict:
    if isinstance(engine, HFStaticRolloutConfig):
        return {"engine": "hf_static"}
    if engine.engine != "vllm":  # by its registered name: vLLM's config loads vLLM, imported only when used
        raise Unexpressible(f"roles.{role}.engine={engine.engine}: the planner models hf_static and vllm")
    vllm = engine
    assert isinstance(vllm, ROLLOUT_ENGINES.get("vllm"))
    if vllm.kv_cache_gb is not None:
        raise Unexpressible(f"roles.{role}.kv_cache_gb is set; the planner sizes vLLM by gpu_memory_utilization")
    return {"engine": "vllm", "tensor_parallel": vllm.tensor_parallel_size,
            "gpu_memory_utilization": vllm.gpu_memory_utilization, "enforce_eager": vllm.enforce_eager,
            "sleep_level": 0 if split else vllm.free_cache_engine}
