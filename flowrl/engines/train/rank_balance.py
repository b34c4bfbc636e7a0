"""Rows moved between the ranks of a train pool so that each holds near-equal tokens (train.balance_batch).

Each rank of a pool is given as many rows as the others (flowrl.plan.placement.Pool.share counts them), not as
many tokens: with long-tailed response lengths one rank can hold most of them, and the FSDP2 ranks wait for it
at every micro-batch and optimizer step. Before a train engine's pass the ranks exchange rows, as verl's
`trainer.balance_batch` does before its dispatch (`get_seqlen_balanced_partitions(equal_size=True)`):

- an update: each global mini-batch (mini-batch j of every rank together, `group_rows` rows of each) is split
  again into one part per rank, of `group_rows` rows and near-equal tokens (flowrl.engines.train.token_batching's
  Karmarkar-Karp with equal sizes). Every optimizer step sees the rows it saw before, only which rank holds
  which changes, and the engine's step is exact over ranks (each micro-batch's loss weighted against the
  mini-batch's total over ranks), so the weights are the same up to float summation order (an update with a
  shuffle seed draws its mini-batches from the rows a rank then holds: another random draw);
- a no-grad pass: the whole batch is one group, and the outputs go back to the rows' own ranks, in their order.

Rows are exchanged at the engine call, where each row stands alone (advantages, group statistics and every
other field that travels with a row are already in it), and the batch a role method returns keeps the rows
this rank was given. The exchange gathers every rank's rows to every rank (an object gather over the pool's
process group, as dynamic sampling's does), simple rather than the least traffic.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict

from flowrl import metrics
from flowrl.data.batch import concat
from flowrl.engines.train.token_batching import karmarkar_karp, row_lengths

Share = list[tuple[int, int]]  # (rank, row) of each row a rank takes, in order


def balanced_shares(lengths_RN: list[list[int]], group_rows: int) -> list[Share]:
    """Each rank's rows (their (rank, row) before) after balancing: group by group (rows [j * group_rows,
    (j + 1) * group_rows) of every rank), as many rows of the group as each rank had, tokens near-equal; each
    part of a group goes to the rank that holds most of its rows."""
    num_ranks, num_rows = len(lengths_RN), len(lengths_RN[0])
    assert all(len(lengths) == num_rows for lengths in lengths_RN), "every rank holds as many rows"
    assert group_rows >= 1, group_rows
    shares: list[Share] = [[] for _ in range(num_ranks)]
    for start in range(0, num_rows, group_rows):
        rows = [(rank, row) for rank in range(num_ranks) for row in range(start, min(start + group_rows, num_rows))]
        parts = karmarkar_karp([lengths_RN[rank][row] for rank, row in rows], num_ranks, equal_size=True)
        for rank, part in zip(_holders(parts, rows, num_ranks), parts):
            shares[rank] += [rows[i] for i in part]
    return shares


def _holders(parts: list[list[int]], rows: Share, num_ranks: int) -> list[int]:
    """The rank each part goes to: in turn, the free rank that holds most of its rows already (fewest move)."""
    free, holders = list(range(num_ranks)), []
    for part in parts:
        held = Counter(rows[i][0] for i in part)
        holders.append(max(free, key=lambda rank: (held[rank], -rank)))
        free.remove(holders[-1])
    return holders


def max_over_mean(totals: list[int]) -> float:
    """The heaviest rank's tokens over the mean: 1.0 when balanced exactly."""
    mean = sum(totals) / len(totals)
    return max(totals) / mean if mean else 1.0


@dataclass(frozen=True)
class Balanced:
    """This rank's rows after the exchange (`rows`) and where every rank's rows came from."""

    rows: TensorDict
    shares: list[Share]
    rank: int
    width: int  # the response columns of the rows this rank was given (`rows` may have more: another rank's)

    def restore(self, outputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Outputs of `rows` (first dimension the rows) back at the rows this rank was given, in their order
        (collective: every rank calls it)."""
        device = next(iter(outputs.values())).device
        every = _gather({key: value.cpu() for key, value in outputs.items()})
        home = {row: (holder, at) for holder, share in enumerate(self.shares)
                for at, (rank, row) in enumerate(share) if rank == self.rank}
        places = [home[row] for row in range(len(home))]
        return {key: torch.stack([every[holder][key][at, :self.width] for holder, at in places]).to(device)
                for key in outputs}


def exchange(batch: TensorDict, group_rows: int) -> Balanced | None:
    """Rows balanced over the ranks of the process group (collective), group by group of `group_rows` rows of
    each rank; None without a group of two or more ranks. Logs the heaviest rank's tokens over the mean, after
    (train/balance_tokens_max_over_mean) and before (..._before); rows move only where that evens the tokens."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    lengths_RN = _gather(row_lengths(batch))
    if len({len(lengths) for lengths in lengths_RN}) > 1:
        raise ValueError(f"train.balance_batch: the ranks hold {[len(lengths) for lengths in lengths_RN]} rows; "
                         f"every rank must hold equally many")
    if not lengths_RN[0]:
        return None
    shares = balanced_shares(lengths_RN, group_rows)
    before = max_over_mean([sum(lengths) for lengths in lengths_RN])
    after = max_over_mean([sum(lengths_RN[rank][row] for rank, row in share) for share in shares])
    metrics.log("train/balance_tokens_max_over_mean_before", before)
    metrics.log("train/balance_tokens_max_over_mean", min(after, before))
    if after >= before:  # no better: the rows stay (every rank decides alike, from the same lengths)
        return None
    device, rank = batch["prompt_ids"].device, dist.get_rank()
    every = concat(_gather(batch.cpu()))  # rank r's rows at r * num_rows on, padded to the widest rank's columns
    num_rows = len(lengths_RN[0])
    rows = every[torch.tensor([r * num_rows + row for r, row in shares[rank]], dtype=torch.long)]
    return Balanced(rows.to(device), shares, rank, batch["response_ids"].shape[1])


def _gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


__all__ = ["Balanced", "balanced_shares", "exchange", "max_over_mean"]
