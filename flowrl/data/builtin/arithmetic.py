"""The built-in verifiable task: add two small integers.

Prompt "3+5=", target "8". The answer is the integer the response starts
with ("8", "8=" and "8+1" all answer 8; "83" answers 83). Reward: 1.0 for the
right answer, `format_score` for a wrong integer, 0.0 for no integer. Prompts
are a pure function of (seed, index), so a resumed run sees the same data.
"""

from __future__ import annotations

import random
import re
from typing import Any

CHARS = "0123456789+="
_LEADING_INT = re.compile(r"\d+")


class ArithmeticTask:
    meta_keys = ("answer",)
    chars = CHARS

    def __init__(self, max_operand: int = 9, format_score: float = 0.0):
        if max_operand < 1:
            raise ValueError(f"task.max_operand must be >= 1, got {max_operand}")
        self.max_operand, self.format_score = max_operand, format_score

    def example(self, seed: int, index: int) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed * 1_000_003 + index)
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        return f"{a}+{b}=", {"answer": str(a + b)}

    def reward(self, responses: list[str], meta: list[dict[str, Any]]) -> list[float]:
        return [self.score(text, row["answer"]) for text, row in zip(responses, meta)]

    def score(self, response: str, answer: str) -> float:
        found = _LEADING_INT.match(response.strip())
        if found is None:
            return 0.0
        return 1.0 if int(found.group()) == int(answer) else self.format_score
