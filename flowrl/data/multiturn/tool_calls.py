"""Tool-call formats: how a chat model writes a call in its turn, and how it is told which tools exist.

A format is registered by name (`register_format`, an open registry; `roles.rollout.env_options.tool_format`
names one, or "module:attribute") and does two things:

- `parse(text)`: the calls in an assistant turn's text, as `ToolCall(name, arguments)`, or a one-line
  parse error (a string) that the environment hands back to the model as the tool's result. It never
  raises: a malformed call is the model's mistake, part of the episode, not a crash of the run.
- `instructions(tools)`: the system-prompt text that lists the tools and shows the call syntax, for chat
  templates that do not render a `tools` list themselves (flowrl.data.multiturn.chat_env).

Built in: `hermes`, the format of Hermes 2 Pro and of Qwen2.5's chat template: each call is a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` (on lines of their own).
vLLM's parser of the same format (vllm.tool_parsers.hermes_tool_parser) is not used: it needs a tokenizer
and an OpenAI request object, takes ~11 s to import on CPU, and on a malformed call logs the exception and
reports no call at all, where the model should be told what was wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from flowrl.data.imports import import_attribute


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Tool:
    """A tool as a model is told of it: OpenAI's function schema (what chat templates render as `tools`)."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of the arguments object

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


class ToolCallFormat(Protocol):
    def parse(self, text: str) -> list[ToolCall] | str: ...

    def instructions(self, tools: list[Tool]) -> str: ...


FORMATS: dict[str, ToolCallFormat] = {}


def register_format(name: str, fmt: ToolCallFormat) -> ToolCallFormat:
    """Adds `fmt` to the registry as `name` (replacing one of that name); returns it."""
    FORMATS[name] = fmt
    return fmt


def get_format(name: str, where: str = "roles.rollout.env_options.tool_format: ") -> ToolCallFormat:
    """The registered format `name`, or the object at "module:attribute"; one line naming `where` otherwise."""
    fmt = FORMATS[name] if name in FORMATS else import_attribute(name, where, FORMATS)
    if not (callable(getattr(fmt, "parse", None)) and callable(getattr(fmt, "instructions", None))):
        raise ValueError(f"{where}{name!r} is a {type(fmt).__name__}, not a format with parse(text) and "
                         f"instructions(tools)")
    return fmt


class Hermes:
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, any number per turn."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def parse(self, text: str) -> list[ToolCall] | str:
        bodies = self._CALL.findall(text)
        if text.count(self.OPEN) != len(bodies):
            return f"a {self.OPEN} without its {self.CLOSE}"
        calls = []
        for i, body in enumerate(bodies):
            call = _call(body, i)
            if isinstance(call, str):
                return call
            calls.append(call)
        return calls

    def instructions(self, tools: list[Tool]) -> str:
        listed = "\n".join(json.dumps(tool.schema(), ensure_ascii=False) for tool in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
                "</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _call(body: str, index: int) -> ToolCall | str:
    """One call's JSON object, or a one-line error naming the call (0-based) and what is wrong."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return f"tool call {index}: invalid JSON ({err.msg} at char {err.pos})"
    except (ValueError, RecursionError) as err:  # an integer of 5000 digits; arrays nested thousands deep
        return f"tool call {index}: invalid JSON ({type(err).__name__})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return f'tool call {index}: expected {{"name": "<tool>", "arguments": {{...}}}}'
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return f"tool call {index}: 'arguments' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(obj["name"], arguments)


register_format("hermes", Hermes())
