"""Log-probabilities of given tokens from a causal LM's hidden states, without the full fp32 logits.

Full logits for a micro-batch of B x R tokens over a 152k vocabulary take
B * R * 152k * 4 bytes in fp32 (19.5 GiB forward-only for 64 x 384 tokens on
an H200, 62 GiB with backward; PERF_NOTES). Here the lm_head and log-softmax
run on chunks of `chunk_tokens` tokens; with gradients each chunk is
recomputed in backward (torch.utils.checkpoint), so only one chunk's logits
ever exist. Results equal the full computation (to float rounding). Besides
the logprobs, any per-token output of flowrl.engines.train.model_outputs (entropy,
..., and the [N, K] top-k and logprobs_at outputs), each computed from the same
chunk of logits.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from flowrl.engines.train.model_outputs import token_outputs
from flowrl.engines.sampling import Truncation, apply_sampling


def token_logprobs(hidden_BRH: torch.Tensor, weight_VH: torch.Tensor, tokens_BR: torch.Tensor,
                   temperature: torch.Tensor | float, outputs: tuple[str, ...], chunk_tokens: int,
                   compiled: bool = False, truncation: Truncation = (),
                   ids: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """{name: [B, R]} for each of `outputs` (flowrl.engines.train.model_outputs.TOKEN_OUTPUTS: "logprobs",
    "entropy", ...; [B, R, K] for the top-k and logprobs_at ones) of `tokens` under
    softmax(hidden @ weight.T / temperature), truncated as `truncation` says (flowrl.engines.sampling);
    `temperature` and the truncation masks may be per token ([B * R], row-major). `ids`: each logprobs_at
    column's ids, [B, R, K]. compiled: each chunk runs torch.compile'd (the fp32 upcast, log-softmax and
    gather fused)."""
    shape = tokens_BR.shape
    # tokens: a copy, so every chunk is a view of the same kind of base (a trimmed batch's reshape copies, an
    # untrimmed one's views: the compiled chunk's guards on the base would tell them apart and recompile)
    hidden_NH, tokens_N = hidden_BRH.reshape(-1, hidden_BRH.shape[-1]), tokens_BR.flatten().clone()
    ids_NK = {column: value.reshape(tokens_N.numel(), -1) for column, value in (ids or {}).items()}
    chunks, chunk_fn = [], _compiled_chunk() if compiled else _chunk
    for start in range(0, tokens_N.numel(), chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (hidden_NH[part], weight_VH, tokens_N[part],
                temperature[part] if isinstance(temperature, torch.Tensor) else temperature, outputs,
                tuple((k, p, rows[part]) for k, p, rows in truncation),
                tuple((column, value[part]) for column, value in ids_NK.items()))
        chunks.append(checkpoint(chunk_fn, *args, use_reentrant=False) if torch.is_grad_enabled() else chunk_fn(*args))
    joined = (torch.cat([c[index] for c in chunks]) for index in range(len(outputs)))
    return {name: value.reshape(*shape, *value.shape[1:]) for name, value in zip(outputs, joined)}


def full_logits_logprobs(logits_BRV: torch.Tensor, tokens_BR: torch.Tensor, outputs: tuple[str, ...],
                         ids: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The same from already computed logits (temperature and truncation applied)."""
    return token_outputs(logits_BRV, tokens_BR, outputs, ids)


def _chunk(hidden_NH: torch.Tensor, weight_VH: torch.Tensor, tokens_N: torch.Tensor, temperature: torch.Tensor | float,
           outputs: tuple[str, ...], truncation: Truncation = (),
           ids: tuple[tuple[str, torch.Tensor], ...] = ()) -> tuple[torch.Tensor, ...]:
    logits_NV = apply_sampling(hidden_NH @ weight_VH.T, temperature, truncation, tokens_N)
    return tuple(token_outputs(logits_NV, tokens_N, outputs, dict(ids)).values())


@functools.cache
def _compiled_chunk():
    compiled = torch.compile(_chunk, dynamic=True)

    def run(*args):
        """Without duck sizing: a chunk is a view, and a size of its base equal to one of its own at the first
        call (3 rows of hidden states, chunks of 3 tokens) would be guarded equal and recompiled for later."""
        with torch.fx.experimental._config.patch(use_duck_shape=False):
            return compiled(*args)
    return run
