"""The built-in tool task: multiply with a calculator, over several turns.

`task.name=calculator` asks for the last digit of a product, "7*8%10";
`roles.rollout.env=calculator` hands the model a calculator whose display starts
with the question. Each model turn is keys: a turn with "=" evaluates the
display followed by the keys typed before the "=" ("=" alone computes the
question; "+1=" computes 7*8%10+1) in the sandboxed Python tool
(flowrl.data.isolation.sandbox), and the observation is the result ("6"), or "?" when
the tool failed (the error is kept in the row's `tool_error`); the episode's
first call that computes a number earns `call_reward`. A turn without "=" is
the answer: reward 1.0 when its leading integer is right, else 0.0. With
one token per turn and two turns (roles.rollout.max_new_tokens=1,
roles.rollout.max_turns=2) the tiny model learns to press "=" and copy the result
within a few dozen steps, faster than it learns the table.

`roles.rollout.env=python` is the general tool: a turn holding a ```python fenced
block runs it and shows what it printed (or "error: <the tool error>"); a
turn without code is the answer, 1.0 when its last integer is the task's
`answer`.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any

from flowrl.data.multiturn.envs import EnvStep
from flowrl.data.isolation.sandbox import ToolResult, run_python

_LEADING_INT = re.compile(r"-?\d+")
_FENCED = re.compile(r"```python\n(.*?)```", re.DOTALL)


class CalculatorTask:
    """Prompts "a*b%10" with operands in 0..max_operand; metadata: the product's last digit as `answer`."""

    meta_keys = ("answer",)
    chars = "0123456789+-*%=?"

    def __init__(self, max_operand: int = 9):
        if max_operand < 1:
            raise ValueError(f"task.max_operand must be >= 1, got {max_operand}")
        self.max_operand = max_operand

    def example(self, seed: int, index: int) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed * 1_000_003 + index)
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        return f"{a}*{b}%10", {"answer": str(a * b % 10)}

    def reward(self, responses: list[str], meta: list[dict[str, Any]]) -> list[float]:
        """Single-turn scoring (no environment): the response's leading integer against the answer."""
        return [answer_score(text, row["answer"]) for text, row in zip(responses, meta)]


def answer_score(text: str, answer: str, last: bool = False) -> float:
    """1.0 when the text's leading integer (its last one, with `last`) equals `answer`, else 0.0."""
    if last:
        found = _LEADING_INT.findall(text)
        value = found[-1] if found else None
    else:
        match = _LEADING_INT.match(text.strip())
        value = match.group() if match else None
    return 1.0 if value is not None and value.lstrip("-").isdigit() and str(answer).strip() == str(int(value)) \
        else 0.0


class _ToolEnv:
    """Shared by the built-in environments: the tokenizer, the sandbox limits and the episode's metadata."""

    def __init__(self, tokenizer: Any, *, timeout_s: float = 2.0, memory_mb: int = 256,
                 max_output_bytes: int = 4096, max_processes: int = 16, unsafe_no_sandbox: bool = False,
                 max_observation_tokens: int = 16):
        self.tokenizer = tokenizer
        self.limits = dict(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes,
                           max_processes=max_processes)
        for name, value in {**self.limits, "max_observation_tokens": max_observation_tokens}.items():
            if not (isinstance(value, (int, float)) and value > 0):  # nan too
                raise ValueError(f"roles.rollout.env_options.{name}: expected a number > 0, got {value!r}")
        self.limits["unsafe_no_sandbox"] = unsafe_no_sandbox is True
        self.max_observation_tokens = max_observation_tokens
        self.prompt, self.meta = "", {}

    def reset(self, prompt_ids: list[int], meta: dict[str, Any]) -> None:
        self.prompt, self.meta = self.tokenizer.decode(prompt_ids), meta

    def text(self, turn_ids: list[int]) -> str:
        eos = self.tokenizer.eos_token_id
        return self.tokenizer.decode([t for t in turn_ids if t != eos])

    def observe(self, text: str, error: str = "") -> EnvStep:
        ids = self.tokenizer.encode(text, add_special_tokens=False)[:self.max_observation_tokens]
        return EnvStep(observation_ids=ids, error=error)


class CalculatorEnv(_ToolEnv):
    """Options: call_reward (for the episode's first call that computes a number), and timeout_s, memory_mb,
    max_output_bytes, max_processes, unsafe_no_sandbox (the sandbox's), max_observation_tokens."""

    def __init__(self, tokenizer: Any, *, call_reward: float = 0.2, **limits: Any):
        super().__init__(tokenizer, **limits)
        self.call_reward, self.called = call_reward, False

    def step(self, turn_ids: list[int]) -> EnvStep:
        text = self.text(turn_ids)
        keys, pressed, _ = text.partition("=")
        if not pressed:
            return EnvStep(reward=answer_score(text, self.meta["answer"]), done=True)
        result = calculate(f"{self.prompt}{keys}", tuple(sorted(self.limits.items())))
        value = result.output.strip()
        if result.error or not _LEADING_INT.fullmatch(value):
            return self.observe("?", result.error or f"not an integer: {value[:40]!r}")
        reward, self.called = (0.0 if self.called else self.call_reward), True
        return EnvStep(self.observe(value).observation_ids, reward=reward)


@functools.lru_cache(maxsize=4096)
def calculate(expression: str, limits: tuple[tuple[str, Any], ...]) -> ToolResult:
    """The sandboxed tool's result for a calculator expression; cached, since arithmetic is pure (the samples
    of one prompt press "=" on the same display)."""
    return run_python(f"print({expression})", **dict(limits))


class PythonEnv(_ToolEnv):
    """Options: timeout_s, memory_mb, max_output_bytes, max_processes, unsafe_no_sandbox (the sandbox's),
    max_observation_tokens."""

    def step(self, turn_ids: list[int]) -> EnvStep:
        text = self.text(turn_ids)
        code = _FENCED.search(text)
        if code is None:
            return EnvStep(reward=answer_score(text, self.meta.get("answer", ""), last=True), done=True)
        result = run_python(code.group(1), **self.limits)
        if result.error:
            return self.observe(f"error: {result.error}\n", result.error)
        return self.observe(f"output: {result.output}")
