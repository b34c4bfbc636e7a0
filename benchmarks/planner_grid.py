"""benchmarks/planner_one_gpu.py's hand grid: the rows a user would try on one card (the defaults, each engine, then
what a refusal advises first), which of them a row that ran makes pointless (DOMINATED), the rows added where an
engine's every row was refused (advised_rows), and the engine a row's values run."""

from __future__ import annotations

import torch

VLLM_05 = ["roles.rollout.engine=vllm", "roles.rollout.gpu_memory_utilization=0.5", "roles.rollout.free_cache_engine=1"]
VLLM_GRAPHS = [*VLLM_05, "roles.rollout.enforce_eager=false"]
CKPT = ["model.gradient_checkpointing=true"]
OFFLOAD = ["roles.actor.offload_optimizer=true"]
GRID = {  # the hand grid: what a user would try: the defaults, each engine, then what a refusal advises first
    "hf_static": [],
    "vllm graphs 0.5 sleep1": VLLM_GRAPHS,
    "hf_static ckpt": CKPT,
    "vllm graphs ckpt": [*VLLM_GRAPHS, *CKPT],
    "hf_static ckpt+offload": [*CKPT, *OFFLOAD],
    "vllm eager 0.5 sleep1": [*VLLM_05, "roles.rollout.enforce_eager=true"],
    "vllm ckpt+offload": [*VLLM_GRAPHS, *CKPT, *OFFLOAD],
}
# a grid row that is its base row's layout with recompute (checkpointing) or PCIe traffic (optimizer offload) added
# to the same micro-batches, so never faster than it. It runs only where no row of its chain (its base, its base's
# base) ran to its end (refused or out of memory, as at 7B), or where that row ran near the card's memory
# (`unpressed`); where one ran with room, it is left out (a "skipped" line) unless --run-dominated
DOMINATED = {"hf_static ckpt": "hf_static", "hf_static ckpt+offload": "hf_static ckpt",
             "vllm graphs ckpt": "vllm graphs 0.5 sleep1", "vllm ckpt+offload": "vllm graphs ckpt"}


def dominating(label: str, done: dict[str, dict]) -> str | None:
    """The row of `label`'s chain that ran to its end with room, which makes it pointless; None: run it."""
    while (label := DOMINATED.get(label)) is not None:
        base = done.get(label, {})
        if base.get("ok") and base.get("s_step") and unpressed(base.get("peak_gib")):
            return label
    return None


ADVISED = "advised"  # --runs' name for advised_rows
ADVISED_ENGINES = ("hf_static", "vllm graphs")  # the engines point 7 compares (the planner's two)


def advice_values(error: str) -> list[str] | None:
    """The first set of `--set` values a memory refusal names that keeps the math (no LoRA: the planner never
    changes it either), as a list; None where the error names none."""
    if "it would fit with " not in error:
        return None
    sets = error.split("it would fit with ", 1)[1].split(" (`flowrl plan", 1)[0].split("; or ")
    return next((s.split(" + ") for s in sets if "lora_rank" not in s), None)


def advised_rows(grid: dict[str, list[str]], done: dict[str, dict]) -> dict[str, list[str]]:
    """For each of ADVISED_ENGINES none of whose grid rows ran to its end (all refused before loading, as at 7B):
    the row a user reaches by setting what the refusal of its last refused row advises ('LABEL + advice'), so
    that each engine that can run full-parameter has a measured row."""
    rows = {}
    for engine in ADVISED_ENGINES:
        labels = [label for label, values in grid.items() if engine_of(values) == engine]
        if any(done.get(label, {}).get("ok") for label in labels):
            continue
        advised = {label: advice for label in labels
                   if (advice := advice_values(done.get(label, {}).get("error") or ""))}
        if advised:
            last, advice = list(advised.items())[-1]
            rows[f"{last} + advice"] = [*grid[last], *[v for v in advice if v not in grid[last]]]
    return rows


PRESSED = 0.9  # a base row peaking above this share of the card may have paid for the allocator's retries


def unpressed(peak_gib: float | None) -> bool:
    """Whether a run's peak left the card's allocator room (below PRESSED of it; always where no GPU is): only
    then is a row that adds recompute and offload to it sure to be slower."""
    if not torch.cuda.is_available():
        return True
    return peak_gib is not None and peak_gib < PRESSED * torch.cuda.get_device_properties(0).total_memory / 2**30


def engine_of(values: list[str]) -> str:
    """hf_static, 'vllm graphs' or 'vllm eager' (the rollout's enforce_eager)."""
    if "roles.rollout.engine=vllm" not in values:
        return "hf_static"
    return "vllm eager" if "roles.rollout.enforce_eager=true" in values else "vllm graphs"


def chosen_engine(written: dict) -> str:
    rollout = written.get("roles", {}).get("rollout", {})
    if rollout.get("engine", "hf_static") != "vllm":
        return rollout.get("engine", "hf_static")
    return "vllm eager" if rollout.get("enforce_eager", True) else "vllm graphs"
