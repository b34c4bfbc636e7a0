"""`flowrl export CHECKPOINT --output DIR`: a sharded checkpoint's policy as a Hugging Face model folder.

CHECKPOINT is a step folder (checkpoints/step_000010), a checkpoints folder or a run's output_dir (its
newest intact checkpoint is used). The run's config, saved in the checkpoint's state.json, says which
model it started from and how its engine was built (LoRA adapters are merged); the shards, written by any
number of ranks, are read whole in this one process. Optimizer state is not read.

A run folder is data, never code: the checkpoint must carry this user's signature (flowrl.runtime.store.signing),
and no name in its state.json is imported. Export needs only the task (the built-in tiny model's alphabet
comes from it): a task other than a built-in one is used only when the user names it with `--task`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from flowrl.config import RunConfig, validate
from flowrl.config.run_config import move_legacy_sections
from flowrl.data.tasks import BUILT_IN as BUILT_IN_TASKS
from flowrl.engines.train import sharded_checkpoint
from flowrl.engines.configs import ModelSource
from flowrl.engines.models.folders import MARKER, load_tokenizer
from flowrl.graph.role import ROLES
from flowrl.runtime.store import checkpoint
from flowrl.runtime.data_tasks import run_task
from flowrl.runtime.factory import model_path


def export(source: str | Path, output: str | Path, task: str | None = None) -> Path:
    """Writes the checkpoint's policy (merged if LoRA) and the tokenizer to folder `output`; `task`: the user's
    own task.name, when the run's is not built in."""
    step = _step_folder(Path(source))
    check_output(Path(output), step)
    state = checkpoint.read_state(step)
    if not isinstance(state.get("config"), dict):
        raise ValueError(f"checkpoint {step}: its state.json holds no run config to rebuild the model from")
    cfg = validate(RunConfig, _without_code(state["config"], step, task))
    role = _exported_role(step)
    section = cfg.section(role)
    path = model_path(cfg, run_task(cfg))
    engine = section.engine.build(ModelSource(path, cfg.model.dtype), head=section.HEAD, device="cpu")
    try:
        with checkpoint.verified(step):
            sharded_checkpoint.load(step / role, engine.model, trainable_only=engine.lora)
    except BaseException as err:  # DCP wraps a reader's error in its CheckpointException (a BaseException)
        if isinstance(checkpoint.first_failure(err), sharded_checkpoint.ChangedFile):
            raise ValueError(f"checkpoint {step}: {checkpoint.first_failure(err)}") from None
        if isinstance(err, sharded_checkpoint.ModelMismatch):
            raise ValueError(f"checkpoint {step}: {err}, built from {str(path)!r} as its state.json says; that "
                             f"model is not the one the run trained (another model shape)") from None
        raise
    engine.save_pretrained(str(output), load_tokenizer(path))
    return Path(output)


def check_output(output: Path, step: Path) -> None:
    """Refuses an `output` export would destroy what it did not write: the run folder itself, a folder inside
    it or holding it, or a non-empty folder that is not a previous export (no MARKER file in it)."""
    out, run = output.resolve(), _run_folder(step).resolve()
    if out == run or run in out.parents or out in run.parents:
        where = "the run folder" if out == run else "inside the run folder" if run in out.parents else "above the run"
        raise ValueError(f"--output {str(output)!r} is {where} {str(run)!r}; export never replaces a run's files: "
                         f"name another folder")
    if output.is_symlink() or (output.exists() and not output.is_dir()):
        raise ValueError(f"--output {str(output)!r} exists and is not a folder; name another folder")
    if output.is_dir() and any(output.iterdir()) and not (output / MARKER).is_file():
        raise ValueError(f"--output {str(output)!r} is a non-empty folder that flowrl did not export (no {MARKER}); "
                         f"export replaces its --output whole, so it refuses: name a new or empty folder")


def _run_folder(step: Path) -> Path:
    """The run's output_dir of a step folder (<run>/checkpoints/step_N), else the step folder's parent."""
    return step.parent.parent if step.parent.name == "checkpoints" else step.parent


def _exported_role(step: Path) -> str:
    """The one role of the checkpoint whose model a run exports (its RoleSpec says `exported`)."""
    found = [name for name in ROLES.names()
             if ROLES.get(name).exported and (step / name / sharded_checkpoint.METADATA).is_file()]
    if len(found) != 1:
        raise ValueError(f"checkpoint {step} has sharded state for {len(found)} exported roles ({found}), not one; "
                         f"it has {sorted(p.name for p in step.iterdir() if p.is_dir())}")
    return found[0]


def _without_code(config: dict[str, Any], step: Path, task: str | None) -> dict[str, Any]:
    """The saved config (its sections moved to the current keys: a run folder's old keys are not the user's to
    fix) with every name that would import code dropped (export needs none of them: the algorithm, every
    role's environment, the reward), and the task the user's `task` when it is not a built-in one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        values = move_legacy_sections(json.loads(json.dumps(config)))  # a copy
    values.pop("algorithm", None)
    for section in values.get("roles", {}).values():
        if isinstance(section, dict) and "env" in section:
            section["env"] = None
    values.setdefault("data", {})["reward"] = "auto"
    name = values.setdefault("task", {}).get("name", "arithmetic")
    if task is not None:
        values["task"]["name"] = task
    elif name not in BUILT_IN_TASKS:
        raise ValueError(f"checkpoint {step}: its state.json names task {name!r}; flowrl export imports no code "
                         f"named in a run folder: pass --task {name} if that task is your own")
    return values


def _step_folder(source: Path) -> Path:
    if (source / checkpoint.MANIFEST).is_file():
        problem = checkpoint.damage(source)
        if problem is not None:
            raise ValueError(f"checkpoint {source} is not usable ({problem})")
        return source
    for folder in (source, source / "checkpoints"):
        if folder.is_dir() and any(folder.glob("step_*")):
            try:
                found = checkpoint.latest(folder)
            except checkpoint.CheckpointError as err:
                raise ValueError(str(err)) from None
            if found is not None:
                return found
    raise ValueError(f"{source}: not a checkpoint (no {checkpoint.MANIFEST}), a checkpoints folder or a run's "
                     f"output_dir")
