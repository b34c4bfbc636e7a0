"""Token-budget micro-batches: rows grouped by how many tokens a pass over them computes, not by row count.

A row micro-batch pays for its longest row in every row; with long-tailed response lengths most of a pass is
padding, or a few long rows make one micro-batch far heavier than the rest. Here a micro-batch holds at most
`max_tokens` tokens, counted as the pass computes them:

- packed (flowrl.engines.train.packing): the sum of its rows' real tokens. Rows are split into the fewest micro-batches
  whose sums fit, balanced by the Karmarkar-Karp largest differencing method (verl's seqlen_balancing);
- padded: rows x its longest row. Rows sorted longest first fill micro-batches in turn (first fit on sorted
  rows), so each holds rows of similar length.

A row longer than the budget gets a micro-batch of its own. Every FSDP rank must run as many micro-batches:
`num_micro_batches` splits the rows into the largest count any rank needs (balanced again, or by halving). How
the rows are split leaves a step's gradient unchanged: the engine weights each micro-batch's loss against the
whole mini-batch (flowrl.engines.protocols.LossFn).
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

import torch
from tensordict import TensorDict


def karmarkar_karp(lengths: Sequence[int], num_parts: int, *, equal_size: bool = False) -> list[list[int]]:
    """Indices of `lengths` in `num_parts` parts of near-equal sums (largest differencing, k-way).

    Each item starts as a partial solution: its own part plus num_parts - 1 empty ones. The two solutions with
    the largest spread (max - min sum) merge, the heaviest part of one joining the lightest of the other, until
    one is left. Parts come heaviest first; a part is empty only when there are fewer items than parts.
    `equal_size`: every part gets len(lengths) / num_parts items (verl's get_seqlen_balanced_partitions with
    equal_size=True): the items, longest first, start num_parts at a time as one solution of one item per
    part, and merging joins parts one to one, so the counts stay equal.

        karmarkar_karp([8, 7, 6, 5, 4], 2) -> [[1, 3, 4], [0, 2]]: sums 16 and 14 (a heuristic: the best
        split is 15 and 15; 8 - 7 and 6 - 5 leave 4, 1, 1, and 4 - 1 - 1 = 2 is the spread)
        karmarkar_karp([8, 7, 6, 5, 4, 3], 2, equal_size=True) -> [[1, 2, 4], [0, 3, 5]]: 3 items each, sums 17
        and 16 (starts 8 | 7, 6 | 5, 4 | 3, spread 1 each; 8+5 | 7+6 spreads 0, then 7+6+4 | 8+5+3)
    """
    assert num_parts >= 1, num_parts
    if equal_size and len(lengths) % num_parts:
        raise ValueError(f"equal_size: {len(lengths)} items do not split into {num_parts} parts of equal size")
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for tie, start in enumerate(_starts(lengths, num_parts, equal_size)):
        parts = sorted(((lengths[i], [i]) for i in start), key=lambda part: -part[0])
        parts += [(0, []) for _ in range(num_parts - len(parts))]
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), tie, parts))
    if not heap:
        return [[] for _ in range(num_parts)]
    while len(heap) > 1:
        _, tie, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        # heaviest of one with lightest of the other: both lists are kept heaviest first
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second))]
        merged.sort(key=lambda part: -part[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
    return [sorted(indices) for _, indices in heap[0][2]]


def _starts(lengths: Sequence[int], num_parts: int, equal_size: bool) -> list[list[int]]:
    """The items of each starting solution: one each, or (equal_size) num_parts each, longest first."""
    if not equal_size:
        return [[index] for index in range(len(lengths))]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep their order
    return [order[at:at + num_parts] for at in range(0, len(order), num_parts)]


def token_micro_batches(lengths: Sequence[int], max_tokens: int, *, packed: bool,
                        num_micro_batches: int | None = None) -> list[list[int]]:
    """Row indices of each micro-batch: the fewest micro-batches within `max_tokens` each (a row over it alone),
    or exactly `num_micro_batches` (fewer only when there are fewer rows), at least as many as the fewest.
    Cost: the sum of lengths (`packed`), else rows x the longest row."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not lengths:
        return []
    wanted = min(len(lengths), num_micro_batches or 1)
    groups = _packed(lengths, max_tokens, wanted) if packed else _padded(lengths, max_tokens, wanted)
    assert num_micro_batches is None or len(groups) == wanted, "ask for no fewer micro-batches than the fewest"
    return groups


def _packed(lengths: Sequence[int], max_tokens: int, wanted: int) -> list[list[int]]:
    if wanted > 1:  # a count every rank agreed on: balanced, as many as that
        return [part for part in karmarkar_karp(lengths, wanted) if part]
    num_parts = min(len(lengths), math.ceil(sum(lengths) / max_tokens))
    while True:
        parts = karmarkar_karp(lengths, num_parts)
        over = any(len(part) > 1 and sum(lengths[i] for i in part) > max_tokens for part in parts)
        if not over or num_parts == len(lengths):
            return [part for part in parts if part]
        num_parts += 1


def _padded(lengths: Sequence[int], max_tokens: int, wanted: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep their order
    groups: list[list[int]] = []
    for index in order:  # the group's first row is its longest
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(index)
        else:
            groups.append([index])
    while len(groups) < wanted:  # halve the group of most rows
        largest = max(range(len(groups)), key=lambda g: len(groups[g]))
        group = groups[largest]
        half = (len(group) + 1) // 2
        groups[largest:largest + 1] = [group[:half], group[half:]]
    return groups


def row_lengths(batch: TensorDict) -> list[int]:
    """Each row's real tokens, prompt and response, read on the host."""
    return (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).cpu().tolist()


def budget_micro_batches(batch: TensorDict, max_tokens: int, *, packed: bool,
                         agree: Callable[[int], int] = lambda count: count) -> list[torch.Tensor]:
    """Row indices (CPU) of each token-budget micro-batch of `batch`; `agree` turns this rank's count into the
    count every rank runs (the largest, under FSDP), and the rows are split again into that many."""
    lengths = row_lengths(batch)
    groups = token_micro_batches(lengths, max_tokens, packed=packed)
    count = agree(len(groups))
    if count != len(groups):
        groups = token_micro_batches(lengths, max_tokens, packed=packed, num_micro_batches=count)
    assert len(groups) == count, f"{len(groups)} micro-batches where every rank runs {count}"
    return [torch.tensor(group, dtype=torch.long) for group in groups]


__all__ = ["budget_micro_batches", "karmarkar_karp", "row_lengths", "token_micro_batches"]
