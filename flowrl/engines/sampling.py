"""The distribution each response token was sampled from, carried by its row.

A sampled row records how it was sampled (`SAMPLED_WITH`: temperature, top-k,
top-p), written by the rollout from the parameters of the very call that
produced it, per-call overrides included; the train engine scores the row's
tokens under that same distribution, so the trainer's and the sampler's
logprobs of a token agree (verl and prime-rl carry per-row sampling too).

The distribution is the one every flowrl sampler draws from: logits divided
by the temperature, then top-k, then top-p (transformers' warpers, which the
`hf` engine applies; `hf_static` calls `truncate` below; vLLM keeps the same
tokens), renormalised over the kept tokens. Without this the trainer's
logprobs are those of the untruncated distribution, and every token's
importance ratio is off by the kept mass (trl#6789, vllm#42259).

Filtered logits are set to the most negative finite float, not -inf: their
probability is exactly 0, and entropies and gradients stay finite. The
trainer also keeps each row's own sampled token, so a token at a top-k/top-p
boundary that rounding puts outside the trainer's kept set (bf16 on GPUs)
gets a finite logprob; in exact arithmetic the sampled token is always kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from flowrl.engines.protocols import SamplingParams

SAMPLED_WITH = ("sample_temperature", "sample_top_k", "sample_top_p")  # per-row columns, [B] each
FILTERED = torch.finfo(torch.float32).min

Truncation = tuple[tuple[int, float, torch.Tensor], ...]  # (top_k, top_p, which rows or tokens) per setting


def check_sampling_params(params: SamplingParams) -> None:
    """A rollout engine's check of the parameters of a call: one line naming the bad field."""
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if not params.greedy and not params.temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {params.top_k}")


def sampling_columns(params: SamplingParams, rows: int) -> dict[str, torch.Tensor]:
    """The SAMPLED_WITH columns of `rows` rows sampled with `params`; a greedy row's logprobs are those of
    the plain softmax (temperature 1, nothing truncated), as the samplers record them."""
    greedy = params.greedy
    return {"sample_temperature": torch.full((rows,), 1.0 if greedy else float(params.temperature)),
            "sample_top_k": torch.full((rows,), 0 if greedy else int(params.top_k), dtype=torch.long),
            "sample_top_p": torch.full((rows,), 1.0 if greedy else float(params.top_p))}


def truncate(logits_NV: torch.Tensor, top_k: int, top_p: float, keep_N: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (temperature applied) with the tokens top-k and then top-p drop set to FILTERED, by
    transformers' warpers; `keep_N` (token ids) are kept whatever their rank."""
    out = logits_NV
    if top_k:
        out = TopKLogitsWarper(top_k=top_k, filter_value=FILTERED)(None, out)
    if top_p < 1.0:
        out = TopPLogitsWarper(top_p=top_p, filter_value=FILTERED)(None, out)
    if keep_N is not None and out is not logits_NV:
        out = out.scatter(-1, keep_N[:, None], logits_NV.gather(-1, keep_N[:, None]))
    return out


def apply_sampling(logits_NV: torch.Tensor, temperature_N: torch.Tensor | float, truncation: Truncation,
                   tokens_N: torch.Tensor) -> torch.Tensor:
    """Each token's logits under its row's sampling: divided by its temperature, truncated per setting
    (`truncation` masks are over the N tokens), the token itself kept."""
    if isinstance(temperature_N, torch.Tensor):
        temperature_N = temperature_N[:, None]
    out = logits_NV.float() / temperature_N
    for top_k, top_p, rows_N in truncation:
        out = torch.where(rows_N[:, None], truncate(out, top_k, top_p, tokens_N), out)
    return out


@dataclass(frozen=True)
class RowSampling:
    """Each row's sampling, read from its SAMPLED_WITH columns (rows without them: `default_temperature`,
    nothing truncated)."""

    temperature_B: torch.Tensor
    truncation: Truncation  # masks over rows

    @classmethod
    def of(cls, batch: TensorDict, default_temperature: float = 1.0) -> "RowSampling":
        rows = batch.batch_size[0]
        if "sample_temperature" not in batch.keys():
            return cls(torch.full((rows,), float(default_temperature)), ())
        top_k_B, top_p_B = batch["sample_top_k"].cpu(), batch["sample_top_p"].cpu()
        settings = sorted({(int(k), float(p)) for k, p in zip(top_k_B.tolist(), top_p_B.tolist())
                           if k > 0 or p < 1.0})
        truncation = tuple((k, p, (top_k_B == k) & (top_p_B == p)) for k, p in settings)
        return cls(batch["sample_temperature"].float(), truncation)

    def to(self, device: torch.device) -> "RowSampling":
        return RowSampling(self.temperature_B.to(device), tuple((k, p, rows.to(device))
                                                                for k, p, rows in self.truncation))

    def per_token(self, num_response: int) -> tuple[torch.Tensor, Truncation]:
        """(temperature [B * R], truncation masks over the B * R tokens), row-major like a reshape(-1)."""
        def spread(value_B: torch.Tensor) -> torch.Tensor:
            return value_B[:, None].expand(-1, num_response).reshape(-1)

        return spread(self.temperature_B), tuple((k, p, spread(rows)) for k, p, rows in self.truncation)
