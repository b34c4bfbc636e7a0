"""A rollout engine over transformers models with a static KV cache and one compiled decode step.

transformers' `generate` spends most of a decode step outside the model
(logits processors, sampling over the whole vocabulary, stopping checks: about
17 ms a step on an H200 whatever the batch, see PERF_NOTES). Here a step is
one function, model forward on the newest token, temperature, optional top-k
and top-p (flowrl.engines.sampling.truncate, the trainer's own), Gumbel-max
sampling, the sampled token's logprob and the eos bookkeeping,
which torch.compile fuses (one decoder layer's graph for all layers, and
sampling: flowrl.engines.hf.decode_regions) and, on GPUs, `DecodeLoop` captures
with its bookkeeping as one CUDA graph replayed per token
(flowrl.engines.hf.decode_loop).
The KV cache is transformers' StaticCache, kept per (rows, length) so the
graph's buffers stay put across calls; the model may be the train engine's own
module (the hybrid engine): optimizer steps update its parameters in place,
and the graph reads them where they are.

Finished rows cost as much as running ones in a static batch, so every
COMPACT_EVERY tokens the loop reads how many rows still run; once they fit in
half the batch (rounded up to a power of two, at least `compact_min_rows`),
their prompts and the tokens so far are prefilled into a smaller cache and
decoding goes on there (a shape with its own captured graph, but not its own
compile: the step is compiled with dynamic rows and cache length, and the
temperature, greedy and ignore-eos settings are tensors it reads, so greedy
evaluation and sampled rollouts share one compile; see _mark_dynamic and
_Knobs). Responses whose
lengths vary widely (real EOS) then pay for the rows still running, as
continuous batching does, plus one prefill per halving.

Sampling draws Gumbel noise from torch's generator, so seeded calls repeat,
but the draws differ from `generate`'s multinomial: this engine and the `hf`
one sample different (equally distributed) responses for the same seed.
"""

from __future__ import annotations

import inspect
import time
from collections import Counter
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict
from transformers import StaticCache

from flowrl import metrics
from flowrl.engines.hf.attention import use_flowrl_sdpa
from flowrl.engines.hf.decode_loop import DecodeLoop, force_eos
from flowrl.engines.hf.decode_regions import RegionalDecodeStep, WholeDecodeStep, supports_regions
from flowrl.engines.hf.rollout import HFRolloutEngine, seeded
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.responses import responses
from flowrl.engines.sampling import truncate

from flowrl.engines.hf.options import HFStaticRolloutOptions

PROMPT_BUCKET = 32  # prompt widths are rounded up to a multiple of this
MAX_SHAPES = 8  # (rows, length) shapes whose caches and graphs are kept (compaction halves the rows)
COMPACT_EVERY = 16  # decode steps between reads of the rows' done flags (one wait on the device each)
COMPACT_MIN_ROWS = 32  # fewer rows than this decode about as fast as this many: no smaller batch


class StaticCacheRolloutEngine(HFRolloutEngine):
    """Generates all rows of a call in one batch; config.compile=False runs the same step eagerly (CPU, tests)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, config: HFStaticRolloutOptions, *,
                 device: str | torch.device = "cpu", compact_min_rows: int | None = COMPACT_MIN_ROWS):
        """`config`: the options (HFStaticRolloutOptions; flowrl.engines.hf.configs.HFStaticRolloutConfig builds
        this engine); its compile None compiles on CUDA devices only. compact_min_rows: see the module's doc (None: never)."""
        self._load(model, tokenizer, device)
        compile = config.compile if config.compile is not None else self.device.type == "cuda"
        use_flowrl_sdpa(self.model)
        self.compile, self.compact_min_rows = compile, compact_min_rows  # None: never compact
        self._caches: dict[tuple[int, int], StaticCache] = {}
        self._loops: dict[tuple[int, int, SamplingParams], DecodeLoop] = {}
        self._pool: tuple[int, int] | None = None
        # transformers renamed the forward's `past_key_values` to `cache` (5.2x); use the name this one takes
        self._cache_arg = "cache" if "cache" in inspect.signature(type(self.model).forward).parameters \
            else "past_key_values"
        # dynamic: ints (the cache's length) are symbols too; the dims that vary are marked (_mark_dynamic)
        # one compiled decoder layer for all, and sampling; sliding-window models: the whole step (decode_regions)
        step = RegionalDecodeStep if supports_regions(self.model) else WholeDecodeStep
        self._step = step(self.model, _sample, compile=compile)

    def generate(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, params: SamplingParams,
                 *, seed: int | None = None, eos_at_B: torch.Tensor | None = None) -> TensorDict:
        """`eos_at_B` (benchmarks' drawn lengths): row b, if still running, gets eos as its eos_at_B[b]-th
        token."""
        _check_static_params(params)
        was_training = self.model.training
        self.model.eval()
        try:
            # greedy rows draw (and ignore) noise too, in a fork of the RNG: the caller's draws stay as they were
            with seeded(0 if seed is None and params.greedy else seed, self.device), torch.no_grad():
                ids_BP, mask_BP = _pad_to_bucket(prompt_ids_BP.to(self.device), prompt_mask_BP.to(self.device),
                                                 self.pad_id)
                eos_at_B = torch.full((ids_BP.shape[0],), params.max_new_tokens + 1, device=self.device) \
                    if eos_at_B is None else eos_at_B.to(self.device, torch.long)
                ids_BR, logprobs_BR = self._decode(ids_BP, mask_BP, params, eos_at_B)
        finally:
            self.model.train(was_training)
        return responses(ids_BR, logprobs_BR, self.eos_id, self.pad_id, prompt_ids_BP.device)

    def _decode(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, params: SamplingParams,
                eos_at_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, new = ids_BP.shape[0], params.max_new_tokens
        out = _Outputs(torch.full((rows, new), self.pad_id, device=self.device),
                       torch.zeros(rows, new, device=self.device))
        phase = _Phase(ids_BP, mask_BP, torch.arange(rows, device=self.device), rows, 0)
        total = ids_BP.shape[1] + new
        seconds, last = Counter(), time.perf_counter()  # per loop size, between the reads that wait anyway
        loop = self._start(phase, total, params, eos_at_B)
        steps = 1
        while steps < new:
            if self.stop.is_set():  # the streaming engine's abort (flowrl.engines.streaming.thread_streamer): rows end here
                break
            if steps % COMPACT_EVERY == 0:
                live_b = (~loop.done_B[:phase.real]).nonzero().squeeze(-1)  # waits on the device
                now = time.perf_counter()
                seconds[loop.rows], last = seconds[loop.rows] + now - last, now
                if not len(live_b):
                    break
                if self.compact_min_rows is not None and \
                        _bucket(len(live_b), self.compact_min_rows) <= loop.rows // 2:
                    out.take(loop, phase, steps)
                    phase = phase.compacted(loop, live_b, steps, _bucket(len(live_b), self.compact_min_rows))
                    loop = self._start(phase, total, params, eos_at_B[phase.rows_b] - phase.offset,
                                       pending=(loop.token_B[phase.loop_b], loop.logprobs_BR[phase.loop_b,
                                                                                             steps - 1 - phase.previous],
                                                torch.arange(len(phase.rows_b), device=self.device) >= phase.real))
            loop.step()
            steps += 1
        out.take(loop, phase, steps)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds[loop.rows] += time.perf_counter() - last
        for rows, spent in seconds.items():  # where a call's decode time goes (a prefill counts to its loop)
            metrics.log(f"rollout/decode_s/rows_{rows}", spent)
        return out.tokens_BR[:, :steps], out.logprobs_BR[:, :steps]

    def _start(self, phase: "_Phase", total: int, params: SamplingParams, eos_at_B: torch.Tensor,
               pending: tuple[torch.Tensor, ...] | None = None) -> DecodeLoop:
        """Prefills a cache of `total` slots with the phase's ids and loads its loop. The first token is sampled
        from the prefill, or is `pending` (token, logprob, done: the compacted rows' next token)."""
        rows, width = phase.ids_BW.shape
        cache = self._cache(rows, total)
        mask_BL = torch.nn.functional.pad(phase.mask_BW, (0, total - width), value=1)
        positions_BW = (phase.mask_BW.cumsum(-1) - 1).clamp(min=0)
        logits_BV = self.model(input_ids=phase.ids_BW, attention_mask=mask_BL, position_ids=positions_BW,
                               cache_position=torch.arange(width, device=self.device), use_cache=True,
                               logits_to_keep=1, **{self._cache_arg: cache}).logits[:, -1]
        if pending is None:
            done_B = torch.zeros(rows, dtype=torch.bool, device=self.device)
            token_B, logprob_B, done_B = _sample(logits_BV, done_B, _Knobs.of(params, self.device),
                                                 *_truncation(params), self.eos_id, self.pad_id)
            pending = force_eos(0, eos_at_B, token_B, logprob_B, done_B, done_B, self.eos_id)
        loop = self._loop(cache, rows, total, params)
        loop.start(mask_BL, pending[0], pending[1], pending[2], positions_BW[:, -1], width, eos_at_B)
        return loop

    def _loop(self, cache: StaticCache, rows: int, length: int, params: SamplingParams) -> DecodeLoop:
        """One loop (buffers, CUDA graph) per shape and sampling; their graphs share one memory pool."""
        key = (rows, length, params)
        if key not in self._loops:
            if self.compile and self.device.type == "cuda" and self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            self._loops[key] = DecodeLoop(self.model, {self._cache_arg: cache}, self._step, rows=rows, length=length,
                                          new_tokens=params.max_new_tokens,
                                          sample_args=(_Knobs.of(params, self.device), *_truncation(params),
                                                       self.eos_id, self.pad_id), eos_id=self.eos_id,
                                          graph=self.compile,
                                          pool=self._pool)
            if self.compile:
                _mark_dynamic(self._loops[key], cache)
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


class _Outputs:
    """The call's tokens and logprobs, per original row; each phase's loop writes its columns here."""

    def __init__(self, tokens_BR: torch.Tensor, logprobs_BR: torch.Tensor):
        self.tokens_BR, self.logprobs_BR = tokens_BR, logprobs_BR

    def take(self, loop: DecodeLoop, phase: "_Phase", steps: int) -> None:
        """The loop's columns (phase.offset to `steps`) of the phase's real rows."""
        rows_b, width = phase.rows_b[:phase.real], steps - phase.offset
        self.tokens_BR[rows_b, phase.offset:steps] = loop.tokens_BR[:phase.real, :width]
        self.logprobs_BR[rows_b, phase.offset:steps] = loop.logprobs_BR[:phase.real, :width]


class _Phase:
    """What one loop decodes: its rows' ids so far (prompt and fed tokens) and mask, the original row of each
    loop row (`rows_b`; rows past `real` repeat the first, already done), and the call's column of the loop's
    column 0 (`offset`)."""

    def __init__(self, ids_BW: torch.Tensor, mask_BW: torch.Tensor, rows_b: torch.Tensor, real: int, offset: int,
                 loop_b: torch.Tensor | None = None, previous: int = 0):
        self.ids_BW, self.mask_BW, self.rows_b, self.real, self.offset = ids_BW, mask_BW, rows_b, real, offset
        self.loop_b, self.previous = loop_b, previous  # the previous loop's rows, and its offset

    def compacted(self, loop: DecodeLoop, live_b: torch.Tensor, steps: int, rows: int) -> "_Phase":
        """The phase of the `live_b` rows of `loop` after `steps` tokens, padded to `rows` rows: the tokens fed
        so far join the prompt; the pending one (column steps - 1) starts the new loop."""
        loop_b = torch.cat([live_b, live_b[:1].expand(rows - len(live_b))])
        fed = steps - 1 - self.offset
        ids_BW = torch.cat([self.ids_BW[loop_b], loop.tokens_BR[loop_b, :fed]], 1)
        mask_BW = torch.nn.functional.pad(self.mask_BW[loop_b], (0, fed), value=1)
        return _Phase(ids_BW, mask_BW, self.rows_b[loop_b], len(live_b), steps - 1, loop_b, self.offset)


def _mark_dynamic(loop: DecodeLoop, cache: StaticCache) -> None:
    """Rows and cache length are dynamic in the compiled step from its first compile, so every shape of a
    sampling setting runs one graph. torch.compile's default compiled the first shape static, then again with
    dynamic rows (the first compaction) and again with a dynamic length (the first other prompt bucket): 3
    compiles, each 45 s for a 0.5B model on a cold H200. Marked dims are never duck-sized, as dynamic=True's
    others are: unmarked, rows equal to the head size (64 for Qwen2.5-0.5B) would share its symbol and be
    specialized with it."""
    for buffer in (loop.token_B, loop.position_B, loop.done_B, loop.mask_BL):
        torch._dynamo.maybe_mark_dynamic(buffer, 0)
    torch._dynamo.maybe_mark_dynamic(loop.mask_BL, 1)
    for layer in cache.layers:  # [rows, kv heads, length, head size], allocated by the prefill
        for kv in (layer.keys, layer.values):
            torch._dynamo.maybe_mark_dynamic(kv, 0)
            torch._dynamo.maybe_mark_dynamic(kv, 2)


def _bucket(rows: int, least: int) -> int:
    """The power of two at or above `rows`, at least `least`."""
    return max(least, 1 << (rows - 1).bit_length())


class _Knobs(NamedTuple):
    """A sampling setting as 0-d tensors the compiled step reads (values, not guards): greedy is temperature 1
    with the noise scaled by 0, so greedy and sampled calls run one compiled graph. Top-k and top-p stay Python
    numbers (they change the graph); greedy calls pass none."""

    temperature: torch.Tensor
    noise: torch.Tensor
    ignore_eos: torch.Tensor

    @classmethod
    def of(cls, params: SamplingParams, device: torch.device) -> "_Knobs":
        def scalar(value, dtype=torch.float32):
            return torch.tensor(value, dtype=dtype, device=device)
        return cls(scalar(1.0 if params.greedy else float(params.temperature)),
                   scalar(0.0 if params.greedy else 1.0), scalar(params.ignore_eos, torch.bool))


def _truncation(params: SamplingParams) -> tuple[int, float]:
    return (0, 1.0) if params.greedy else (params.top_k, params.top_p)


def _sample(logits_BV: torch.Tensor, done_B: torch.Tensor, knobs: _Knobs, top_k: int, top_p: float, eos_id: int,
            pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token, its logprob under the sampling distribution, rows done after it); finished rows emit pad.
    Gumbel-max: argmax of the logprobs plus noise, the noise times 0 for greedy (so its argmax)."""
    logits_BV = logits_BV.float()
    logits_BV[:, eos_id] = torch.where(knobs.ignore_eos, float("-inf"), logits_BV[:, eos_id])
    logprobs_BV = torch.log_softmax(truncate(logits_BV / knobs.temperature, top_k, top_p), -1)
    gumbel_BV = -torch.log(-torch.log(torch.rand_like(logprobs_BV).clamp_(min=1e-20)))
    token_B = (logprobs_BV + gumbel_BV * knobs.noise).argmax(-1)
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
