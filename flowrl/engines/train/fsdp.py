"""FSDP2 helpers for the train engine: shard a transformers model (optionally offloaded to the CPU), gather its
weights one tensor at a time, and move optimizer state between devices.

`full_tensors` is what a streamed weight sync reads: each state-dict entry
unsharded on the engine's device (`DTensor.full_tensor()`, an all-gather
under FSDP2, so every rank must iterate), one at a time, never a whole
state dict on the CPU.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor


def full_tensors(model: torch.nn.Module, device: torch.device | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, unsharded tensor) for each state-dict entry, in state-dict order, on the parameters' device (or
    on `device`, where shards offloaded to the CPU are gathered: the mesh's collectives run there).

    Tied weights (a tied `lm_head.weight`) appear under each of their names, as in the checkpoint: an
    inference engine may keep them apart (vLLM processes its lm_head separately). Collective when sharded.
    """
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            value = (value if device is None else value.to(device)).full_tensor()
        yield name, value.detach()


def shard_device(device: torch.device) -> torch.device:
    """FSDP2 places shards on the current device of the mesh's type; `device` must agree."""
    if device.type == "cpu":
        return device
    current = torch.device(device.type, torch.get_device_module(device.type).current_device())
    if device.index is not None and device != current:
        raise ValueError(f"device {device} is not this rank's current {device.type} device ({current}); "
                         f"call torch.{device.type}.set_device first")
    return current


def shard_model(model: torch.nn.Module, device_type: str, world_size: int, offload: bool = False) -> None:
    """`fully_shard` each decoder layer, then the root, over a 1-D mesh of all ranks.

    offload: FSDP2's CPUOffloadPolicy: the sharded parameters, their gradients and so the optimizer state
    live on the CPU (the optimizer step runs there); each layer's parameters are copied to the device and
    gathered only while it computes.
    """
    try:
        layers = model.get_decoder().layers  # a peft model forwards get_decoder to the model it wraps
    except AttributeError as error:
        raise ValueError(f"FSDP2 sharding needs the decoder layers at model.get_decoder().layers, which "
                         f"{type(model).__name__} lacks") from error
    mesh = init_device_mesh(device_type, (world_size,))
    policy = CPUOffloadPolicy(pin_memory=device_type == "cuda") if offload else None
    kwargs = {} if policy is None else {"offload_policy": policy}
    for layer in layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)


@torch.no_grad()
def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Every tensor of the optimizer's state to `device` (verl's optimizer offload: AdamW's moments wait on the
    CPU between steps, and come back for the step), except `step`: a fused or capturable AdamW keeps it on its
    parameter's device (its kernel reads it there: moved to the CPU with the moments, the next fused step failed on
    the H100, "state_steps is on cpu, different from other tensors on cuda:0"), a plain one on the CPU."""
    for group in optimizer.param_groups:
        step_on_param = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                target = (param.device if step_on_param else torch.device("cpu")) if key == "step" else device
                state[key] = value.to(target, non_blocking=True)
