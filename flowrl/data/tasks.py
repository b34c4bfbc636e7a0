"""Tasks: where prompts come from and how responses are scored.

A task is any object with `meta_keys` (per-prompt metadata columns the reward
needs), `chars` (the alphabet of the built-in tiny model; unused with
model.path), `example(seed, index) -> (prompt text, metadata)` and
`reward(responses, metadata) -> scores`. `task.name` picks a built-in one (arithmetic; calculator, the multi-turn tool
task of flowrl.data.builtin.calculator) or
names your own as "package.module:attribute" (a class or factory called with
no arguments).
"""

from __future__ import annotations

from typing import Any, Protocol

from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.data.builtin.calculator import CalculatorTask
from flowrl.data.imports import import_attribute


class Task(Protocol):
    meta_keys: tuple[str, ...]
    chars: str

    def example(self, seed: int, index: int) -> tuple[str, dict[str, Any]]: ...

    def reward(self, responses: list[str], meta: list[dict[str, Any]]) -> list[float]: ...


BUILT_IN = {"arithmetic": ArithmeticTask, "calculator": CalculatorTask}


def make_task(name: str, max_operand: int) -> Task:
    """The built-in task `name`, or the user's task at "module:attribute"."""
    if name in BUILT_IN:
        return BUILT_IN[name](max_operand=max_operand)
    factory = import_attribute(name, "task.name: ", BUILT_IN)
    try:
        task = factory()
    except Exception as err:
        raise ValueError(f"task.name: {name!r} raised {type(err).__name__} when called: {err}") from None
    return check_task(task, f"task.name {name!r}")


TASK_API = ("meta_keys", "chars", "example", "reward")


def check_task(task: Task, where: str) -> Task:
    """The task, if it has what a task needs; else one line naming what is missing."""
    missing = [attr for attr in TASK_API if not hasattr(task, attr)]
    if missing:
        raise ValueError(f"{where}: the task has no {missing[0]!r}; a task needs meta_keys, chars, "
                         f"example(seed, index) and reward(responses, meta)")
    return task
