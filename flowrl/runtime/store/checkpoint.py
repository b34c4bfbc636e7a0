"""Atomic, verified checkpoints: a step folder appears whole or not at all, and is checked before use.

Layout: <dir>/step_000010/{<role>/, state.json, manifest.json, manifest.sig}. A
checkpoint is written into a hidden temporary folder, its manifest (the size
and sha256 of every file) and the manifest's signature (flowrl.runtime.store.signing)
written last, and the folder renamed into place; only then does
the `latest` pointer (itself replaced atomically) move to it. So a crash at any
point leaves the previous checkpoint intact. With several ranks every rank
writes its own shards of each engine's state into the temporary folder
(flowrl.engines.train.sharded_checkpoint); rank 0 renames it once all have finished.

`latest()` returns the newest checkpoint whose files match its manifest: a
damaged newest one (truncated, edited, a pointer to a missing folder) is
skipped with a warning, never deleted, and an older intact one is used. Disk
errors while saving (a full disk), and every failure inside
torch.distributed.checkpoint (its CheckpointException is a BaseException), are
raised as one-line CheckpointErrors naming the folder, with the temporary folder
removed and the previous checkpoint left as it was; Ctrl-C inside a save is a
KeyboardInterrupt saying so.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from flowrl.engines.train import sharded_checkpoint
from flowrl.engines.protocols import TrainEngine
from flowrl.runtime import distributed
from flowrl.runtime.store import signing

STATE = "state.json"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"  # HMAC of the manifest under this user's key (flowrl.runtime.store.signing)
LATEST = "latest"


class CheckpointError(ValueError):
    """A checkpoint could not be written or read; the message names the folder."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def save(root: str | Path, step: int, engines: dict[str, TrainEngine], state: dict[str, Any],
         keep: int = 2, is_main: bool = True) -> Path:
    """Write a checkpoint; with several ranks all call it (engine saves are collective: each rank writes its
    shards), and rank 0 writes the rest and renames the folder into place."""
    root = Path(root)
    final = step_dir(root, step)
    tmp = root / f".tmp_{final.name}"
    if not is_main:
        distributed.barrier()  # rank 0 has made the temporary folder afresh
        try:
            for role, engine in engines.items():
                engine.save(str(tmp / role))
        except (OSError, CheckpointException) as err:
            raise _save_error(final, err) from None
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        distributed.barrier()
        for role, engine in engines.items():
            engine.save(str(tmp / role))
        _write_atomic(tmp / STATE, json.dumps({"step": step, **state}, indent=1))
        manifest = json.dumps(_manifest(tmp), indent=1)
        _write_atomic(tmp / MANIFEST, manifest)
        _write_atomic(tmp / SIGNATURE, signing.sign(manifest.encode()))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        _point_latest(root / LATEST, final.name)
    except (OSError, CheckpointException, KeyboardInterrupt) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_error(final, err) from None
    _prune(root, keep)
    return final


def first_failure(err: BaseException) -> BaseException:
    """The exception inside DCP's CheckpointException (its first failed rank's), else `err` itself."""
    if isinstance(err, CheckpointException) and err.failures:
        return next(iter(err.failures.values()))[0]
    return err


def reason(err: BaseException) -> str:
    """One line for a checkpoint failure: a full disk by name, else the error's type and first line."""
    err = first_failure(err)
    if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
        return "the disk is full"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _save_error(final: Path, err: BaseException) -> BaseException:
    if isinstance(first_failure(err), KeyboardInterrupt):
        return KeyboardInterrupt(f"interrupted while writing checkpoint {final}; the previous checkpoint is intact")
    why = reason(err)
    if why != "the disk is full":  # torch's own writers fail a full disk as "unexpected pos" RuntimeErrors
        free, used = shutil.disk_usage(final.parent).free, _size(max(final.parent.glob("step_*"), default=None))
        if free < used:
            why = f"the disk is full: {free >> 10} KiB free, the last checkpoint took {used >> 10} KiB; {why}"
    return CheckpointError(f"checkpoint {final}: could not be written ({why}); the previous checkpoint is intact")


def _size(folder: Path | None) -> int:
    return 0 if folder is None else sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def latest(root: str | Path) -> Path | None:
    """The newest intact checkpoint, or None when there is none; damaged newer ones are skipped with a warning.

    Raises CheckpointError when checkpoints exist but none is intact (nothing is deleted)."""
    root = Path(root)
    found = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True) if root.is_dir() else []
    problem = _pointer_problem(root / LATEST)
    if problem is not None:
        warnings.warn(f"checkpoint pointer {root / LATEST} {problem}; looking for the newest intact checkpoint "
                      f"instead", stacklevel=2)
    for path in found:
        problem = damage(path)
        if problem is None:
            return path
        warnings.warn(f"checkpoint {path} is {'refused' if unsigned(path) else 'damaged'} ({problem}); trying an "
                      f"older one", stacklevel=2)
    if found:
        raise CheckpointError(f"{root}: no intact checkpoint among {[p.name for p in found]} (the newest: "
                              f"{damage(found[0])}); move the folder away to start over, or set checkpoint.resume=false")
    return None


def _pointer_problem(pointer: Path) -> str | None:
    """What is wrong with the `latest` pointer (None: absent, or names a step folder that exists). It is read
    without following a symlink, and its contents are never printed unless they are a step folder's name."""
    if pointer.is_symlink():
        return "is a symlink, which flowrl never follows"
    if not pointer.exists():
        return None
    try:
        fd = os.open(pointer, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            name = f.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return "is not a small text file naming a step folder"
    if not re.fullmatch(r"step_\d+", name):
        return "does not name a step folder"
    return None if (pointer.parent / name).is_dir() else f"names {name!r}, which does not exist"


def damage(path: Path) -> str | None:
    """What is wrong with the checkpoint at `path` (None when its files match its manifest)."""
    if not (path / MANIFEST).is_file():
        return f"no {MANIFEST}"
    return unsigned(path) or _files_differ(path)


def _files_differ(path: Path) -> str | None:
    """Which file of the checkpoint at `path` differs from its manifest (None: none does)."""
    try:
        expected = json.loads((path / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{MANIFEST} is not valid JSON"
    actual = _manifest(path)
    for name, entry in expected.items():
        if name not in actual:
            return f"{name} is missing"
        if actual[name] != entry:
            return f"{name} has {actual[name]['size']} bytes, or content, other than saved"
    return None


def unsigned(path: Path) -> str | None:
    """Why the checkpoint at `path` is not this user's (None: its manifest carries this user's signature)."""
    how = (f"its engine state holds pickles, so it is not loaded: if you trust the folder, `flowrl trust "
           f"{path.parent}` signs it with your key")
    if not (path / MANIFEST).is_file():
        return None  # damage() names that
    if not (path / SIGNATURE).is_file():
        return f"not signed (made before flowrl signed checkpoints, or elsewhere); {how}"
    if not signing.verify((path / MANIFEST).read_bytes(), (path / SIGNATURE).read_text(errors="replace")):
        return f"its signature does not match your key {signing.key_path()} (made by another user, or edited); {how}"
    return None


def trust(folder: str | Path) -> list[Path]:
    """Sign every checkpoint under `folder` (a step folder, a checkpoints folder or a run's output_dir) whose
    files match its manifest: the user vouches for them. Returns the folders signed."""
    folder = Path(folder)
    steps = [folder] if (folder / MANIFEST).is_file() else sorted({*folder.glob("step_*"),
                                                                   *folder.glob("checkpoints/step_*")})
    signed = []
    for step in steps:
        if (step / MANIFEST).is_file() and _files_differ(step) is None:
            _write_atomic(step / SIGNATURE, signing.sign((step / MANIFEST).read_bytes()))
            signed.append(step)
    if not signed:
        raise CheckpointError(f"{folder}: no checkpoint whose files match its manifest to sign")
    return signed


def read_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / STATE).read_text())


def verified(path: Path) -> Any:
    """A context inside which engine loads read each file of checkpoint `path` once and load those bytes only
    if they are what its manifest lists; the manifest's bytes are read once and their signature checked."""
    manifest = (path / MANIFEST).read_bytes()
    if not signing.verify(manifest, (path / SIGNATURE).read_text(errors="replace")):
        raise CheckpointError(f"checkpoint {path}: its manifest changed after it was checked; refused")
    entries = json.loads(manifest)
    return sharded_checkpoint.expecting({os.path.abspath(path / name): entry["sha256"]
                                         for name, entry in entries.items()})


def load(path: str | Path, engines: dict[str, TrainEngine]) -> dict[str, Any]:
    path = Path(path)
    for role, engine in engines.items():
        if not (path / role).exists():
            raise ValueError(f"checkpoint {path} has no state for role {role!r}; it has "
                             f"{sorted(p.name for p in path.iterdir() if p.is_dir())}")
        try:
            with verified(path):
                engine.load(str(path / role))
        except (OSError, RuntimeError, CheckpointException, sharded_checkpoint.ChangedFile,
                sharded_checkpoint.ModelMismatch) as err:
            if isinstance(first_failure(err), sharded_checkpoint.ChangedFile):
                raise CheckpointError(f"checkpoint {path}: {first_failure(err)}") from None
            raise CheckpointError(f"checkpoint {path}: role {role!r} does not load into this run's engine "
                                  f"({reason(err)}); it was saved under other model or engine settings (LoRA, "
                                  f"model.*, or data files whose characters made the built-in tiny model's "
                                  f"vocabulary): set them back or use another train.output_dir") from None
    return read_state(path)


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under `folder` but the manifest itself."""
    out = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST, SIGNATURE)):
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[str(file.relative_to(folder))] = {"size": file.stat().st_size, "sha256": digest.hexdigest()}
    return out


def _point_latest(pointer: Path, name: str) -> None:
    """`latest` := name, unless something flowrl did not write is there (a folder, a symlink): it is left as it
    is, with a warning (the checkpoint is whole without it: resume and export find the newest intact step
    folder; replacing a folder failed the save after the step folder was in place)."""
    if pointer.is_symlink() or (pointer.exists() and not pointer.is_file()):
        kind = "a symlink" if pointer.is_symlink() else "a folder" if pointer.is_dir() else "not a file"
        warnings.warn(f"checkpoint pointer {pointer} is {kind}, not the file flowrl writes: left as it is, not "
                      f"updated (resume finds the newest intact step folder without it)", stacklevel=3)
        return
    _write_atomic(pointer, name)


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
    """Keep the `keep` newest checkpoints (the newest is the one just written and verified by its manifest)."""
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
