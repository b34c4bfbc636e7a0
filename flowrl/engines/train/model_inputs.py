"""The token layouts the train engine feeds a model: rows of left-padded prompts and right-padded responses,
trimmed to the columns some row uses, then either masked (padding masked out, positions counting real tokens)
or packed (each row's real tokens moved to its front, so causal attention needs no mask at all)."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def _joined(mb: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of prompt and response side by side."""
    return (torch.cat([mb["prompt_ids"], mb["response_ids"]], dim=1),
            torch.cat([mb["prompt_mask"].long(), mb["response_mask"].long()], dim=1))


def masked_inputs(mb: TensorDict) -> dict[str, torch.Tensor]:
    """Prompt and response side by side, padding masked out, positions counting real tokens."""
    ids_BL, mask_BL = _joined(mb)
    return dict(input_ids=ids_BL, attention_mask=mask_BL, position_ids=(mask_BL.cumsum(-1) - 1).clamp(min=0),
                use_cache=False)


def packed_inputs(mb: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids with each row's real tokens moved to its front, in order, padding after them; the column each
    original column's token lands in). A causal model then needs no padding mask, so SDPA runs its flash
    kernel (flowrl.engines.hf.attention), and each real token keeps the position it had: the real tokens
    before it. Outputs at padding columns are arbitrary (callers mask them)."""
    ids_BL, mask_BL = _joined(mb)
    order_BL = torch.argsort(1 - mask_BL, dim=1, stable=True)  # real tokens first, in their order
    return ids_BL.gather(1, order_BL), (mask_BL.cumsum(-1) - 1).clamp(min=0)


def used_columns(mb: TensorDict) -> tuple[int, int]:
    """(first prompt column, end of the response columns) that some row uses, keeping one of each."""
    prompt_used = mb["prompt_mask"].bool().any(0)
    response_used = mb["response_mask"].bool().any(0)
    start = min(int(prompt_used.long().argmax()) if prompt_used.any() else 0, prompt_used.numel() - 1)
    return start, max(int(response_used.nonzero().max()) + 1 if response_used.any() else 1, 1)


COLUMN_MULTIPLE = 8
"""On CUDA a trimmed micro-batch's width (prompt and response columns) is a multiple of this. CUDA's attention
kernels want their inputs' strides aligned to 8 elements, and inductor guards a compiled layer on that
alignment (`(width % 8) == 0`), so aligned and unaligned widths each compiled the layers again: a 3.6 s
recompile inside a timed GRPO step on the H200 (variable response lengths, 2026-12-04). On the CPU no kernel
asks for it, and widths stay exact (so do the CPU runs' figures: summation order follows the width)."""


def column_multiple(device: torch.device) -> int:
    """What a trimmed width is a multiple of on `device` (COLUMN_MULTIPLE on CUDA, else 1)."""
    return COLUMN_MULTIPLE if device.type == "cuda" else 1


def trim_padding(mb: TensorDict, span: tuple[int, int], multiple: int = 1,
                 response_columns: tuple[str, ...] = ()) -> TensorDict:
    """Drop leading prompt columns and trailing response columns outside `span` (used_columns): a
    micro-batch of short rows then costs what its rows need, not the whole batch's width. Padding response
    columns (masked, id 0) make the width a multiple of `multiple`. `response_columns`: other columns aligned
    to the response ([B, R, ...], e.g. per-token ids), trimmed and padded (with 0) the same way."""
    start, end = span
    extra = -(mb["prompt_ids"].shape[1] - start + end) % multiple
    responses = {key: _pad_columns(mb[key][:, :end], extra)
                 for key in ("response_ids", "response_mask", *response_columns)}
    return TensorDict(prompt_ids=mb["prompt_ids"][:, start:], prompt_mask=mb["prompt_mask"][:, start:],
                      **responses, batch_size=mb.batch_size, device=mb.device)


def _pad_columns(value_BR: torch.Tensor, extra: int) -> torch.Tensor:
    """`extra` columns of 0 after the last one (dimension 1, whatever follows it)."""
    return torch.nn.functional.pad(value_BR, (0, 0) * (value_BR.dim() - 2) + (0, extra))
