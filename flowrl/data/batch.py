"""Batch helpers over tensordict.TensorDict (batch size [B]).

Field conventions are in flowrl/engines/protocols.py. Per-row task metadata
(e.g. the arithmetic answer) rides along as a NonTensorStack, so indexing,
repeating and concatenation keep it aligned with the tensors.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from tensordict import NonTensorStack, TensorDict

MODEL_INPUT = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
TOKEN_IDS = ("prompt_ids", "response_ids")  # padded with the tokenizer's pad_id, the other fields with 0


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids_BP, mask_BP)."""
    if not seqs:
        raise ValueError("left_pad needs at least one sequence")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        if len(seq):
            ids[row, width - len(seq):] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def right_pad(seqs: Sequence[Sequence[int | float]], pad_id: int | float,
              dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad lists into (values_BT, mask_BT), at least one column wide: row r's values, then pad_id; the
    mask is 1 on the values. Responses pad with the tokenizer's pad_id, logprobs with 0.0 (dtype float)."""
    if not seqs:
        raise ValueError("right_pad needs at least one sequence")
    width = max(1, max(len(s) for s in seqs))
    values = torch.full((len(seqs), width), pad_id, dtype=dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        values[row, :len(seq)] = torch.tensor(list(seq), dtype=dtype)
        mask[row, :len(seq)] = 1
    return values, mask


def prompt_batch(prompt_ids: Sequence[Sequence[int]], pad_id: int, uids: Sequence[int],
                 meta: dict[str, list[Any]] | None = None) -> TensorDict:
    """A prompt batch: left-padded ids, a unique int64 `uid` per prompt, and metadata columns."""
    ids, mask = left_pad(prompt_ids, pad_id)
    batch = TensorDict({"prompt_ids": ids, "prompt_mask": mask,
                        "uid": torch.tensor(list(uids), dtype=torch.long)}, batch_size=[len(prompt_ids)])
    for key, column in (meta or {}).items():
        if len(column) != len(prompt_ids):
            raise ValueError(f"metadata column {key!r} has {len(column)} rows, expected {len(prompt_ids)}")
        batch[key] = NonTensorStack(*column)
    return batch


def repeat_rows(batch: TensorDict, n: int) -> TensorDict:
    """Each row n times in a row (samples of one prompt stay adjacent)."""
    index = torch.arange(batch.batch_size[0]).repeat_interleave(n)
    return batch[index]


def column(batch: TensorDict, key: str) -> list[Any]:
    """A metadata column as a plain list."""
    value = batch.get(key)
    return list(value.tolist())


def concat(batches: Sequence[TensorDict], pad_id: int = 0) -> TensorDict:
    """Row-concatenate batches with the same fields, padding time dims to the widest (token ids with pad_id)."""
    batches = [b for b in batches if b.batch_size[0] > 0] or list(batches[:1])
    if len(batches) == 1:
        return batches[0]
    return torch.cat([_pad_time(b, _widths(batches), pad_id) for b in batches], dim=0)


def _widths(batches: Sequence[TensorDict]) -> dict[str, int]:
    widths: dict[str, int] = {}
    for b in batches:
        for key, value in b.items():
            if isinstance(value, torch.Tensor) and value.ndim == 2:
                widths[key] = max(widths.get(key, 0), value.shape[1])
    return widths


def _pad_time(batch: TensorDict, widths: dict[str, int], pad_id: int = 0) -> TensorDict:
    """Pad 2-D fields on the side that keeps alignment (prompts left, responses right): token ids with pad_id,
    the rest with 0.

    Padded positions are masked out, so any valid token id would do there; pad_id keeps rows as generated.
    """
    out = batch.clone(False)
    for key, width in widths.items():
        value = batch.get(key)
        missing = width - value.shape[1]
        if missing:
            pad = (missing, 0) if key.startswith("prompt") else (0, missing)
            fill = pad_id if key in TOKEN_IDS else 0
            out.set(key, torch.nn.functional.pad(value, pad, value=fill), inplace=False)
    return out


def response_lengths(batch: TensorDict) -> torch.Tensor:
    return batch["response_mask"].sum(-1)


def num_groups(batch: TensorDict) -> int:
    if batch.batch_size[0] == 0:
        return 0
    return int(torch.unique(batch["group"]).numel())


def keep_rows(batch: TensorDict, keep_B: torch.Tensor) -> TensorDict:
    return batch[keep_B.nonzero(as_tuple=True)[0]]


def first_groups(batch: TensorDict, k: int) -> TensorDict:
    """Rows of the first k distinct groups, in order of first appearance."""
    groups = batch["group"]
    seen: list[int] = []
    for g in groups.tolist():
        if g not in seen:
            seen.append(g)
    wanted = torch.tensor(seen[:k], dtype=groups.dtype)
    return keep_rows(batch, torch.isin(groups, wanted))
