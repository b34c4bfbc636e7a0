"""The workload of benchmarks/planner_one_gpu.py's `flowrl plan` and `flowrl train` processes, as issue 43 states
it: 256-token prompts and long-tailed responses.

- `grpo` is the prebuilt GRPO. The processes name it by this file's path, so flowrl imports this file before it
  checks the run's config, and the forced-length engine registered here is a known name by then.
- `task` makes `bench_workload.BenchTask(PROMPT_LEN)`: prompts of PROMPT_LEN characters. The benchmark's
  tokenizer has one token per character, so that is PROMPT_LEN tokens.
- With FLOWRL_BENCH_LENGTHS set (forced_lengths.write_draws), each response ends at its drawn length, as
  grpo_vs_trl.py's systems do. For hf_static that is `roles.rollout.engine=hf_static_lengths`, hf_static with
  each row's eos_at_B. For vLLM it is forced_lengths' logits-processor plugin, declared on sys.path here
  before vLLM starts.
  Every process takes the draws from the first, so each run of one shape generates the same lengths.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alias_algorithms  # noqa: E402

alias_algorithms()

import forced_lengths  # noqa: E402
from bench_workload import BenchTask  # noqa: E402
from flowrl.algorithms.grpo import grpo  # noqa: E402  (the algorithm the processes name)

__all__ = ["grpo", "task", "forcing"]
PROMPT_LEN = 256


def task() -> BenchTask:
    return BenchTask(PROMPT_LEN)


def forcing() -> bool:
    """Whether this process's responses end at drawn lengths (FLOWRL_BENCH_LENGTHS names the draws)."""
    return bool(os.environ.get(forced_lengths.LENGTHS_ENV))


if forcing():
    forced_lengths.register_flowrl_engine()
    forced_lengths.install_vllm_plugin(str(Path(os.environ[forced_lengths.LENGTHS_ENV]).parent / "plugin"))
