"""The train engine's output table: what it can compute per response token, by name.

A loss (engines.protocols.LossFn.needs) or a role (`actor.logprobs(batch, outputs=...)`) names the outputs
it needs, and the engine computes exactly those. An actor's outputs are functions of one token's
distribution, registered in TOKEN_OUTPUTS: each gets the fp32 logits of the distribution the token was
sampled from (temperature and truncation applied, flowrl.engines.sampling), their log-softmax and the
tokens, [N, V], [N, V] and [N], and returns [N]. The engine evaluates them chunk by chunk from the hidden
states, or from full logits (flowrl.engines.logprobs), so an entry never sees more than one chunk.

Adding an estimator that needs a new per-token statistic is one entry here plus the code that reads it:

    @TOKEN_OUTPUTS.register("top1_prob")
    def top1_prob(logits_NV, logprobs_NV, tokens_N):
        return logprobs_NV.max(-1).values.exp()

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
        offered = name == HEAD_OUTPUTS[kind] if kind in HEAD_OUTPUTS else name in TOKEN_OUTPUTS
        if not offered:
            raise ValueError(f"outputs: an {kind} engine cannot compute {name!r}; it gives {_offered(kind)}")
    return names


def token_outputs(logits_NV: torch.Tensor, tokens_N: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """{name: [N]} for each named TOKEN_OUTPUTS entry, from logits (temperature and truncation applied)."""
    logits_NV = logits_NV.float()
    logprobs_NV = torch.log_softmax(logits_NV, dim=-1)
    return {name: TOKEN_OUTPUTS.get(name)(logits_NV, logprobs_NV, tokens_N) for name in names}


def _offered(kind: str) -> str:
    return repr(HEAD_OUTPUTS[kind]) if kind in HEAD_OUTPUTS else ", ".join(map(repr, TOKEN_OUTPUTS.names()))
