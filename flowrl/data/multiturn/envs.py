"""Environments: what a multi-turn rollout talks to between the model's turns.

An environment is one episode's state. `reset(prompt_ids, meta)` starts it
with the prompt's token ids and the task's metadata for that prompt (e.g. the
answer); `step(turn_ids)` takes the model's turn, exactly the token ids it
sampled (eos included when it stopped there), and returns an `EnvStep`: the
observation's token ids (appended to the context, outside the loss), a
reward, whether the episode is done, and a named error when a tool failed.
Token ids in and out, so nothing the model sampled is ever retokenised.

`roles.rollout.env` picks a built-in environment (`calculator`, `python`: see
flowrl.data.builtin.calculator; `chat_tools`, tool calls of real chat models through their chat template: see
flowrl.data.multiturn.chat_env) or names your own as "package.module:attribute": a
class or factory called as `factory(tokenizer, **roles.rollout.env_options)` once
per episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from flowrl.data.isolation import sandbox
from flowrl.data.imports import import_attribute


@dataclass(frozen=True)
class EnvStep:
    observation_ids: list[int] = field(default_factory=list)  # in the context, out of the loss
    reward: float = 0.0
    done: bool = False
    error: str = ""  # a tool's failure, one line ("timeout after 2.0s"); kept in the row's `tool_error`


class Environment(Protocol):
    def reset(self, prompt_ids: list[int], meta: dict[str, Any]) -> None: ...

    def step(self, turn_ids: list[int]) -> EnvStep: ...


EnvFactory = Callable[..., Environment]

BUILT_IN = {"calculator": "flowrl.data.builtin.calculator:CalculatorEnv", "python": "flowrl.data.builtin.calculator:PythonEnv",
            "chat_tools": "flowrl.data.multiturn.chat_env:ChatToolEnv"}
SANDBOXED = ("calculator", "python", "chat_tools")  # built-ins that run model-written code in flowrl.data.isolation.sandbox


def load_env(name: str, where: str = "roles.rollout.env: ") -> EnvFactory:
    """The factory of the built-in environment `name`, or of the user's at "module:attribute"."""
    factory = import_attribute(BUILT_IN.get(name, name), where, BUILT_IN)
    if not callable(factory):
        raise ValueError(f"{where}{name!r} is a {type(factory).__name__}, not a class or factory")
    return factory


@dataclass(frozen=True)
class EnvSpec:
    """How `rollout.interact` makes and bounds each episode (from the rollout config: `roles.rollout.env`, ...)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 4
    max_total_tokens: int = 32
    num_workers: int = 8  # threads stepping a turn's environments at once
    step_timeout_s: float | None = 60.0  # a step past it ends its episode (flowrl.engines.agents.loop)
    async_episodes: bool = False  # each episode a coroutine over a StreamingEngine (flowrl.engines.agents.async_loop)

    def __post_init__(self) -> None:
        """A sandboxed tool without bubblewrap refuses here, before any model loads (one line naming the install),
        unless options hold unsafe_no_sandbox=True, which warns."""
        if self.name in SANDBOXED:
            sandbox.check(f"roles.rollout.env={self.name}", unsafe=self.options.get("unsafe_no_sandbox") is True)

    def make(self, tokenizer: Any) -> Environment:
        """A fresh environment for one episode; a bad option is one line naming env.options."""
        try:
            env = load_env(self.name)(tokenizer, **self.options)
        except TypeError as err:
            raise ValueError(f"roles.rollout.env_options: {self.name!r} refused {self.options}: {err}") from None
        missing = [attr for attr in ("reset", "step") if not callable(getattr(env, attr, None))]
        if missing:
            raise ValueError(f"roles.rollout.env: {self.name!r} made a {type(env).__name__} with no {missing[0]}(); an "
                             f"environment needs reset(prompt_ids, meta) and step(turn_ids)")
        return env
