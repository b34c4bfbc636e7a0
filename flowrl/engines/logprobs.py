"""Log-probabilities of given tokens from a causal LM's hidden states, without the full fp32 logits.

Full logits for a micro-batch of B x R tokens over a 152k vocabulary take
B * R * 152k * 4 bytes in fp32 (19.5 GiB forward-only for 64 x 384 tokens on
an H200, 62 GiB with backward; PERF_NOTES). Here the lm_head and log-softmax
run on chunks of `chunk_tokens` tokens; with gradients each chunk is
recomputed in backward (torch.utils.checkpoint), so only one chunk's logits
ever exist. Results equal the full computation (to float rounding). Besides
the logprobs: each token's entropy, and sum_v pi(v)^2, the sum of the squared
probabilities of the whole distribution (what the optimal token baseline,
flowrl.rl.ops.advantages.optimal_token_baseline, weighs its steps with).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from flowrl.engines.sampling import Truncation, apply_sampling


def token_logprobs(hidden_BRH: torch.Tensor, weight_VH: torch.Tensor, tokens_BR: torch.Tensor,
                   temperature: torch.Tensor | float, with_entropy: bool, chunk_tokens: int, compiled: bool = False,
                   with_sum_pi_squared: bool = False, truncation: Truncation = ()) -> dict[str, torch.Tensor]:
    """{"logprobs": [B, R]} (and "entropy", "sum_pi_squared" [B, R]) of `tokens` under
    softmax(hidden @ weight.T / temperature), truncated as `truncation` says (flowrl.engines.sampling);
    `temperature` and the truncation masks may be per token ([B * R], row-major).
    compiled: each chunk runs torch.compile'd (the fp32 upcast, log-softmax and gather fused)."""
    shape = tokens_BR.shape
    hidden_NH, tokens_N = hidden_BRH.reshape(-1, hidden_BRH.shape[-1]), tokens_BR.reshape(-1)
    chunks, chunk_fn = [], _compiled_chunk() if compiled else _chunk
    for start in range(0, tokens_N.numel(), chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (hidden_NH[part], weight_VH, tokens_N[part],
                temperature[part] if isinstance(temperature, torch.Tensor) else temperature, with_entropy,
                with_sum_pi_squared, tuple((k, p, rows[part]) for k, p, rows in truncation))
        chunks.append(checkpoint(chunk_fn, *args, use_reentrant=False) if torch.is_grad_enabled() else chunk_fn(*args))
    out = {"logprobs": torch.cat([c[0] for c in chunks]).reshape(shape)}
    for index, (key, wanted) in enumerate((("entropy", with_entropy), ("sum_pi_squared", with_sum_pi_squared)), 1):
        if wanted:
            out[key] = torch.cat([c[index] for c in chunks]).reshape(shape)
    return out


def full_logits_logprobs(logits_BRV: torch.Tensor, tokens_BR: torch.Tensor, with_entropy: bool,
                         with_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
    """The same from already computed logits (temperature and truncation applied)."""
    logprobs_BRV = torch.log_softmax(logits_BRV.float(), dim=-1)
    out = {"logprobs": logprobs_BRV.gather(-1, tokens_BR.unsqueeze(-1)).squeeze(-1)}
    if with_entropy:  # logsumexp - E_p[logit]: no 0 * -inf where a probability underflows
        out["entropy"] = torch.logsumexp(logits_BRV.float(), -1) - (logprobs_BRV.exp() * logits_BRV.float()).sum(-1)
    if with_sum_pi_squared:  # sum_v exp(2 log p_v), as verl's exp(lse(2 z) - 2 lse(z))
        out["sum_pi_squared"] = torch.logsumexp(2 * logprobs_BRV, -1).exp()
    return out


def _chunk(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, tokens_N: torch.Tensor, temperature: torch.Tensor | float,
           with_entropy: bool, with_sum_pi_squared: bool = False,
           truncation: Truncation = ()) -> tuple[torch.Tensor | None, ...]:
    logits_NV = apply_sampling(hidden_NH @ weight_VH.T, temperature, truncation, tokens_N)
    out = full_logits_logprobs(logits_NV, tokens_N, with_entropy, with_sum_pi_squared)
    return out["logprobs"], out.get("entropy"), out.get("sum_pi_squared")


@functools.cache
def _compiled_chunk():
    return torch.compile(_chunk, dynamic=True)
