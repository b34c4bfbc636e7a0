"""A simulated cluster on CPU: fake engines whose seconds and bytes are injected, to hold the planner to its bars.

`run_layout(case, cand, fit, card)` compiles the case's algorithm onto the candidate's pools (one pool, or
train | rollout), builds the roles over engines that spend each call's cost on the case's *true* device (a device
row whose constants differ from the table's, as a real card's do) on a virtual `Clock`, and that hold bytes on a
`Device` per pool (one simulated GPU of it: allocated bytes, their peak, an out-of-memory error past the card).
It runs the steps on the local executor (split pools with a buffer overlap producers and consumers in a thread,
as the Ray executor does) and returns metrics rows of virtual seconds (`timing_s/step`, `timing_s/<node>`) and
`memory/peak_gib/<pool>`, each simulated GPU's peak.

The clock keeps a time per thread and per pool: a call starts when its thread and its pool are both free; the
step ends when its last thread does. A thread the step starts (the buffer's producers) starts from the main
thread's time after the step's weight sync, the point where the pipeline starts it. So the measured step is the
schedule the executor ran (which calls ran in which thread, in which order), costed without the noise of a
shared CPU: the test is not timed, and a run of fakes takes milliseconds.

The bytes each engine holds are the engines' own figures (HFTrainConfig.estimate_memory's parts; vLLM's share of
the card, hf_static's weights and KV cache); *when* they are held is what the run does: the rollout's wake and
sleep around its sync and generation, an update's gradients and activations, the offloaded optimizer's step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flowrl as fl
from flowrl.config import RunConfig
from flowrl.data import PromptStream
from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.engines.memory import GIB, ModelShape, RankLoad, kv_cache
from flowrl.engines.protocols import SamplingParams
from flowrl.graph.role import ROLES, RoleSpec
from flowrl.plan.candidates import Candidate, Work
from flowrl.plan.costs import CostModel, DeviceKind
from flowrl.plan.memory import OVERHEAD, Fit, Roles, vllm_asleep
from flowrl.plan.simulate import GraphNode, graph_nodes, node_seconds
from flowrl.roles import Actor, Critic, Ref, Reward, Rollout
from flowrl.runtime.offpolicy import buffering
from flowrl.runtime.executor import LocalExecutor
from flowrl.runtime.factory import make_factory
from fakes import ROLE_CLASSES, FakeRolloutEngine, FakeTokenizer, FakeTrainEngine, ParityTask

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}


class OutOfMemory(RuntimeError):
    pass


@dataclass
class Device:
    """One simulated GPU of a pool."""

    capacity: int
    used: int = OVERHEAD
    peak: int = OVERHEAD

    def hold(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)
        if self.used > self.capacity:
            raise OutOfMemory(f"fake out of memory: {self.used / GIB:.1f} of {self.capacity / GIB:.1f} GiB")

    def free(self, n: int) -> None:
        self.used -= n

    @contextlib.contextmanager
    def holding(self, n: int):
        self.hold(n)
        try:
            yield
        finally:
            self.free(n)


class Clock:
    """Virtual seconds per thread and per pool (see the module docstring)."""

    def __init__(self) -> None:
        self.main, self.lock = threading.get_ident(), threading.Lock()
        self.start = self.spawn = 0.0
        self.thread: dict[int, float] = {}
        self.pool: dict[str, float] = {}
        self.spent: dict[tuple[str, str], float] = {}  # (role, category) -> seconds this step

    def begin_step(self) -> None:
        self.start = self.spawn = max([self.start, *self.thread.values(), *self.pool.values()])
        self.thread, self.spent = {}, {}

    def spend(self, pool: str, role: str, category: str, seconds: float) -> None:
        with self.lock:
            me = threading.get_ident()
            begin = max(self.thread.get(me, self.start if me == self.main else self.spawn), self.pool.get(pool, 0.0))
            self.thread[me] = self.pool[pool] = begin + seconds
            self.spent[role, category] = self.spent.get((role, category), 0.0) + seconds
            if category == "sync" and me == self.main:
                self.spawn = self.thread[me]

    def step_seconds(self) -> float:
        return max([self.start, *self.thread.values()]) - self.start


@dataclass
class Case:
    """A graph, a model shape, a cluster and the true device its engines cost on."""

    algo: Any
    algo_cfg: dict[str, Any] | None
    shape: ModelShape
    work: Work
    roles: Roles
    true: DeviceKind
    trained: tuple[str, ...] = ("actor",)


class CostedTrain(FakeTrainEngine):
    """A fake train engine that spends its passes' seconds and holds their bytes on its pool's Device."""

    def __init__(self, at: tuple[Clock, str, str], device: Device, seconds: dict[str, float], resident: int,
                 forward_b: int, update_b: int, step_b: int):
        super().__init__()
        (self.clock, self.pool, self.role), self.device, self.seconds = at, device, seconds
        self.forward_b, self.update_b, self.step_b = forward_b, update_b, step_b
        device.hold(resident)

    def forward(self, batch, **kwargs):
        with self.device.holding(self.forward_b):
            self.clock.spend(self.pool, self.role, "forward", self.seconds["forward"])
        return super().forward(batch, **kwargs)

    def update(self, batch, loss_fn, **kwargs):
        with self.device.holding(self.update_b):
            self.clock.spend(self.pool, self.role, "update", self.seconds["update"])
        with self.device.holding(self.step_b):  # an offloaded optimizer's step: its moments on the GPU
            pass
        return super().update(batch, loss_fn, **kwargs)


class CostedRollout(FakeRolloutEngine):
    """A fake rollout engine: holds `held` bytes (its weights and cache, or vLLM's share), `extra` more while it
    generates; with `asleep` (vLLM's sleep levels) it keeps only that between its generation and the next sync."""

    def __init__(self, at: tuple[Clock, str, str], device: Device, seconds: dict[str, float], held: int, extra: int,
                 asleep: int | None):
        super().__init__()
        (self.clock, self.pool, self.role), self.device, self.seconds = at, device, seconds
        self.held, self.extra, self.asleep, self.sleeping = held, extra, asleep, False
        device.hold(held)

    def wake(self) -> None:
        if self.sleeping:
            self.device.hold(self.held - self.asleep)
            self.sleeping = False

    def sync(self, train, rollout) -> None:
        self.wake()
        self.clock.spend(self.pool, self.role, "sync", self.seconds["sync"])

    def generate(self, *args, **kwargs):
        self.wake()
        with self.device.holding(self.extra):
            self.clock.spend(self.pool, self.role, "generate", self.seconds["generate"])
        out = super().generate(*args, **kwargs)
        if self.asleep is not None:
            self.device.free(self.held - self.asleep)
            self.sleeping = True
        return out


def category_seconds(case: Case, cand: Candidate, fit: Fit) -> dict[str, float]:
    """Each cost category's seconds on the case's true device."""
    costs = CostModel(case.true)
    return {cat: node_seconds(GraphNode(cat, cat, "x", ()), cand, case.shape, case.work, costs, fit)
            for cat in ("generate", "forward", "update", "sync")}


def train_bytes(case: Case, cand: Candidate) -> dict[str, int]:
    """The train engines' parts per GPU (their own estimate), the bytes the fakes hold and when."""
    world = cand.train_gpus
    load = RankLoad(world, rows=-(-case.work.rows // world), seq_len=case.work.seq_len,
                    tokens=-(-cand.micro_batch_size // world) * case.work.seq_len,
                    gradient_checkpointing=cand.gradient_checkpointing)
    engine = HFTrainConfig.model_validate({"offload_params": cand.offload_params, "compile": case.roles.compile,
                                           "max_tokens_per_micro_batch": cand.token_budget})  # 0: rows
    parts = engine.estimate_memory(case.shape, load)
    frozen = engine.estimate_memory(case.shape, load, trainable=False)
    moments = 0 if cand.offload_optimizer else parts["optimizer"]
    return {"trained": parts["weights"] + moments, "frozen": frozen["weights"],
            "forward": frozen["activations"] + parts["logits"],
            "update": parts["gradients"] + parts["activations"] + parts["logits"],
            "step": parts["gradients"] + parts["optimizer"] if cand.offload_optimizer else 0}


def rollout_bytes(case: Case, cand: Candidate, card: int) -> tuple[int, int, int | None]:
    """(held, extra while generating, held asleep or None) of one simulated rollout GPU."""
    if cand.engine == "vllm":
        asleep = vllm_asleep(cand, case.shape, case.true) if cand.colocated and cand.sleep_level else None
        return int(cand.gpu_memory_utilization * card), 0, asleep
    rows, s = -(-case.work.rows // cand.replicas), case.shape
    weights = 0 if cand.colocated and cand.train_gpus == 1 else s.weight_bytes
    kv = rows * case.work.seq_len * kv_cache(s, RankLoad(1, rows=1, seq_len=1, tokens=1))
    return weights + kv, 2 * rows * s.vocab_size * 4, None


def specs(case: Case, cand: Candidate, fit: Fit, devices: dict[str, Device], clock: Clock) -> dict[str, RoleSpec]:
    """The roles over costed fakes, each on its pool's Device and the clock."""
    sec, b = category_seconds(case, cand, fit), train_bytes(case, cand)
    train, gen = devices["train"], devices["gen"]
    pools = {"train": "global" if cand.colocated else "train", "gen": "global" if cand.colocated else "gen"}
    held, extra, asleep = rollout_bytes(case, cand, train.capacity)
    rollout = CostedRollout((clock, pools["gen"], "rollout"), gen, sec, held, extra, asleep)

    def trained(role):
        return CostedTrain((clock, pools["train"], role), train, sec, b["trained"], b["forward"], b["update"],
                           b["step"])

    built = {"actor": lambda ctx: Actor(engine=trained("actor")), "critic": lambda ctx: Critic(engine=trained("critic")),
             "ref": lambda ctx: Ref(engine=CostedTrain((clock, pools["train"], "ref"), train, sec, b["frozen"],
                                                       b["forward"], 0, 0)),
             "rollout": lambda ctx: Rollout(engine=rollout, params=SamplingParams(max_new_tokens=2),
                                            source=ctx.roles.get("actor"), weight_sync=rollout.sync),
             "reward": lambda ctx: Reward(fn=ctx.task.reward, tokenizer=FakeTokenizer(),
                                          meta_keys=ctx.task.meta_keys)}
    out = {}
    for name, make in built.items():
        base = ROLES.get(name)
        cls = type(f"Costed{base.cls.__name__}", (base.cls,), {"build": classmethod(lambda c, ctx, m=make: m(ctx))})
        out[name] = RoleSpec(name, cls, **{k: getattr(base, k) for k in
                                           ("trainable", "exported", "on_driver", "weights_from", "base_of")})
    return out


def placement(case: Case, cand: Candidate) -> fl.Placement:
    models = [*case.trained, "ref"]
    if cand.colocated:
        return fl.Placement(pools=[fl.Pool(name="global", roles=[*models, "rollout"])])
    return fl.Placement(pools=[fl.Pool(name="train", roles=models), fl.Pool(name="gen", roles=["rollout"])])


def run_layout(case: Case, cand: Candidate, fit: Fit, card: int, steps: int = 3) -> list[dict[str, float]]:
    """`steps` steps of the candidate's layout on fakes: rows of virtual seconds, with each pool's peak GiB."""
    clock, train = Clock(), Device(card)
    devices = {"train": train, "gen": train if cand.colocated else Device(card)}
    plan = fl.compile_plan(case.algo, placement(case, cand), INPUTS, ROLE_CLASSES, case.algo_cfg)
    factory = make_factory(RunConfig(), plan, ParityTask(), Path("unused"))
    factory = dataclasses.replace(factory, specs={**factory.specs, **specs(case, cand, fit, devices, clock)})
    executor = LocalExecutor(plan, factory.build(tuple(plan.roles)))
    if not cand.colocated:  # the pools stand for separate GPUs: producers run beside consumers
        executor.pipeline = buffering.make(plan, executor.nodes, lambda: executor.versions, overlap=True)
    nodes, _ = graph_nodes(plan)
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=4, seed=0)
    pools = {"global": train} if cand.colocated else devices
    rows = []
    try:
        for step in range(steps):
            clock.begin_step()
            logged = executor.run_step(step, stream)[1]
            row = {k: v for k, v in logged.items() if not k.startswith("timing_s/")}
            row.update({f"timing_s/{n.name}": clock.spent.get((n.name.split(".")[0], n.category), 0.0)
                        for n in nodes})
            row["timing_s/step"] = clock.step_seconds()
            row.update({f"memory/peak_gib/{name}": d.peak / GIB for name, d in pools.items()})
            row["memory/peak_gib"] = max(d.peak for d in pools.values()) / GIB
            rows.append(row)
    finally:
        executor.close()
    return rows
