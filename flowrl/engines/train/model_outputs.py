"""The train engine's output table: what it can compute per response token, by name.

A loss (engines.protocols.LossFn.needs) or a role (`actor.logprobs(batch, outputs=...)`) names the outputs
it needs, and the engine computes exactly those. An actor's outputs are functions of one token's
distribution, registered in TOKEN_OUTPUTS: each gets the fp32 logits of the distribution the token was
sampled from (temperature and truncation applied, flowrl.engines.sampling), their log-softmax and the
tokens, [N, V], [N, V] and [N], and returns [N]. The engine evaluates them chunk by chunk from the hidden
states, or from full logits (flowrl.engines.train.logprobs), so an entry never sees more than one chunk.

Adding an estimator that needs a new per-token statistic is one entry here plus the code that reads it:

    @TOKEN_OUTPUTS.register("top1_prob")
    def top1_prob(logits_NV, logprobs_NV, tokens_N):
        return logprobs_NV.max(-1).values.exp()

Two actor outputs are [N, K], named with their parameter (on-policy distillation's top-k, after verl's
distillation inputs): `topk_outputs(k)`, "topk_logprobs:K" and "topk_ids:K", the K largest logprobs of each
token's distribution and their token ids; `logprobs_at(column)`, "logprobs_at:COLUMN", the logprobs at the
ids that batch column COLUMN ([B, R, K], e.g. a teacher's top-k ids) holds for each token. Both are
computed chunk by chunk as the others, so only one chunk's vocabulary-wide logprobs ever exist.

A critic's head gives "values" and a reward model's "scores": one output each (HEAD_OUTPUTS).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from flowrl.graph.registry import Registry

TokenOutput = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
TOKEN_OUTPUTS: Registry[TokenOutput] = Registry("model output")


@TOKEN_OUTPUTS.register("logprobs")
def logprobs(logits_NV: torch.Tensor, logprobs_NV: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    """log pi(token)."""
    return logprobs_NV.gather(-1, tokens_N.unsqueeze(-1)).squeeze(-1)


@TOKEN_OUTPUTS.register("entropy")
def entropy(logits_NV: torch.Tensor, logprobs_NV: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    """-sum_v pi(v) log pi(v), as logsumexp - E_pi[logit]: no 0 * -inf where a probability underflows."""
    return torch.logsumexp(logits_NV, -1) - (logprobs_NV.exp() * logits_NV).sum(-1)


@TOKEN_OUTPUTS.register("sum_pi_squared")
def sum_pi_squared(logits_NV: torch.Tensor, logprobs_NV: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    """sum_v pi(v)^2 as exp(logsumexp(2 log pi)), verl's exp(lse(2 z) - 2 lse(z)): the optimal token
    baseline's weights (flowrl.rl.ops.advantages.optimal_token_baseline)."""
    return torch.logsumexp(2 * logprobs_NV, -1).exp()


TOPK_LOGPROBS, TOPK_IDS, LOGPROBS_AT = "topk_logprobs", "topk_ids", "logprobs_at"  # [N, K] outputs


def topk_outputs(k: int) -> tuple[str, str]:
    """The names of the top-k logprobs of each token's distribution ([B, R, k], descending) and their ids."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"topk: a count of tokens >= 1, got {k!r}")
    return f"{TOPK_LOGPROBS}:{k}", f"{TOPK_IDS}:{k}"


def logprobs_at(column: str) -> str:
    """The name of each token's logprobs at the ids batch column `column` holds for it ([B, R, K])."""
    return f"{LOGPROBS_AT}:{column}"


def gathered_columns(names: Iterable[str]) -> tuple[str, ...]:
    """The batch columns of the logprobs_at outputs among `names` (ids the engine reads from the batch)."""
    return tuple(name.partition(":")[2] for name in names if name.partition(":")[0] == LOGPROBS_AT)


HEAD_OUTPUTS = {"critic": "values", "reward": "scores"}
"""The one output of each scalar head; an actor's are TOKEN_OUTPUTS."""


def default_outputs(kind: str) -> tuple[str, ...]:
    """What a forward computes when nobody names outputs: an actor's logprobs, a head's one output."""
    return (HEAD_OUTPUTS[kind],) if kind in HEAD_OUTPUTS else ("logprobs",)


def check_outputs(kind: str, names: Iterable[str]) -> tuple[str, ...]:
    """`names` as a tuple, in order, without repeats; ValueError naming one this kind of engine cannot give."""
    names = tuple(dict.fromkeys(names))
    if not names:
        raise ValueError(f"outputs: name at least one model output; an {kind} gives {_offered(kind)}")
    for name in names:
        offered = name == HEAD_OUTPUTS[kind] if kind in HEAD_OUTPUTS else name in TOKEN_OUTPUTS or _wide(name)
        if not offered:
            raise ValueError(f"outputs: an {kind} engine cannot compute {name!r}; it gives {_offered(kind)}")
    return names


def token_outputs(logits_NV: torch.Tensor, tokens_N: torch.Tensor, names: tuple[str, ...],
                  ids: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """{name: [N]} for each named TOKEN_OUTPUTS entry, [N, K] for a top-k or logprobs_at one, from logits
    (temperature and truncation applied; any leading shape for N). `ids`: the ids of each logprobs_at column,
    [N, K]."""
    logits_NV = logits_NV.float()
    logprobs_NV = torch.log_softmax(logits_NV, dim=-1)
    out, top = {}, {}
    for name in names:
        base, _, arg = name.partition(":")
        if base in (TOPK_LOGPROBS, TOPK_IDS):
            if arg not in top:  # one torch.topk gives both
                top[arg] = torch.topk(logprobs_NV, min(int(arg), logprobs_NV.shape[-1]), dim=-1)
            out[name] = top[arg].values if base == TOPK_LOGPROBS else top[arg].indices
        elif base == LOGPROBS_AT:
            out[name] = logprobs_NV.gather(-1, ids[arg])
        else:
            out[name] = TOKEN_OUTPUTS.get(name)(logits_NV, logprobs_NV, tokens_N)
    return out


def _wide(name: str) -> bool:
    """A well-formed [N, K] output name: topk_logprobs:K / topk_ids:K (K >= 1) or logprobs_at:COLUMN."""
    base, colon, arg = name.partition(":")
    if base in (TOPK_LOGPROBS, TOPK_IDS):
        return bool(colon) and arg.isdigit() and int(arg) >= 1
    return base == LOGPROBS_AT and bool(arg)


def _offered(kind: str) -> str:
    if kind in HEAD_OUTPUTS:
        return repr(HEAD_OUTPUTS[kind])
    return ", ".join([*map(repr, TOKEN_OUTPUTS.names()), "'topk_logprobs:K'", "'topk_ids:K'", "'logprobs_at:COLUMN'"])


def response_width(value_BR: torch.Tensor, mask_BR: torch.Tensor, width: int) -> torch.Tensor:
    """An output ([B, R] or [B, R, K]) with 0 on padding, cut or padded to `width` response columns."""
    mask = mask_BR.view(*mask_BR.shape, *(1,) * (value_BR.dim() - 2))
    pad = (0, 0) * (value_BR.dim() - 2) + (0, width - value_BR.shape[1])
    return torch.nn.functional.pad(torch.where(mask, value_BR, 0), pad)
