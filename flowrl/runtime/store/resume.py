"""Resuming a run: which checkpoint, whether the settings allow it, and restoring from it.

Checked before any model loads: a run that already reached train.steps says so
(RunFinished); settings that cannot change under a checkpoint (the model, the
task, the seed, the algorithm) are refused by name; every other changed
setting is listed and takes effect (a new learning rate applies from the first
resumed step).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flowrl.config import RunConfig
from flowrl.data.prompts import PromptStream
from flowrl.data.redact import redact
from flowrl.graph.role import ROLES
from flowrl.runtime.store import checkpoint
from flowrl.runtime.executor import Executor

FIXED = ("algorithm", "model.path", "model.dtype", "model.tiny_hidden_size", "model.tiny_num_layers",
         "model.reward_path", "task.name", "task.max_operand", "task.chat_template", "train.seed")
"""Settings a checkpoint fixes: its weights, data order and roles were made under them (and each role's binding,
roles.<name>.use; a role's other options, its learning rate, may change)."""
RUN_LENGTH = ("train.steps", "checkpoint.resume")


class RunFinished(ValueError):
    """The output folder holds a run that already reached train.steps."""


def checkpoints_dir(cfg: RunConfig) -> Path:
    return Path(cfg.train.output_dir) / "checkpoints"


def find(cfg: RunConfig) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to resume from and its state, after checking the settings against it; None: start anew."""
    if not cfg.checkpoint.resume:
        return None
    try:
        found = checkpoint.latest(checkpoints_dir(cfg))
    except checkpoint.CheckpointError as err:
        raise ValueError(str(err)) from None
    if found is None:
        return None
    state = checkpoint.read_state(found)
    check_settings(cfg, state.get("config"), found)
    if state["step"] >= cfg.train.steps:
        raise RunFinished(f"train.output_dir {cfg.train.output_dir!r} holds a finished run (step {state['step']} "
                          f"of train.steps={cfg.train.steps}); raise train.steps to train further, or use another "
                          f"output_dir")
    return found, state


def check_settings(cfg: RunConfig, saved: dict[str, Any] | None, path: Path) -> None:
    """Refuse settings the checkpoint fixes; list the others that changed (on stderr)."""
    if saved is None:
        return
    current = redact(cfg.model_dump(mode="json"))  # as saved: secrets masked
    saved, current = _sections_filled(saved, current), _sections_filled(current, saved)
    changed = {key: (old, new) for key, (old, new) in _diff(_flat(saved), _flat(current)).items()
               if not key.startswith(RUN_LENGTH) and not (_binding(key) and (old or "") == (new or ""))}
    fixed = [key for key in changed if key.startswith(FIXED) or _binding(key)]
    if fixed:
        old, new = changed[fixed[0]]
        raise ValueError(f"{fixed[0]}: the checkpoint {path} was made with {old!r}, not {new!r}; it cannot change "
                         f"on resume (use another train.output_dir, or set it back)")
    if changed:
        listed = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in sorted(changed.items()))
        print(f"flowrl: resuming with changed settings: {listed}", file=sys.stderr)


def restore(found: tuple[Path, dict[str, Any]], executor: Executor, stream: PromptStream, main: bool) -> int:
    """Load the checkpoint into the engines, the data position and the weight versions; returns its step."""
    path, _ = found
    state = checkpoint.load(path, executor.train_engines())
    stream.restore(state["stream"])
    # one past the saved counts: the roles that follow these weights sync to the loaded ones
    executor.versions = {role: version + 1 for role, version in state["versions"].items()}
    if main:
        print(f"flowrl: resumed from step {state['step']} ({path})", file=sys.stderr)
    return int(state["step"])


def _sections_filled(values: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """`values` (a config as saved) with the default section of each role `other` sets and it does not, so a
    section set on one side only compares field by field (roles.actor.lr 0.002 -> 0.001)."""
    roles = dict(values.get("roles") or {})
    for name in set(other.get("roles") or {}) - set(roles):
        if name in ROLES:
            roles[name] = RunConfig().section(name).model_dump(mode="json")
    return {**values, "roles": roles}


def _binding(key: str) -> bool:
    """roles.<name>.use, the class a role name is bound to ('' or absent: the name's own)."""
    parts = key.split(".")
    return len(parts) == 3 and parts[0] == "roles" and parts[2] == "use"


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and key != "algo":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {key: (old.get(key), new.get(key)) for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)}
