"""Black-box agents: a user's program plays each episode through the endpoint, with a deadline.

An agent is either

- a function, `roles.rollout.agent="module:function"` (or "file.py:function"), called as `function(episode)` with
  an `AgentEpisode` (its `base_url` and `api_key` for any OpenAI client, the prompt as text and token ids, the
  task's metadata for it) in a daemon thread of its own; it returns the episode's reward, or None; or
- a program, `roles.rollout.agent_command=[...]`, started once per episode in a process group of its own with
  FLOWRL_BASE_URL, FLOWRL_API_KEY, FLOWRL_PROMPT and FLOWRL_META (JSON) in its environment; the last line it
  prints is its reward (a number, or JSON `{"reward": x}`), or nothing.

An agent that raises, exits non-zero or prints no reward ends its episode with reward 0 and its error (one
line; `agent/failed`); one that runs past `timeout_s` too (`agent/timed_out`): its episode is closed at once,
so its later calls are refused (410), a program's process group is killed, and a function's thread is
abandoned (a daemon). At most `workers` episodes run at once; each deadline starts when its episode starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass(frozen=True)
class AgentEpisode:
    """What an agent gets for one episode."""

    id: str
    base_url: str
    api_key: str
    prompt: str
    prompt_ids: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """How an agent's episode ended."""

    reward: float | None = None
    error: str = ""
    timed_out: bool = False
    done: bool = False


Agent = Callable[[AgentEpisode], Any]


def run_function(agent: Agent, episode: AgentEpisode, outcome: Outcome) -> None:
    try:
        outcome.reward = reward_of(agent(episode))
    except BaseException as err:  # the agent's own failure ends its episode, not the run
        outcome.error = one_line(f"agent raised {type(err).__name__}: {err}")
    outcome.done = True


def run_command(command: Sequence[str], timeout_s: float) -> Callable[[AgentEpisode, Outcome], None]:
    def run(episode: AgentEpisode, outcome: Outcome) -> None:
        env = {**os.environ, "FLOWRL_BASE_URL": episode.base_url, "FLOWRL_API_KEY": episode.api_key,
               "FLOWRL_PROMPT": episode.prompt, "FLOWRL_META": json.dumps(episode.meta, default=str)}
        try:
            proc = subprocess.Popen(list(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, text=True)
        except OSError as err:
            outcome.error, outcome.done = one_line(f"agent command {command[0]!r} did not start: {err}"), True
            return
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return  # the caller marks the timeout
        if proc.returncode != 0:
            outcome.error = one_line(f"agent exited {proc.returncode}: {(err or '').strip()[-300:]}")
        else:
            lines = [line for line in out.splitlines() if line.strip()]
            try:
                outcome.reward = reward_of(json.loads(lines[-1])) if lines else None
            except (ValueError, TypeError) as bad:
                outcome.error = one_line(f"agent's last line is not a reward: {lines[-1][:200]!r} ({bad})")
        outcome.done = True
    return run


def reward_of(value: Any) -> float | None:
    if isinstance(value, dict):
        value = value.get("reward")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a reward is a number, got {type(value).__name__}")
    return float(value)


def one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def play(episodes: Sequence[AgentEpisode], start: Callable[[AgentEpisode, Outcome], None], *, timeout_s: float,
         workers: int, on_end: Callable[[AgentEpisode], None], poll_s: float = 0.02) -> list[Outcome]:
    """Runs `start(episode, outcome)` for every episode in daemon threads, at most `workers` at once, each
    within `timeout_s` of its start; `on_end(episode)` runs as each ends (finished or timed out)."""
    if workers < 1:
        raise ValueError(f"roles.rollout.agent_workers must be >= 1, got {workers}")
    outcomes = [Outcome() for _ in episodes]
    waiting = list(range(len(episodes)))
    running: dict[int, float] = {}
    while waiting or running:
        while waiting and len(running) < workers:
            index = waiting.pop(0)
            threading.Thread(target=start, args=(episodes[index], outcomes[index]), daemon=True,
                             name="flowrl-agent").start()
            running[index] = time.monotonic()
        for index, began in list(running.items()):
            outcome = outcomes[index]
            if not outcome.done and time.monotonic() - began > timeout_s:
                outcome.timed_out, outcome.reward = True, None
                outcome.error = f"agent ran past roles.rollout.agent_timeout_s={timeout_s:g}"
            if outcome.done or outcome.timed_out:
                del running[index]
                on_end(episodes[index])
        time.sleep(poll_s)
    return outcomes
