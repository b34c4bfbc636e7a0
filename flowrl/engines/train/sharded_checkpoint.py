"""Sharded train-engine checkpoints with torch.distributed.checkpoint (DCP): every rank writes its own shards.

An engine's folder holds DCP's files, `.metadata` and one `__<rank>_0.distcp` per rank, for the state
{"model", "optimizer", "scheduler"}. Model and optimizer entries are keyed by parameter name
(torch.distributed.checkpoint.state_dict.get_state_dict, as torchtitan does), and each tensor's shards
record where they sit in the whole, so a checkpoint written by N ranks loads at any world size: each rank
reads its slice from whichever files hold it (reshard on load), and nothing is gathered to one rank.
With `trainable_only` (LoRA) only the trained parameters are saved: the frozen base weights are the model
folder's.

Atomic: the ranks write into a temporary folder next to the target, which rank 0 renames into place
once every rank has finished (DCP's save ends with a collective; a barrier follows), so the folder
appears whole or not at all. Several nodes must see one file system (the run's output_dir).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import os
import pathlib
import shutil
import warnings
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from flowrl.engines.models.folders import replace_dir

METADATA = ".metadata"

_EXPECTED: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("expected_digests", default=None)


class ModelMismatch(ValueError):
    """A checkpoint that lacks a parameter of the model it is loaded into, or holds it in another shape."""


class ChangedFile(ValueError):
    """A checkpoint file whose bytes, as read for loading, are not those its signed manifest lists."""


@contextlib.contextmanager
def expecting(digests: dict[str, str]) -> Iterator[None]:
    """Loads inside read every file once into memory, check those bytes against `digests` (absolute path ->
    sha256, from a manifest whose signature was checked) and load those same bytes: DCP's `.metadata` is a
    pickle, so a file swapped after the check is refused, never unpickled."""
    token = _EXPECTED.set(digests)
    try:
        yield
    finally:
        _EXPECTED.reset(token)


class _VerifiedFileSystem(FileSystem):
    def __init__(self, digests: dict[str, str]):
        super().__init__()
        self.digests = digests

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        yield io.BytesIO(read_checked(path, self.digests))


def expected() -> dict[str, str] | None:
    """The digests loads are checked against here and now (inside expecting()); None outside."""
    return _EXPECTED.get()


def read_checked(path: str | os.PathLike, digests: dict[str, str]) -> bytes:
    """The file's bytes, read once (never through a symlink) and returned only if they hash to its digest."""
    name = os.path.abspath(path)
    if name not in digests:  # as absent (DCP tries an optional per-rank metadata file first)
        raise FileNotFoundError(f"{name} is not listed in the checkpoint's signed manifest")
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != digests[name]:
        raise ChangedFile(f"{name} changed after its signature was checked; refused (not loaded)")
    return data


def _reader(folder: pathlib.Path) -> dcp.FileSystemReader | None:
    digests = _EXPECTED.get()
    if digests is None:
        return None
    reader = dcp.FileSystemReader(str(folder))
    reader.fs = _VerifiedFileSystem(digests)
    return reader


def save(path: str | pathlib.Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
         scheduler: Any = None, *, trainable_only: bool = False) -> None:
    """Every rank writes its shards of the model, optimizer and scheduler state to folder `path` (collective)."""
    target = pathlib.Path(path)
    tmp = target.with_name(f".{target.name}.tmp-dcp")
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()  # no rank writes before the folder is fresh
    with _one_process_quiet():
        dcp.save(_state(model, optimizer, scheduler, trainable_only), checkpoint_id=tmp, no_dist=not _distributed())
    _barrier()  # every rank's files are written
    if _rank() == 0:
        replace_dir(tmp, target)
    _barrier()


def load(path: str | pathlib.Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
         scheduler: Any = None, *, trainable_only: bool = False) -> None:
    """Restores what save() wrote, at this world size (collective); without `optimizer`, the model only."""
    folder = pathlib.Path(path)
    if not (folder / METADATA).is_file():
        raise ValueError(f"path {str(folder)!r} holds no sharded engine checkpoint (no {METADATA})")
    state = _state(model, optimizer, scheduler, trainable_only)
    reader = _reader(folder)
    metadata = (reader or dcp.FileSystemReader(str(folder))).read_metadata()  # a changed .metadata: ChangedFile
    check_shapes(folder, state["model"], metadata.state_dict_metadata)
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=folder, storage_reader=reader, no_dist=not _distributed())
    options = StateDictOptions(strict=not trainable_only)
    if optimizer is None:
        set_model_state_dict(model, state["model"], options=options)
    else:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=options)
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])


def check_shapes(folder: pathlib.Path, model_state: dict[str, Any], saved: dict[str, Any]) -> None:
    """One line naming the first parameter the checkpoint lacks or holds in another shape (a checkpoint of
    another model), instead of DCP's `CheckpointException ranks:dict_keys([0])`."""
    for name, value in model_state.items():
        entry = saved.get(f"model.{name}")
        if entry is None:
            raise ModelMismatch(f"parameter {name!r} is not in {folder}")
        shape = tuple(getattr(entry, "size", ()))
        if isinstance(value, torch.Tensor) and shape != tuple(value.shape):
            raise ModelMismatch(f"parameter {name!r} has shape {list(shape)} in {folder} but {list(value.shape)} "
                                f"in the model it is loaded into")


def read_model(path: str | pathlib.Path) -> dict[str, torch.Tensor]:
    """The model tensors of a checkpoint, whole, in this one process (no process group needed): for export
    and inspection."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with _one_process_quiet():
        return _load_state_dict_from_keys({"model"}, checkpoint_id=str(path))["model"]


def saved_keys(path: str | pathlib.Path) -> list[str]:
    """The names of the entries a checkpoint holds ("model.<parameter>", "optimizer.state.<parameter>.exp_avg",
    ...), read from its metadata alone."""
    return sorted(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any,
           trainable_only: bool) -> dict[str, Any]:
    if optimizer is None:
        model_state, optimizer_state = get_model_state_dict(model), None
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer)
    if trainable_only:
        trained = {_fqn(name) for name, param in model.named_parameters() if param.requires_grad}
        model_state = {name: value for name, value in model_state.items() if _fqn(name) in trained}
    state: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        state["optimizer"] = optimizer_state
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def _fqn(name: str) -> str:
    """A parameter's name without the wrappers' parts (activation checkpointing, torch.compile), as in the
    state dict."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


@contextlib.contextmanager
def _one_process_quiet() -> Iterator[None]:
    """Without a process group DCP reads and writes in this one process, as meant; its warning says so."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*uninitialized")
        yield


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()
