"""What the ranks of a sharded train engine agree on before FSDP2's collectives, each a no-op on one rank
(`sharded` False): the largest of a value (how many micro-batches a token budget makes: every rank must run as
many), a sum (a mini-batch's total loss weight over ranks) and equal row counts (FSDP2 runs collectives per
micro-batch, so ranks with unequal rows would hang; they fail instead)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_max(value: int, device: torch.device | str, sharded: bool) -> int:
    if not sharded:
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def all_reduce_sum(value: float, device: torch.device | str, sharded: bool) -> float:
    if not sharded:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.item()


def check_same_rows(num_rows: int, device: torch.device | str, sharded: bool) -> None:
    if not sharded:
        return
    extremes = torch.tensor([num_rows, -num_rows], device=device)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    if extremes[0].item() != -extremes[1].item():
        raise ValueError(f"batch rows differ across ranks (max {extremes[0].item()}, "
                         f"min {-extremes[1].item()}); every rank must pass equally many rows")
