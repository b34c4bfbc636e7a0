"""The `train.*` options that moved to the section of the component they configure (issue 42): the executor's,
the checkpoint's, the evaluation's and the debug dumps'. For one release the old key still works: it is moved to
its new place with one FutureWarning line; given together with the new key at a different value it is refused in
one line (which one was meant cannot be told).

The update sizes (train.mini_batch_size, micro_batch_size, forward_micro_batch_size, epochs) sized every role's
passes; now each train role's section holds its own (flowrl.roles.configs.UPDATE_SIZES). The old key sets it in
each registered role's section that has it and starts from no other's (those that do, the reference's, start
from that one's), under what the section sets itself, with one FutureWarning line naming the new keys."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import BaseModel

from flowrl.graph.role import ROLES
from flowrl.graph.role_config import engine_source
from flowrl.roles.configs import UPDATE_SIZES

MOVED = {
    "executor": "executor.name", "node_timeout_s": "executor.node_timeout_s", "ship_files": "executor.ship_files",
    "placement_timeout_s": "executor.placement_timeout_s", "rollout_share": "executor.rollout_share",
    "rendezvous_timeout_s": "executor.rendezvous_timeout_s", "gc_freeze": "executor.gc_freeze",
    "cpu_threads": "executor.cpu_threads",
    "save_every": "checkpoint.every", "keep_checkpoints": "checkpoint.keep", "resume": "checkpoint.resume",
    "export": "checkpoint.export", "shutdown_timeout_s": "checkpoint.shutdown_timeout_s",
    "eval_every": "eval.every", "eval_prompts": "eval.prompts", "eval_samples": "eval.samples",
    "dump_rollouts_every": "debug.dump_rollouts_every", "dump_eval": "debug.dump_eval",
    "dump_max_rows": "debug.dump_max_rows", "dump_max_bytes": "debug.dump_max_bytes",
    "profile_steps": "debug.profile_steps",
}
"""train.<key> -> its new dotted key (deprecated aliases, kept for one release)."""


def move_train_keys(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (raw run config values) with each deprecated train.<key> moved to its section; a key given both
    ways with different values is a ValueError naming both."""
    train = values.get("train")
    if not isinstance(train, dict) or not set(train) & {*MOVED, *UPDATE_SIZES}:
        return values
    values = _to_roles(values)
    train = values["train"]
    values, train = dict(values), dict(train)
    for key in [k for k in train if k in MOVED]:
        section, _, field = MOVED[key].partition(".")
        new = _as_section(values.get(section, {}))
        if field in new and new[field] != train[key]:
            raise ValueError(f"train.{key}={train[key]!r} and {MOVED[key]}={new[field]!r} disagree: train.{key} "
                             f"is the deprecated name of {MOVED[key]}; give {MOVED[key]} only")
        values[section] = {**new, field: train.pop(key)}
        warnings.warn(f"train.{key} is deprecated; use {MOVED[key]}", FutureWarning, stacklevel=3)
    values["train"] = train
    return values


def _as_section(value: Any) -> dict[str, Any]:
    """A section's raw values: a mapping, a built section, or (the executor's) a bare name."""
    if isinstance(value, str):
        return {"name": value}
    return value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else dict(value)


def sized_roles(key: str) -> list[str]:
    """The registered roles whose section has update size `key` and starts from no other role's section."""
    return [name for name in ROLES.names() if key in ROLES.get(name).config.model_fields
            and engine_source(name, ROLES.get(name)) is None]


def _to_roles(values: dict[str, Any]) -> dict[str, Any]:
    """Each deprecated train.<update size> into roles.<name>.<key> of each of sized_roles(key) (what the role's
    section sets wins)."""
    train, roles = dict(values["train"]), dict(values.get("roles") or {})
    for key in [k for k in UPDATE_SIZES if k in train]:
        value, names = train.pop(key), sized_roles(key)
        for name in names:
            section = roles.get(name, {})
            section = {"use": section} if isinstance(section, str) else _as_section(section)
            bound = section.get("use") or name  # a name bound to a class of other options keeps them
            if bound in ROLES and key in ROLES.get(bound).config.model_fields:
                roles[name] = {key: value, **section}
        warnings.warn(f"train.{key} is deprecated; use {', '.join(f'roles.{n}.{key}' for n in names)} (each "
                      f"role's own)", FutureWarning, stacklevel=4)
    return {**values, "train": train, "roles": roles}
