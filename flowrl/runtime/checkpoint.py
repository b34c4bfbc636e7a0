"""Atomic checkpoints: a step folder appears whole or not at all.

Layout: <dir>/step_000010/{<role>/, state.json}. A checkpoint is written into
a hidden temporary folder and renamed into place, and only then does the
`latest` pointer (itself replaced atomically) move to it, so a crash at any
point leaves the previous checkpoint intact and resumable.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from flowrl.engines.protocols import TrainEngine

STATE = "state.json"
LATEST = "latest"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def save(root: str | Path, step: int, engines: dict[str, TrainEngine], state: dict[str, Any],
         keep: int = 2, is_main: bool = True) -> Path:
    """Write a checkpoint; with several ranks all call it (engine saves are collective), rank 0 writes."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = root / f".tmp_{final.name}"
    if not is_main:
        for role, engine in engines.items():
            engine.save(str(tmp / role))
        return final
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for role, engine in engines.items():
        engine.save(str(tmp / role))
    _write_atomic(tmp / STATE, json.dumps({"step": step, **state}, indent=1))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    _write_atomic(root / LATEST, final.name)
    _prune(root, keep)
    return final


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    pointer = Path(root) / LATEST
    if not pointer.exists():
        return None
    path = Path(root) / pointer.read_text().strip()
    return path if (path / STATE).exists() else None


def load(path: str | Path, engines: dict[str, TrainEngine]) -> dict[str, Any]:
    path = Path(path)
    for role, engine in engines.items():
        if not (path / role).exists():
            raise ValueError(f"checkpoint {path} has no state for role {role!r}; it has "
                             f"{sorted(p.name for p in path.iterdir() if p.is_dir())}")
        engine.load(str(path / role))
    return json.loads((path / STATE).read_text())


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
