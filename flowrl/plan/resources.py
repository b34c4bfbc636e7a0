"""Resources: how much GPU memory each role of a plan needs per GPU, and placements built from a GPU count.

The planner's part of the estimate is the load: how a step's rows (`Workload`) split over a pool's ranks
(each rank holds 1/world_size of a micro-batch; a rollout rank, its share of the rows). What an engine holds
under that load is the engine config's own estimate (`estimate_memory`, flowrl.engines.memory: weights,
gradients, AdamW moments, activations, logits, a KV cache, under the engine's options such as LoRA and
offload): a trainable role's as trained, a role that follows another's weights (the rollout) as a rollout
engine, any other on a pool (reference, reward model) as frozen, with no weights of its own where it reads
its base's module on the same pool (a LoRA actor's).

Estimates, not measurements: they decide whether a placement can fit before anything loads, and each figure
is printed by `flowrl plan --gpus N`.
"""

from __future__ import annotations

from dataclasses import dataclass

from flowrl.engines.configs import EngineConfig, RolloutEngineConfig, TrainEngineConfig
from flowrl.engines.memory import GIB, ModelShape, RankLoad
from flowrl.errors import PlanError
from flowrl.plan.placement import Placement, Pool
from flowrl.plan.planner import Plan

@dataclass(frozen=True)
class Workload:
    rows: int  # responses per step
    micro_batch_size: int  # responses per forward/backward pass (global)
    seq_len: int  # prompt + response tokens
    gradient_checkpointing: bool = False

    def per_rank(self, ranks: int) -> RankLoad:
        """One rank's share of a pool of `ranks`: its rows and one micro-batch's tokens."""
        return RankLoad(ranks, rows=-(-self.rows // ranks), seq_len=self.seq_len,
                        tokens=-(-self.micro_batch_size // ranks) * self.seq_len,
                        gradient_checkpointing=self.gradient_checkpointing)


def estimate(plan: Plan, shape: ModelShape, work: Workload,
             engines: dict[str, EngineConfig] | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """Bytes per GPU, by pool, role and component, each role's from its engine config (`engines`, by role;
    a role not in it: the default train or rollout engine)."""
    engines = engines or {}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for role, pool in plan.pools.items():
        out.setdefault(pool.name, {})[role] = _role_estimate(plan, role, shape, work.per_rank(pool.world_size),
                                                             engines)
    return out


def _role_estimate(plan: Plan, role: str, shape: ModelShape, load: RankLoad,
                   engines: dict[str, EngineConfig]) -> dict[str, int]:
    spec = plan.specs[role]
    follows = spec.weights_from is not None and not spec.trainable
    engine = engines.get(role) or (RolloutEngineConfig if follows else TrainEngineConfig).model_validate({})
    if isinstance(engine, RolloutEngineConfig):
        return engine.estimate_memory(shape, load, shares_weights=plan.shares_weights(role))
    base = plan.pools.get(spec.base_of) if spec.base_of is not None else None
    lender = engines.get(spec.base_of) or TrainEngineConfig.model_validate({})
    lent = base is not None and base.name == plan.pools[role].name and lender.lends_base()
    return engine.estimate_memory(shape, load, trainable=spec.trainable, base_lent=lent)


def check_fits(plan: Plan, per_gpu: dict[str, dict[str, dict[str, int]]], gpu_bytes: int) -> None:
    """A PlanError naming the pool, what it needs and what one GPU has, when an estimate does not fit."""
    for pool, roles in per_gpu.items():
        need = sum(sum(parts.values()) for parts in roles.values())
        if need > gpu_bytes:
            raise PlanError(f"placement: pool {pool!r} needs about {need / GIB:.3g} GiB per GPU "
                            f"({', '.join(f'{r} {sum(p.values()) / GIB:.3g}' for r, p in roles.items())}), "
                            f"but a GPU has {gpu_bytes / GIB:.3g} GiB; use more GPUs for it, activation "
                            f"checkpointing or smaller micro-batches")


def gpu_placement(roles: tuple[str, ...], followers: tuple[str, ...], gpus: int, nodes: int = 1,
                  split: float | None = None) -> Placement:
    """Every role on all `gpus` (the hybrid engine), or with `split`, the roles that follow weights (the rollout)
    on that fraction of the GPUs and the others on the rest."""
    if gpus < 1 or nodes < 1 or gpus % nodes:
        raise PlanError(f"placement: --gpus {gpus} must be a positive multiple of --nodes {nodes}")
    if split is None or not followers:
        return Placement(pools=[Pool(name="global", roles=list(roles), world_size=gpus, device="cuda")])
    generate = round(gpus * split)
    if not 0 < generate < gpus:
        raise PlanError(f"placement: a split of {split} leaves no GPU for one side of {gpus} GPUs")
    return Placement(pools=[Pool(name="train", roles=[r for r in roles if r not in followers],
                                 world_size=gpus - generate, device="cuda"),
                            Pool(name="generate", roles=list(followers), world_size=generate, device="cuda")])


def describe(per_gpu: dict[str, dict[str, dict[str, int]]], pools: dict[str, Pool]) -> str:
    lines = ["memory per GPU (estimate):"]
    for name, roles in per_gpu.items():
        total = sum(sum(parts.values()) for parts in roles.values())
        lines.append(f"  pool {name} ({pools[name].world_size} x {pools[name].device}): {total / GIB:.3g} GiB")
        for role, parts in roles.items():
            detail = ", ".join(f"{k} {v / GIB:.3g}" for k, v in parts.items())
            lines.append(f"    {role}: {detail}")
    return "\n".join(lines)
