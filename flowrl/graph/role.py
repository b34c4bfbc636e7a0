"""Roles: classes registered by name whose `@graph_method`s become graph nodes.

    @flowrl.role("judge", on_driver=True)
    class Judge:
        @flowrl.graph_method(reads=("response_ids", "response_mask"), writes=("judge_scores",))
        def score(self, batch): ...

An algorithm parameter named after a registered role declares that role. The
registration says what plans need to know, so no planner or executor ever
compares role names:

- trainable: the role holds a TrainEngine at `.engine` whose state checkpoints save and load;
- exported: its model is the policy written out at the end of a run;
- on_driver: it may run in the driver process (a reward function); otherwise it needs a pool;
- weights_from: the role whose weights it follows (a rollout follows the actor); the planner
  inserts its SYNC method before its first node of a step, and colocated on one rank the two
  share one module (the hybrid engine);
- base_of: the role whose starting weights it holds, frozen (the reference holds the actor's); it is
  built after that role, and under LoRA it reads them from that role's module with the adapters off;
- engines: the run config's engine sections its build reads (the reference builds on `actor.*`), so a
  section no role of the run reads is reported as having no effect;
- a graph method's `defer_to` and `updates_weights` (see trace.Spec).

Each role has a section of the run config, `roles.<name>`: its `config` class (a RoleConfig,
flowrl.graph.role_config). Instances are built by `cls.build(ctx)` when the class defines `build`, else by
that config's `build(cls, ctx)` (the built-in roles build their engines there, flowrl.roles.configs).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from flowrl.errors import GraphError
from flowrl.graph.registry import Registry
from flowrl.graph.role_config import RoleConfig
from flowrl.graph.trace import Fields, NodeKind, Spec, SymBatch, check_call

SPEC_ATTR = "__flowrl_spec__"
ROLE_ATTR = "__flowrl_role__"


@dataclass(frozen=True)
class RoleSpec:
    name: str
    cls: type
    trainable: bool = False
    exported: bool = False
    on_driver: bool = False
    weights_from: str | None = None
    base_of: str | None = None
    engines: tuple[str, ...] = ()
    config: type[RoleConfig] = RoleConfig  # its section of the run config, roles.<name>

    def methods(self) -> dict[str, Spec]:
        return graph_methods(self.cls)

    def sync_method(self) -> str:
        syncs = [name for name, spec in self.methods().items() if spec.kind is NodeKind.SYNC]
        assert len(syncs) == 1, f"role {self.name!r} follows weights but has sync methods {syncs}"
        return syncs[0]

    def build(self, ctx: Any) -> Any:
        """The class's own `build(ctx)` when it defines one, else its section's (`ctx.config`, the role's
        RoleConfig; its defaults when the context gives none)."""
        builder = getattr(self.cls, "build", None)
        if builder is not None:
            return builder(ctx)
        config = getattr(ctx, "config", None)
        return (config if isinstance(config, self.config) else self.config()).build(self.cls, ctx)


def close_role(instance: Any) -> None:
    """At the run's end: a role class's optional `close()` releases what its instance holds (e.g. an inference
    server), as its optional `build(ctx)` made it."""
    closer = getattr(type(instance), "close", None)
    if closer is not None:
        closer(instance)


ROLES: Registry[RoleSpec] = Registry("role")
"""Roles by name, filled as role classes are defined: the built-in ones when flowrl.roles is imported (as
`import flowrl` does before it hands out the graph API, and the config and the planner do), yours by
`@flowrl.role`. The graph layer names no module above it."""


def role(name: str | type | None = None, *, trainable: bool = False, exported: bool = False,
         on_driver: bool = False, weights_from: str | None = None, base_of: str | None = None,
         engines: tuple[str, ...] | None = None, config: type[RoleConfig] | None = None) -> Any:
    """Register a role class; bare (`@flowrl.role`, named after the class in snake_case) or with arguments;
    `config` (a RoleConfig subclass) is its section of the run config, `roles.<name>`. A subclass of a registered
    role keeps that role's `config` and `engines` unless it gives its own (a rollout's subclass is configured as
    the rollout is)."""

    def register(cls: type) -> type:
        role_name = name if isinstance(name, str) else _snake(cls.__name__)
        inherited = getattr(cls, ROLE_ATTR, None) or RoleSpec(role_name, cls)  # a registered base class's
        spec = RoleSpec(role_name, cls, trainable=trainable, exported=exported, on_driver=on_driver,
                        weights_from=weights_from, base_of=base_of,
                        engines=inherited.engines if engines is None else tuple(engines),
                        config=config or inherited.config)
        config_cls = spec.config
        if not (isinstance(config_cls, type) and issubclass(config_cls, RoleConfig)):
            raise GraphError(f"role {role_name!r}: config={config_cls!r} is not a flowrl.RoleConfig subclass")
        methods = graph_methods(cls)
        if not methods:
            raise GraphError(f"role {role_name!r} ({cls.__name__}) has no @flowrl.graph_method")
        syncs = [m for m, s in methods.items() if s.kind is NodeKind.SYNC]
        if weights_from is not None and len(syncs) != 1:
            raise GraphError(f"role {role_name!r} follows {weights_from!r}'s weights, so it needs exactly one "
                             f"graph method of kind 'sync'; it has {syncs}")
        for method, mspec in methods.items():
            if mspec.defer_to is not None and mspec.defer_to not in methods:
                raise GraphError(f"{role_name}.{method}: defer_to={mspec.defer_to!r} is not a graph method of "
                                 f"the role")
            target = getattr(cls, mspec.defer_to) if mspec.defer_to is not None else None
            params = inspect.signature(target).parameters.values() if target is not None else ()
            if target is not None and not any(p.name == "deferred" or p.kind is p.VAR_KEYWORD for p in params):
                raise GraphError(f"{role_name}.{method}: defer_to={mspec.defer_to!r}, but {mspec.defer_to}() takes no "
                                 f"`deferred` argument (the call the plan folds into it, flowrl.graph.trace.Deferred)")
        setattr(cls, ROLE_ATTR, spec)
        ROLES.register(role_name, spec, replace=_redefined(role_name, cls))
        return cls

    return register(name) if isinstance(name, type) else register


def graph_method(fn: Callable | None = None, *, reads: Fields = (), writes: Fields = (), kind: str = "map",
                 check: Callable[..., None] | None = None, defer_to: str | None = None,
                 updates_weights: bool = False, rows_per_input: str | None = None) -> Callable:
    """Mark a role method as a graph node that reads and writes the named batch fields (bare or with arguments).

    kind: "map" keeps rows, "rows" changes them, "sync" moves weights. check(**kwargs) validates a call's
    arguments at trace time. rows_per_input: the keyword argument whose value is how many rows each input row
    becomes (a sampler's `n`), which sizes memory and streamed requests. defer_to / updates_weights: see
    flowrl.graph.trace.Spec.
    """
    spec = Spec(reads=reads, writes=writes, kind=NodeKind(kind), check=check, defer_to=defer_to,
                updates_weights=updates_weights, rows_per_input=rows_per_input)

    def mark(method: Callable) -> Callable:
        setattr(method, SPEC_ATTR, spec)
        return method

    return mark(fn) if fn is not None else mark


def graph_methods(cls: type) -> dict[str, Spec]:
    return {name: getattr(getattr(cls, name), SPEC_ATTR) for name in dir(cls)
            if getattr(getattr(cls, name, None), SPEC_ATTR, None) is not None}


def role_spec(name: str, cls: type | None = None) -> RoleSpec:
    """The registration of role `name`; with `cls`, that class bound to the name (its traits, `name` kept)."""
    if cls is None:
        return ROLES.get(name)
    spec = getattr(cls, ROLE_ATTR, None)
    if spec is None:
        raise GraphError(f"role {name!r}: {cls.__name__} is not a @flowrl.role class")
    return spec if spec.name == name else replace(spec, name=name)


class RoleHandle:
    """Stands in for a role during tracing; attribute access yields its graph methods."""

    def __init__(self, name: str, cls: type):
        self._name, self._cls = name, cls

    def __getattr__(self, method: str) -> Callable[..., SymBatch]:
        methods = graph_methods(self._cls)
        if method not in methods:
            raise GraphError(f"role {self._name!r} has no graph method {method!r}; it has {sorted(methods)}")
        spec = methods[method]

        def call(batch: SymBatch, **kwargs: Any) -> SymBatch:
            if not isinstance(batch, SymBatch):
                raise GraphError(f"{self._name}.{method} got {type(batch).__name__}, expected the traced batch")
            check_call(f"{self._name}.{method}", getattr(self._cls, method), None, batch, **kwargs)
            if spec.check is not None:
                spec.check(**kwargs)
            return batch.tracer.record(batch, f"{self._name}.{method}", spec, kwargs,
                                       role=self._name, method=method)

        return call


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _redefined(name: str, cls: type) -> bool:
    """The same class defined again (a re-run notebook cell, a worker unpickling it) replaces its entry."""
    old = ROLES.raw(name)
    return isinstance(old, RoleSpec) and (old.cls.__qualname__, old.cls.__module__) == (cls.__qualname__,
                                                                                        cls.__module__)
