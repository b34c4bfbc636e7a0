"""FSDP2 helpers for the train engine: shard a transformers model, and gather its weights one tensor at a time.

`full_tensors` is what a streamed weight sync reads: each state-dict entry
unsharded on the engine's device (`DTensor.full_tensor()`, an all-gather
under FSDP2, so every rank must iterate), one at a time, never a whole
state dict on the CPU.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, unsharded tensor) for each state-dict entry, in state-dict order, on the parameters' device.

    Tied weights (a tied `lm_head.weight`) appear under each of their names, as in the checkpoint: an
    inference engine may keep them apart (vLLM processes its lm_head separately). Collective when sharded.
    """
    for name, value in model.state_dict().items():
        full = value.full_tensor() if isinstance(value, DTensor) else value
        yield name, full.detach()


def shard_device(device: torch.device) -> torch.device:
    """FSDP2 places shards on the current device of the mesh's type; `device` must agree."""
    if device.type == "cpu":
        return device
    current = torch.device(device.type, torch.get_device_module(device.type).current_device())
    if device.index is not None and device != current:
        raise ValueError(f"device {device} is not this rank's current {device.type} device ({current}); "
                         f"call torch.{device.type}.set_device first")
    return current


def shard_model(model: torch.nn.Module, device_type: str, world_size: int) -> None:
    """`fully_shard` each decoder layer, then the root, over a 1-D mesh of all ranks."""
    try:
        layers = model.model.layers
    except AttributeError as error:
        raise ValueError(f"FSDP2 sharding needs the decoder layers at model.model.layers, which "
                         f"{type(model).__name__} lacks") from error
    mesh = init_device_mesh(device_type, (world_size,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
