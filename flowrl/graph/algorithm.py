"""`@algorithm`: an RL algorithm as a function over a batch and model roles.

    @flowrl.graph.algorithm(config=GRPOConfig)
    def grpo(batch, actor, rollout, ref, reward, cfg):
        batch = rollout.generate(batch, n=cfg.group_size)
        ...

Parameters named after registered roles (the built-in actor, rollout, ref,
critic, reward, reward_model, or your own `@flowrl.role`) declare the roles; a
parameter `cfg` receives the validated config. Calling the decorated
function with real roles runs it eagerly; `trace()` builds its graph.
`evaluation=` (another algorithm over the same roles) replaces the trainer's
greedy evaluation pass, e.g. SFT's held-out loss.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import networkx as nx
from pydantic import BaseModel, ConfigDict

from flowrl.errors import GraphError
from flowrl.graph import render
from flowrl.graph.registry import Registry
from flowrl.graph.role import ROLES, RoleHandle
from flowrl.graph.trace import SymBatch, Tracer


class NoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Algorithm:
    def __init__(self, fn: Callable, config: type[BaseModel] = NoConfig, overrides: dict[str, Any] | None = None,
                 evaluation: "Algorithm | None" = None):
        self.fn, self.config_cls, self.evaluation = fn, config, evaluation
        self.overrides = dict(overrides or {})
        functools.update_wrapper(self, fn)
        params = list(inspect.signature(fn).parameters)
        if not params or params[0] in ROLES or params[0] == "cfg":
            raise GraphError(f"algorithm {fn.__name__}: the first parameter must be the batch")
        unknown = [p for p in params[1:] if p not in ROLES and p != "cfg"]
        if unknown:
            raise GraphError(f"algorithm {fn.__name__}: parameter {unknown[0]!r} is neither a role (registered: "
                             f"{ROLES.names()}) nor 'cfg'")
        self.roles = tuple(p for p in params[1:] if p in ROLES)
        self._takes_cfg = "cfg" in params

    @property
    def name(self) -> str:
        return self.fn.__name__

    def options(self, **overrides: Any) -> "Algorithm":
        """A copy whose config defaults are updated (validated when the config is built)."""
        return Algorithm(self.fn, self.config_cls, {**self.overrides, **overrides}, self.evaluation)

    def make_config(self, values: dict[str, Any] | BaseModel | None = None) -> BaseModel:
        if isinstance(values, self.config_cls):
            return values
        return self.config_cls(**{**self.overrides, **dict(values or {})})

    def __call__(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if self._takes_cfg and "cfg" not in kwargs and len(args) < len(self.roles) + 1:
            kwargs["cfg"] = self.make_config()
        return self.fn(batch, *args, **kwargs)

    def trace(self, input_fields: set[str] | frozenset[str], role_classes: dict[str, type] | None = None,
              cfg: BaseModel | dict[str, Any] | None = None) -> tuple[nx.DiGraph, list[str]]:
        """The graph and its nodes in trace order (a valid topological order).

        `role_classes` holds the roles the run gives (default: every role's registered class); using any
        other role fails here.
        """
        if role_classes is None:
            role_classes = {role: ROLES.get(role).cls for role in self.roles}
        tracer = Tracer(frozenset(input_fields))
        kwargs: dict[str, Any] = {}
        for role in self.roles:
            cls = role_classes.get(role)
            kwargs[role] = RoleHandle(role, cls) if cls is not None else _MissingRole(self.name, role, role_classes)
        if self._takes_cfg:
            kwargs["cfg"] = self.make_config(cfg)
        out = self.fn(tracer.latest, **kwargs)
        if out is not None and not isinstance(out, SymBatch):
            raise GraphError(f"algorithm {self.name} returned {type(out).__name__}; return the batch or None")
        return tracer.graph, tracer.order

    def __repr__(self) -> str:
        return f"Algorithm({self.name}, roles={self.roles})"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """In Jupyter: the graph traced with the registered roles and the config's defaults, as a chart."""
        graph, order = self.trace(self.input_fields())
        return render.mimebundle(graph, order, self.name, repr(self))

    def input_fields(self) -> set[str]:
        """The prompt batch fields every run provides (tasks may add metadata columns)."""
        return {"prompt_ids", "prompt_mask", "uid"}


def algorithm(fn: Callable | None = None, *, config: type[BaseModel] = NoConfig,
              evaluation: Algorithm | None = None):
    """Decorate an algorithm function; bare or with `config=` (a pydantic model) and `evaluation=` (the graph
    the trainer's evaluation runs instead of the greedy pass)."""
    if fn is not None:
        return Algorithm(fn, config, evaluation=evaluation)
    return lambda f: Algorithm(f, config, evaluation=evaluation)


class _MissingRole:
    """A role the run did not give; any use names it."""

    def __init__(self, algo: str, role: str, given: dict[str, type]):
        self._algo, self._role, self._given = algo, role, sorted(given)

    def __getattr__(self, method: str) -> Any:
        raise GraphError(f"algorithm {self._algo} uses role {self._role!r} ({self._role}.{method}), "
                         f"which was not given; given roles: {self._given}")


ALGORITHMS: Registry[Algorithm] = Registry("algorithm")
"""Algorithms by name (`flowrl train NAME`): the prebuilt ones register as flowrl.algorithms is imported (the
trainer and the CLI import it), yours with `ALGORITHMS.register(name, algorithm)`."""
