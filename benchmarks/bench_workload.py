"""What every system of `grpo_vs_trl.py` shares: the workload (`Workload`), the prompts and reward (`BenchTask`),
the process's clock (`START`, `ITEM_START`: read them as `bench_workload.ITEM_START`, main's loop resets the
latter per workload) and small helpers."""

from __future__ import annotations

import random
import statistics
import string
import time
import zlib
from dataclasses import dataclass, field

import torch

import forced_lengths

START = time.perf_counter()  # the process's start, for the time to the first finished step
ITEM_START = START  # the current workload's start in main's loop (--grid: each item's)

PEAK_FLOPS, PEAK_NAME = 989e12, "H100/H200 SXM dense bf16"


@dataclass
class Workload:
    device: str
    prompts: int
    group: int
    new_tokens: int
    prompt_len: int
    micro: int
    steps: int
    warmup: int
    lr: float
    kl_coef: float
    lengths: str = "fixed"
    sigma: float = 1.0
    profile: str = ""  # "", "update" or "generate" (grpo_vs_trl.py --profile)
    flowrl_sets: list[str] = field(default_factory=list)
    shape: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def dtype_name(self) -> str:
        return "bfloat16" if self.device == "cuda" else "float32"

    @property
    def variable(self) -> bool:
        return self.lengths == "variable"

    def draws(self) -> list[int]:
        """Every row's drawn length, in generation order (twice what the steps take: a margin)."""
        return forced_lengths.draw_lengths(2 * self.rows * (self.warmup + self.steps), self.new_tokens, self.sigma)

    def useful_tokens(self) -> float:
        """Mean response tokens (EOS included) per timed step."""
        if not self.variable:
            return float(self.rows * self.new_tokens)
        draws = self.draws()[self.warmup * self.rows:(self.warmup + self.steps) * self.rows]
        return sum(draws) / self.steps

    def flowrl_engine(self) -> str:
        from flowrl.config import PRESETS

        engines = [s.split("=", 1)[1] for s in self.flowrl_sets if s.startswith("roles.rollout.engine=")]
        # unset: train.device=cuda picks hf_static (the preset cuda); the H200 grid of 2026-12-04 left it unset, so
        # its variable-length flowrl rows ran without the drawn lengths (every response to the cap)
        return engines[-1] if engines else (PRESETS["cuda"]["roles.rollout.engine"] if self.device == "cuda" else "")


class BenchTask:
    """Prompts of exactly `prompt_len` characters (= tokens: the tokenizer is char-level); the reward is a hash
    of the response, so it varies within each group and advantages are not all zero."""

    meta_keys = ("target",)
    chars = string.ascii_lowercase

    def __init__(self, prompt_len: int = 128):
        self.prompt_len = prompt_len

    def example(self, seed: int, index: int) -> tuple[str, dict]:
        rng = random.Random(seed * 1_000_003 + index)
        text = "".join(rng.choice(self.chars) for _ in range(self.prompt_len))
        return text, {"target": text[0]}

    def reward(self, responses: list[str], meta: list[dict]) -> list[float]:
        return [zlib.crc32(f"{m['target']}{r}".encode()) % 1000 / 1000 for r, m in zip(responses, meta)]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def mean_or_none(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None

