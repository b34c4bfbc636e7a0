"""The built-in verifiable task: add two small integers.

Prompt "3+5=", target "8". Reward: 1.0 for the exact answer, 0.1 for a
well-formed but wrong integer (verl's format score), 0.0 otherwise. Prompts
are a pure function of (seed, index), so a resumed run sees the same data.
"""

from __future__ import annotations

import random
from typing import Any

CHARS = "0123456789+="


class ArithmeticTask:
    meta_keys = ("answer",)
    chars = CHARS

    def __init__(self, max_operand: int = 9, format_score: float = 0.1):
        if max_operand < 1:
            raise ValueError(f"task.max_operand must be >= 1, got {max_operand}")
        self.max_operand, self.format_score = max_operand, format_score

    def max_answer_chars(self) -> int:
        return len(str(2 * self.max_operand))

    def example(self, seed: int, index: int) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed * 1_000_003 + index)
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        return f"{a}+{b}=", {"answer": str(a + b)}

    def reward(self, responses: list[str], meta: list[dict[str, Any]]) -> list[float]:
        return [self.score(text, row["answer"]) for text, row in zip(responses, meta)]

    def score(self, response: str, answer: str) -> float:
        text = response.strip()
        if text == answer:
            return 1.0
        return self.format_score if text.isdigit() else 0.0


TASKS = {"arithmetic": ArithmeticTask}
