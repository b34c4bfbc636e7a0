"""HFRolloutEngine: the RolloutEngine protocol over transformers' `model.generate`.

Slow but exact and dependency-free: the rollout model is a plain nn.Module, so
with one process it can be the very module the train engine updates (see
flowrl.engines.weights.in_process.SharedModuleSync). Sampling follows SamplingParams only: every
sampling field is set explicitly, because generate() fills unset fields from
the checkpoint's generation_config.json (e.g. repetition_penalty=1.05, top_k=20
in Qwen2.5-Instruct), which would make rollout and training logprobs disagree.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterable, Iterator

import torch
from tensordict import TensorDict
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from flowrl.engines.protocols import SamplingParams, TrainEngine, WeightSync
from flowrl.engines.responses import responses, right_pad_cat
from flowrl.engines.sampling import check_sampling_params
from flowrl.engines.weights.buckets import SYNC_TIMEOUT_S
from flowrl.engines.weights.in_process import choose_weight_sync

from flowrl.engines.hf.options import HFRolloutOptions


class HFRolloutEngine:
    """Generates one response per left-padded prompt row, `micro_batch_size` rows per generate() call."""

    def __init__(self, model: torch.nn.Module, tokenizer, config: HFRolloutOptions, *,
                 device: str | torch.device = "cpu"):
        """`config`: the options (HFRolloutOptions; flowrl.engines.hf.configs.HFRolloutConfig builds this engine)."""
        self._load(model, tokenizer, device)
        self.micro_batch_size = config.micro_batch_size

    def _load(self, model: torch.nn.Module, tokenizer, device: str | torch.device) -> None:
        """The model on `device` and the tokenizer's eos and pad ids (this engine's and its subclasses')."""
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("tokenizer must define both eos_token and pad_token")
        self.device = torch.device(device)
        self.tp_ranks = 1  # each rank its own replica
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.pad_id: int = tokenizer.pad_token_id
        # set: a running generate() returns after its current step, each row cut where it is (finish LENGTH, fewer
        # than max_new_tokens tokens); the streaming engine's abort (flowrl.engines.streaming.thread_streamer)
        self.stop = threading.Event()

    def generate(self, prompt_ids_BP: torch.Tensor, prompt_mask_BP: torch.Tensor, params: SamplingParams,
                 *, seed: int | None = None) -> TensorDict:
        """Responses right-padded with pad_id; the mask is 1 through the first eos, 0 after; the sampler's
        logprob of each token (0 on padding) and each row's finish reason."""
        config = self._generation_config(params)
        was_training = self.model.training
        self.model.eval()
        try:
            with seeded(seed, self.device), torch.inference_mode():
                chunks = [self._generate_chunk(ids, mask, config, params) for ids, mask in
                          zip(prompt_ids_BP.split(self.micro_batch_size), prompt_mask_BP.split(self.micro_batch_size))]
        finally:
            self.model.train(was_training)
        # clone outside inference mode: inference tensors cannot be saved for a later backward
        response_ids_BR = right_pad_cat([ids.clone() for ids, _ in chunks], self.pad_id)
        logprobs_BR = right_pad_cat([logprobs.clone() for _, logprobs in chunks], 0.0)
        return responses(response_ids_BR, logprobs_BR, self.eos_id, self.pad_id, prompt_ids_BP.device)

    def weight_sync(self, train: TrainEngine, timeout_s: float = SYNC_TIMEOUT_S) -> WeightSync:
        """Nothing to move when this engine generates with `train`'s own module, else a streamed copy."""
        return choose_weight_sync(getattr(train, "model", None), self.model, timeout_s)

    def close(self) -> None:
        """Nothing beyond tensors to release."""

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copies a full (unsharded) state dict into the rollout model; strict."""
        self.load_weight_stream(state_dict.items())

    @torch.no_grad()
    def load_weight_stream(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies (name, tensor) pairs into the rollout model's own tensors as they come, so no state dict is
        ever held; strict: every entry of the model's state dict must arrive, and no other. The count."""
        own = self.model.state_dict(keep_vars=True)  # the model's tensors themselves, not copies
        seen: set[str] = set()
        for name, tensor in named_tensors:
            if name not in own:
                raise ValueError(f"weight sync sent {name!r}, which the rollout model does not have")
            own[name].copy_(tensor)
            seen.add(name)
        missing = sorted(own.keys() - seen)
        if missing:
            raise ValueError(f"weight sync left {len(missing)} rollout entries unset, e.g. {missing[0]!r}")
        return len(seen)

    def _generate_chunk(self, ids_BP: torch.Tensor, mask_BP: torch.Tensor, config: GenerationConfig,
                        params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """(response ids, the sampler's logprob of each)."""
        recorder = _SampledLogprobs(params)
        out = self.model.generate(input_ids=ids_BP.to(self.device), attention_mask=mask_BP.to(self.device),
                                  generation_config=config, logits_processor=LogitsProcessorList([recorder]),
                                  stopping_criteria=StoppingCriteriaList([_StopOnEvent(self.stop)]))
        response_BR = out[:, ids_BP.shape[1]:]
        return response_BR, recorder.finish(response_BR)

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        check_sampling_params(params)
        # greedy decoding ignores the sampling flags; None keeps transformers from warning about them
        sampling = dict(temperature=None, top_p=None, top_k=None, min_p=None, typical_p=None) if params.greedy \
            else dict(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, min_p=0.0, typical_p=1.0)
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens, do_sample=not params.greedy, **sampling,
            repetition_penalty=1.0, no_repeat_ngram_size=0,
            min_new_tokens=params.max_new_tokens if params.ignore_eos else 0,
            num_beams=1, num_return_sequences=1, eos_token_id=self.eos_id, pad_token_id=self.pad_id)


class _StopOnEvent(StoppingCriteria):
    """Stops every row once `event` is set (checked after each step)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


class _SampledLogprobs(LogitsProcessor):
    """Records the logprob of each sampled token under the distribution it was sampled from.

    generate() runs user processors before its own temperature / top-k / top-p warpers, so this sees the
    raw scores and applies the same warpers (transformers' own classes) to a copy. The token sampled from
    step t's scores is only known at step t + 1 (the last column of input_ids), so one step's
    log-probabilities are kept until then.
    """

    def __init__(self, params: SamplingParams):
        warpers = [] if params.greedy else [TemperatureLogitsWarper(params.temperature)]
        if not params.greedy and params.top_k:
            warpers.append(TopKLogitsWarper(top_k=params.top_k))
        if not params.greedy and params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=params.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.pending: torch.Tensor | None = None  # [B, V] logprobs of the step whose token is not yet seen
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.pending is not None:
            self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(self.warpers(input_ids, scores.float()), dim=-1)
        return scores

    def finish(self, response_BR: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._take(response_BR[:, len(self.logprobs)])
        width = response_BR.shape[1]
        assert len(self.logprobs) == width, (len(self.logprobs), width)
        return torch.stack(self.logprobs, dim=1) if width else response_BR.float()

    def _take(self, token_B: torch.Tensor) -> None:
        self.logprobs.append(self.pending.gather(-1, token_B.unsqueeze(-1)).squeeze(-1))
        self.pending = None


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seeds torch's RNG for the block and restores the caller's RNG state after."""
    if seed is None:
        yield
        return
    devices = []
    if device.type == "cuda":
        devices = [torch.cuda.current_device() if device.index is None else device.index]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
