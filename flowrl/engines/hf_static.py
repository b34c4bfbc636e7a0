"""A rollout engine over transformers models with a static KV cache and one compiled decode step.

transformers' `generate` spends most of a decode step outside the model
(logits processors, sampling over the whole vocabulary, stopping checks: about
17 ms a step on an H200 whatever the batch, see PERF_NOTES). Here a step is
one function, model forward on the newest token, temperature, optional top-k
and top-p (flowrl.engines.sampling.truncate, the trainer's own), Gumbel-max
sampling, the sampled token's logprob and the eos bookkeeping,
which torch.compile fuses and, on GPUs, `DecodeLoop` captures with its
bookkeeping as one CUDA graph replayed per token (flowrl.engines.decode_loop).
The KV cache is transformers' StaticCache, kept per (rows, length) so the
graph's buffers stay put across calls; the model may be the train engine's own
module (the hybrid engine): optimizer steps update its parameters in place,
and the graph reads them where they are.

Sampling draws Gumbel noise from torch's generator, so seeded calls repeat,
but the draws differ from `generate`'s multinomial: this engine and the `hf`
one sample different (equally distributed) responses for the same seed.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from tensordict import TensorDict
from transformers import StaticCache

from flowrl.engines.attention import use_flowrl_sdpa
from flowrl.engines.decode_loop import DecodeLoop
from flowrl.engines.hf_rollout import HFRolloutEngine, _seeded, responses
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.sampling import truncate

PROMPT_BUCKET = 32  # prompt widths are rounded up to a multiple of this
MAX_SHAPES = 4  # (rows, length) shapes whose caches and graphs are kept


class StaticCacheRolloutEngine(HFRolloutEngine):
    """Generates all rows of a call in one batch; `compile=False` runs the same step eagerly (CPU, tests)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, *, device: str | torch.device = "cpu",
                 compile: bool = True):
        super().__init__(model, tokenizer, device=device)
        use_flowrl_sdpa(self.model)
        self.compile = compile
        self._caches: dict[tuple[int, int], StaticCache] = {}
        self._loops: dict[tuple[int, int, SamplingParams], DecodeLoop] = {}
        self._pool: tuple[int, int] | None = None
        # transformers renamed the forward's `past_key_values` to `cache` (5.2x); use the name this one takes
        self._cache_arg = "cache" if "cache" in inspect.signature(type(self.model).forward).parameters \
            else "past_key_values"
        self._step = torch.compile(_decode_step) if compile else _decode_step

    def generate(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, params: SamplingParams,
                 *, seed: int | None = None) -> TensorDict:
        _check_static_params(params)
        was_training = self.model.training
        self.model.eval()
        try:
            with _seeded(seed, self.device), torch.no_grad():
                ids_BR, logprobs_BR = self._decode(*_pad_to_bucket(prompt_ids_BP.to(self.device),
                                                                   prompt_mask_BP.to(self.device), self.pad_id),
                                                   params)
        finally:
            self.model.train(was_training)
        return responses(ids_BR, logprobs_BR, self.eos_id, self.pad_id, prompt_ids_BP.device)

    def _decode(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor,
                params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        rows, prompt_len = ids_BP.shape
        total = prompt_len + params.max_new_tokens
        cache = self._cache(rows, total)
        mask_BL = torch.nn.functional.pad(mask_BP, (0, params.max_new_tokens), value=1)
        positions_BP = (mask_BP.cumsum(-1) - 1).clamp(min=0)
        logits_BV = self.model(input_ids=ids_BP, attention_mask=mask_BL, position_ids=positions_BP,
                               cache_position=torch.arange(prompt_len, device=self.device), use_cache=True,
                               logits_to_keep=1, **{self._cache_arg: cache}).logits[:, -1]
        done_B = torch.zeros(rows, dtype=torch.bool, device=self.device)
        token_B, logprob_B, done_B = _sample(logits_BV, done_B, params, self.eos_id, self.pad_id)
        loop = self._loop(cache, rows, total, params)
        loop.start(mask_BL, token_B, logprob_B, done_B, positions_BP[:, -1], prompt_len)
        steps = 1
        while steps < params.max_new_tokens:
            if steps % 16 == 0 and bool(loop.done_B.all()):
                break
            loop.step()
            steps += 1
        return loop.outputs(steps)

    def _loop(self, cache: StaticCache, rows: int, length: int, params: SamplingParams) -> DecodeLoop:
        """One loop (buffers, CUDA graph) per shape and sampling; their graphs share one memory pool."""
        key = (rows, length, params)
        if key not in self._loops:
            if self.compile and self.device.type == "cuda" and self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            self._loops[key] = DecodeLoop(self.model, {self._cache_arg: cache}, self._step, rows=rows, length=length,
                                          new_tokens=params.max_new_tokens,
                                          sample_args=(params, self.eos_id, self.pad_id), graph=self.compile,
                                          pool=self._pool)
        return self._loops[key]

    def _cache(self, rows: int, length: int) -> StaticCache:
        """One cache per shape, reset for each call, so a captured step's buffers keep their addresses."""
        cache = self._caches.pop((rows, length), None)
        if cache is None:
            if len(self._caches) >= MAX_SHAPES:  # forget the least recently used shape, its cache and graphs
                oldest = next(iter(self._caches))
                del self._caches[oldest]
                self._loops = {key: loop for key, loop in self._loops.items() if key[:2] != oldest}
            cache = StaticCache(config=self.model.config, max_cache_len=length)
        else:
            cache.reset()
        self._caches[rows, length] = cache  # most recently used last
        return cache


def _decode_step(model: torch.nn.Module, cache: dict[str, StaticCache], token_B: torch.Tensor,
                 position_B: torch.Tensor, cache_position: torch.Tensor, mask_BL: torch.Tensor, done_B: torch.Tensor,
                 params: SamplingParams, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits_BV = model(input_ids=token_B[:, None], attention_mask=mask_BL, position_ids=position_B[:, None],
                      cache_position=cache_position, use_cache=True, **cache).logits[:, -1]
    return _sample(logits_BV, done_B, params, eos_id, pad_id)


def _sample(logits_BV: torch.Tensor, done_B: torch.Tensor, params: SamplingParams, eos_id: int,
            pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, its logprob under the sampling distribution, rows done after it); finished rows emit pad."""
    logits_BV = logits_BV.float()
    if params.ignore_eos:
        logits_BV[:, eos_id] = float("-inf")
    if params.greedy:
        logprobs_BV = torch.log_softmax(logits_BV, -1)
        token_B = logprobs_BV.argmax(-1)
    else:
        logits_BV = truncate(logits_BV / params.temperature, params.top_k, params.top_p)
        logprobs_BV = torch.log_softmax(logits_BV, -1)
        gumbel_BV = -torch.log(-torch.log(torch.rand_like(logprobs_BV).clamp_(min=1e-20)))
        token_B = (logprobs_BV + gumbel_BV).argmax(-1)
    logprob_B = logprobs_BV.gather(-1, token_B[:, None]).squeeze(-1)
    token_B = torch.where(done_B, pad_id, token_B)
    return token_B, logprob_B, done_B | (token_B == eos_id)


def _pad_to_bucket(ids_BP: torch.Tensor, mask_BP: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pads prompts to a multiple of PROMPT_BUCKET tokens, so batches of nearby prompt lengths share one
    cache and one captured step (the padding is masked out; positions count real tokens only)."""
    extra = -ids_BP.shape[1] % PROMPT_BUCKET
    if not extra:
        return ids_BP, mask_BP
    return (torch.nn.functional.pad(ids_BP, (extra, 0), value=pad_id),
            torch.nn.functional.pad(mask_BP, (extra, 0), value=0))


def _check_static_params(params: SamplingParams) -> None:
    if not params.greedy and not params.temperature > 0:
        raise ValueError(f"temperature must be > 0 when sampling, got {params.temperature}")
