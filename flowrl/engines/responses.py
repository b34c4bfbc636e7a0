"""What every rollout engine returns (the RolloutEngine protocol's rows), built the same way by the transformers
engines (flowrl.engines.hf) and the vLLM engine (flowrl.engines.vllm): responses right-padded to the longest,
padded and masked after the first eos, the sampler's logprobs zeroed on padding, and each row's finish reason."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from flowrl.engines.protocols import FinishReason


def right_pad_cat(chunks: list[torch.Tensor], pad_id: int | float) -> torch.Tensor:
    """Row chunks [b, r] of different widths as one [B, R]: each right-padded with `pad_id` to the widest."""
    width = max(chunk.shape[1] for chunk in chunks)
    padded = [torch.nn.functional.pad(chunk, (0, width - chunk.shape[1]), value=pad_id) for chunk in chunks]
    return torch.cat(padded, dim=0)


def responses(ids_BR: torch.Tensor, logprobs_BR: torch.Tensor, eos_id: int, pad_id: int,
              device: torch.device) -> TensorDict:
    """The RolloutEngine output from sampled ids and their logprobs: pad after the first eos, the mask, the
    logprobs zeroed on padding, and each row's finish reason; on `device`."""
    ids_BR, mask_BR = mask_after_eos(ids_BR, eos_id, pad_id)
    stopped_B = ((ids_BR == eos_id) & mask_BR.bool()).any(-1)
    finish_B = torch.where(stopped_B, int(FinishReason.STOP), int(FinishReason.LENGTH))
    return TensorDict(response_ids=ids_BR.to(device), response_mask=mask_BR.to(device),
                      rollout_logprobs=(logprobs_BR * mask_BR).to(device), finish_reason=finish_B.to(device),
                      batch_size=[ids_BR.shape[0]])


def mask_after_eos(response_ids_BR: torch.Tensor, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids with pad_id after the first eos, mask 1 through the first eos and 0 after)."""
    is_eos_BR = response_ids_BR == eos_id
    after_eos_BR = (is_eos_BR.long().cumsum(-1) - is_eos_BR.long()) > 0
    return response_ids_BR.masked_fill(after_eos_BR, pad_id), (~after_eos_BR).long()
