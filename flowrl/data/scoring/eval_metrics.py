"""Evaluation metrics per data source: accuracy of greedy answers, mean@k and pass@k of k samples.

`mean@k` is the mean score over every prompt's k samples; `pass@k` the share
of prompts with at least one sample scoring full marks (>= 1.0, what the rule
scorers give a right answer).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence


def greedy_metrics(scores: Sequence[float], sources: Sequence[str]) -> dict[str, float]:
    """`eval/<source>/greedy`: the mean greedy score of each data source's prompts."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for score, source in zip(scores, sources):
        by_source[source].append(float(score))
    return {f"eval/{source}/greedy": sum(v) / len(v) for source, v in sorted(by_source.items())}


def sampled_metrics(scores: Sequence[float], groups: Sequence[int], sources: Sequence[str] | None,
                    k: int) -> dict[str, float]:
    """`eval/mean@k`, `eval/pass@k` over all prompts, and `eval/<source>/mean@k`, `.../pass@k` per source;
    samples of one prompt share its `groups` id."""
    per_prompt: dict[int, list[float]] = defaultdict(list)
    source_of: dict[int, str] = {}
    for i, (score, group) in enumerate(zip(scores, groups)):
        per_prompt[int(group)].append(float(score))
        if sources is not None:
            source_of[int(group)] = sources[i]
    out = _mean_pass(per_prompt.values(), k, "eval")
    for source in sorted(set(source_of.values())):
        out.update(_mean_pass([s for g, s in per_prompt.items() if source_of[g] == source], k, f"eval/{source}"))
    return out


def _mean_pass(prompts, k: int, prefix: str) -> dict[str, float]:
    prompts = list(prompts)
    samples = [s for p in prompts for s in p]
    return {f"{prefix}/mean@{k}": sum(samples) / len(samples),
            f"{prefix}/pass@{k}": sum(max(p) >= 1.0 for p in prompts) / len(prompts)}
