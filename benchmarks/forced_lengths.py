"""The variable-length workload: each response ends with eos at a length drawn per row from a log-normal
(median a quarter of the cap, capped at the cap), the same draws for every system.

The n-th row a process generates gets draw n (rows in the order each system submits them: prompt-major, the
samples of a prompt adjacent, for flowrl and TRL alike). Three ways in, one per kind of sampler:
- vLLM (flowrl's engine and TRL's colocated one): `EosAtDrawnLength`, a vLLM logits processor found through
  the `vllm.logits_processors` entry point that `install_vllm_plugin` declares on sys.path;
- transformers `generate` (TRL without vLLM): `DrawnLengthProcessor`, passed by `ForcedLengthQwen2.generate`;
- flowrl's hf_static engine: its own `eos_at_B` (the `hf_static_lengths` engine registered here).
Before its drawn length a row cannot end (eos masked); at it, eos is the only token left.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LogitsProcessor, LogitsProcessorList, Qwen2ForCausalLM

LENGTHS_ENV = "FLOWRL_BENCH_LENGTHS"  # a JSON list of draws; unset: no forcing


def draw_lengths(count: int, cap: int, sigma: float, seed: int = 0) -> list[int]:
    """`count` lengths in [1, cap]: round(exp(N(log(cap / 4), sigma^2)))."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(count, generator=gen, dtype=torch.float64)
    return (z * sigma + math.log(cap / 4)).exp().round().clamp(1, cap).long().tolist()


class Draws:
    """The process's draws, handed out in order: `next` the next one, `end` one past the last one to hand out
    (all of them unless a caller moves it: bench_grid's items each take their own stretch)."""

    def __init__(self, lengths: list[int]):
        self.lengths, self.next, self.end = lengths, 0, len(lengths)

    @classmethod
    def from_env(cls) -> "Draws | None":
        path = os.environ.get(LENGTHS_ENV)
        return cls(json.loads(Path(path).read_text())) if path else None

    def take(self, n: int) -> list[int]:
        if self.next + n > self.end:
            raise RuntimeError(f"{LENGTHS_ENV}: draws end at row {self.end}, asked for row {self.next + n}")
        out = self.lengths[self.next:self.next + n]
        self.next += n
        return out


_DRAWS: Draws | None = None


def process_draws() -> Draws:
    global _DRAWS
    if _DRAWS is None:
        _DRAWS = Draws.from_env()
        if _DRAWS is None:
            raise RuntimeError(f"{LENGTHS_ENV} is not set")
    return _DRAWS


def write_draws(lengths: list[int], folder: str) -> str:
    path = Path(folder) / "lengths.json"
    path.write_text(json.dumps(lengths))
    os.environ[LENGTHS_ENV] = str(path)
    return str(path)


# ---- vLLM ---------------------------------------------------------------------------------------------------

def install_vllm_plugin(folder: str) -> None:
    """Declares EosAtDrawnLength as a vLLM logits-processor plugin: a dist-info with the entry point, on
    sys.path and PYTHONPATH (for any engine process vLLM starts)."""
    info = Path(folder) / "flowrl_bench_lengths-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flowrl-bench-lengths\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[vllm.logits_processors]\neos_at_drawn_length = "
                                           "forced_lengths:EosAtDrawnLength\n")
    here = str(Path(__file__).resolve().parent)
    sys.path[:0] = [folder]
    os.environ["PYTHONPATH"] = os.pathsep.join([folder, here, os.environ.get("PYTHONPATH", "")])


def _vllm_processor_base():
    from vllm.v1.sample.logits_processor import LogitsProcessor as VLLMLogitsProcessor
    return VLLMLogitsProcessor


try:  # the class must subclass vLLM's; without vLLM it is never loaded
    _Base = _vllm_processor_base()
except ImportError:
    _Base = object


class EosAtDrawnLength(_Base):
    """vLLM batch-level logits processor: each request added to the batch takes the next draw L; eos is masked
    while it has fewer than L - 1 tokens and is the only choice at L - 1."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        self.eos = vllm_config.model_config.hf_config.eos_token_id
        self.device = device
        self.rows: dict[int, tuple[int, list[int]]] = {}  # batch index -> (draw, the request's output tokens)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, _prompt, output in batch_update.added:
            self.rows[index] = (process_draws().take(1)[0], output)
        for a, b, direction in batch_update.moved:
            moving = self.rows.pop(a, None)
            if direction.name == "SWAP":
                other = self.rows.pop(b, None)
                if other is not None:
                    self.rows[a] = other
            if moving is not None:
                self.rows[b] = moving

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        index, left = zip(*((i, draw - 1 - len(out)) for i, (draw, out) in self.rows.items()))
        index_N = torch.tensor(index, device=logits.device)
        left_N = torch.tensor(left, device=logits.device)
        eos_N = logits[index_N, self.eos]
        logits[index_N, self.eos] = torch.where(left_N > 0, float("-inf"), eos_N)
        last = index_N[left_N <= 0]
        if len(last):
            logits[last] = float("-inf")
            logits[last, self.eos] = 0.0
        return logits


# ---- transformers generate ----------------------------------------------------------------------------------

class DrawnLengthProcessor(LogitsProcessor):
    """For one generate call: rows take the next draws; the same rule as EosAtDrawnLength."""

    def __init__(self, eos_id: int):
        self.eos_id, self.start, self.draws_B = eos_id, None, None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.start is None:
            self.start = input_ids.shape[1]
            self.draws_B = torch.tensor(process_draws().take(input_ids.shape[0]), device=scores.device)
        left_B = self.draws_B - 1 - (input_ids.shape[1] - self.start)
        eos_B = scores[:, self.eos_id]
        scores = scores.clone()
        scores[:, self.eos_id] = torch.where(left_B > 0, float("-inf"), eos_B)
        last_B = left_B <= 0
        scores[last_B] = float("-inf")
        scores[last_B, self.eos_id] = 0.0
        return scores


class ForcedLengthQwen2(Qwen2ForCausalLM):
    """The benchmark model whose `generate` ends rows at the drawn lengths (TRL without vLLM)."""

    def generate(self, *args, **kwargs):
        kwargs["logits_processor"] = LogitsProcessorList([DrawnLengthProcessor(self.config.eos_token_id)])
        return super().generate(*args, **kwargs)


# ---- flowrl's hf_static -------------------------------------------------------------------------------------

def register_flowrl_engine() -> None:
    """`roles.rollout.engine=hf_static_lengths`: hf_static with each row's eos_at_B from the draws."""
    from flowrl.engines.configs import ROLLOUT_ENGINES
    from flowrl.engines.hf.configs import HFStaticRolloutConfig
    from flowrl.engines.models.folders import load_causal_lm
    from flowrl.engines.hf.static import StaticCacheRolloutEngine
    from flowrl.engines.train.hf_engine import HFTrainEngine

    class DrawnLengthEngine(StaticCacheRolloutEngine):
        def generate(self, prompt_ids_BP, prompt_mask_BP, params, *, seed=None):
            eos_at_B = torch.tensor(process_draws().take(prompt_ids_BP.shape[0]))
            return super().generate(prompt_ids_BP, prompt_mask_BP, params, seed=seed, eos_at_B=eos_at_B)

    class DrawnLengthConfig(HFStaticRolloutConfig):
        def build(self, source, *, tokenizer, device, share=None):  # HFStaticRolloutConfig.build's, this engine
            model = share.model if isinstance(share, HFTrainEngine) else \
                load_causal_lm(source.path, getattr(torch, source.dtype))
            return DrawnLengthEngine(model, tokenizer, self, device=device)

    if "hf_static_lengths" not in ROLLOUT_ENGINES.names():
        ROLLOUT_ENGINES.register("hf_static_lengths", DrawnLengthConfig)


def temp_folder() -> str:
    return tempfile.mkdtemp(prefix="flowrl-bench-")
