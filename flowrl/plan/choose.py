"""The planner's choice: enumerate candidates, drop what does not fit or an engine would refuse, simulate the
rest on the traced graph, keep the fastest. Never changes the user's math: LoRA only where allowed; values the
user set are fixed by the Space. A refusal's advice names every option that would make some layout fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field

from flowrl.engines.memory import GIB, ModelShape
from flowrl.errors import PlanError
from flowrl.plan.candidates import Candidate, Space, Work, enumerate_candidates
from flowrl.plan.cluster import ClusterConfig
from flowrl.plan.costs import CostModel
from flowrl.plan.memory import Fit, Roles, fit
from flowrl.plan.simulate import GraphNode, node_seconds, step_seconds

OPTIONS = {"gradient_checkpointing": "model.gradient_checkpointing=true",
           "offload_optimizer": "roles.actor.offload_optimizer=true",
           "offload_params": "roles.actor.offload_params=true", "lora_rank": "roles.actor.lora_rank=64",
           "dtype": "model.dtype=bfloat16"}


@dataclass(frozen=True)
class Scored:
    cand: Candidate
    fit: Fit
    seconds: float | None  # None: refused or does not fit
    why: str = ""
    node_s: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Choice:
    best: Scored
    scored: list[Scored]
    cluster: ClusterConfig

    def explain(self, top: int = 12) -> str:
        ok = sorted((s for s in self.scored if s.seconds is not None), key=lambda s: s.seconds)
        bad = [s for s in self.scored if s.seconds is None]
        lines = [f"{len(self.scored)} candidates on {self.cluster.describe()}: {len(ok)} fit, {len(bad)} rejected",
                 f"{'predicted s/step':>16}  {'peak GiB/GPU':>12}  {'vllm':>6}  layout"]
        for s in ok[:top]:
            lines.append(f"{s.seconds:16.2f}  {max(s.fit.peak.values()) / GIB:12.1f}  {s.cand.vllm_mode():>6}  "
                         f"{s.cand.label()}")
        reasons: dict[str, int] = {}
        for s in bad:
            reasons[s.why] = reasons.get(s.why, 0) + 1
        lines += [f"rejected {n}: {why}" for why, n in sorted(reasons.items(), key=lambda r: -r[1])[:6]]
        runner = ok[1] if len(ok) > 1 else None
        why = f"{runner.seconds / self.best.seconds:.2f}x faster than the next ({runner.cand.label()})" \
            if runner else "the only layout that fits"
        lines.append(f"chosen: {self.best.cand.label()}: {why}")
        return "\n".join(lines)


def preference(s: Scored) -> tuple[float, int, int]:
    """Fastest (to 3 significant digits), then the fewest memory options switched on, then the least memory."""
    options = s.cand.gradient_checkpointing + s.cand.offload_optimizer + s.cand.offload_params
    return float(f"{s.seconds:.3g}"), options, max(s.fit.peak.values())


class PlannerConfig(BaseModel):
    """How `placement=auto` chooses on a cluster."""

    model_config = ConfigDict(extra="forbid")
    allow_lora: bool = Field(False, description="May the planner train LoRA adapters (changes the math)?")
    lora_rank: int = Field(64, ge=1, description="The LoRA rank tried when allow_lora.")
    headroom: float = Field(0.95, gt=0, le=1, description="Share of a card's memory a layout may plan to use.")
    token_budget: bool = Field(True, description="Choose the trained and frozen roles' max_tokens_per_micro_batch "
                                                 "from memory (flowrl.plan.passes.token_budget), where the chosen "
                                                 "layout under it is predicted no slower than with its rows.")
    max_buffer_depth: int = Field(1, ge=0, description="The most batches in flight the planner may advise for an "
                                                       "fl.buffer on split pools (deeper is staler: it changes "
                                                       "the math, so raise it only where you allow that).")

    def build(self) -> "Planner":
        return Planner(self)


class Planner:
    def __init__(self, config: PlannerConfig):
        self.config = config

    def choose(self, nodes: list[GraphNode], depth: int, shape: ModelShape, work: Work, roles: Roles,
               cluster: ClusterConfig, space: Space, batch: dict[str, int], costs: CostModel) -> Choice:
        if self.config.allow_lora:
            space = replace(space, lora_ranks=tuple(sorted({*space.lora_ranks, self.config.lora_rank})))
        scored = [self.score(c, nodes, depth, shape, work, roles, cluster, batch, costs)
                  for c in enumerate_candidates(cluster, work, space, roles.rollout)]
        ok = [s for s in scored if s.seconds is not None]
        if scored and all(s.fit.layout_refused for s in scored):  # every layout refused as laid out: say why
            reasons = [s.fit.refused for s in scored]
            raise PlanError("placement: " + "; or ".join(sorted(set(reasons), key=lambda r: -reasons.count(r))))
        if not ok:
            raise PlanError(self.advice(nodes, depth, shape, work, roles, cluster, space, batch, costs, scored))
        return Choice(min(ok, key=preference), scored, cluster)

    def score(self, cand: Candidate, nodes: list[GraphNode], depth: int, shape: ModelShape, work: Work,
              roles: Roles, cluster: ClusterConfig, batch: dict[str, int], costs: CostModel) -> Scored:
        got = fit(cand, shape, work, roles, cluster, batch)
        if got.refused:
            return Scored(cand, got, None, got.refused)
        limit = int(cluster.gpu_bytes * self.config.headroom)
        if max(got.peak.values()) > limit:
            pool = max(got.peak, key=got.peak.get)
            return Scored(cand, got, None, f"pool {pool} needs more than {self.config.headroom:.0%} of a card")
        seconds = {n.name: node_seconds(n, cand, shape, work, costs, got) for n in nodes}
        total = step_seconds(nodes, seconds, cand, depth, costs.step_fixed_s)
        return Scored(cand, got, total, "", tuple(seconds.items()))

    def advice(self, nodes, depth, shape, work, roles, cluster, space, batch, costs, scored) -> str:
        """One line: what the nearest layout needs, and every option (or GPU count) with which one fits."""
        nearest = min((s for s in scored if not s.fit.refused), key=lambda s: max(s.fit.peak.values()), default=None)
        need = f"at least {max(nearest.fit.peak.values()) / GIB:.1f} GiB per GPU" if nearest else "nothing fits"
        wide = Space(lora_ranks=(0, self.config.lora_rank))
        fixes = set()
        shapes = [(shape, frozenset())] + ([(replace(shape, dtype_bytes=2), frozenset({"dtype"}))]
                                           if shape.dtype_bytes == 4 else [])
        for each, changed in shapes:
            for cand in enumerate_candidates(cluster, work, wide, roles.rollout):
                lent = replace(roles, frozen_lent=roles.frozen_lent or cand.lora_rank > 0)  # LoRA lends the base
                if fit(cand, each, work, lent, cluster, batch).fits(int(cluster.gpu_bytes * self.config.headroom)):
                    fixes.add(changed | frozenset(k for k in OPTIONS if k != "dtype" and getattr(cand, k)))
        minimal = sorted({f for f in fixes if not any(g < f for g in fixes)}, key=len)
        names = ["; or ".join(" + ".join(OPTIONS[k] for k in sorted(f)) for f in minimal if f)]
        more = self.more_gpus(shape, work, roles, cluster, batch)
        options = [n for n in names if n] + ([f"{more} GPUs"] if more else [])
        return (f"placement: no layout of {shape.num_params / 1e9:.2f}B parameters fits {cluster.describe()} "
                f"({need}, a card has {cluster.gpu_bytes / GIB:.1f} GiB); it would fit with "
                f"{'; or '.join(options) or 'a smaller workload'}")

    def more_gpus(self, shape, work, roles, cluster, batch) -> int | None:
        for nodes in (2, 4, 8, 16, 32):
            bigger = ClusterConfig(nodes=cluster.nodes * nodes, gpus_per_node=cluster.gpus_per_node,
                                   device=cluster.device) if cluster.gpus_per_node > 1 else \
                ClusterConfig(nodes=1, gpus_per_node=nodes, device=cluster.device)
            for cand in enumerate_candidates(bigger, work, Space(), roles.rollout):
                if fit(cand, shape, work, roles, bigger, batch).fits(int(bigger.gpu_bytes * self.config.headroom)):
                    return bigger.gpus
        return None
