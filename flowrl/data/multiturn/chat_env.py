"""`roles.rollout.env=chat_tools`: tool use for real chat models, through the model's own chat template.

The environment keeps the episode as chat messages. On each step it decodes the sampled turn (without its
end-of-turn token, the tokenizer's eos, e.g. `<|im_end|>`) into an assistant message, parses its tool calls
in a registered format (flowrl.data.multiturn.tool_calls, `hermes` by default), runs each call's tool and appends
its result as a `tool` message. A turn without a call is the answer: the episode ends, scored by the
task's scorer (flowrl.data.scoring.scorers, by the row's data_source or `reward`; a task with an `answer` instead:
its last integer).

**The observation is what the chat template adds.** The agent loop's context is token ids (nothing is
decoded and re-encoded, flowrl.engines.agents.loop), so the observation must be exactly the tokens the
template puts after the sampled turn: template(messages with the tool results, generation prompt) minus
the template's rendering up to and including the assistant's end-of-turn token. What follows that token
(ChatML's "\\n" separator) is the observation's first token, not dropped (verl#6921's bug: a loop that
tokenizes the tool turn alone starts it at `<|im_start|>` and the trained context loses the separator the
model sees at inference). A turn cut before its eos gets the eos as the observation's first token.

**Continuity is checked, not assumed.** Each step checks that the template's rendering up to the
end-of-turn token equals, token for token, the prompt's rendering + every sampled turn + every earlier
observation, and that rendering with the tool results keeps that prefix (a template that rewrites earlier
turns, e.g. drops reasoning, does not). A failure ends the episode with reward 0 and the tool error
"token continuity: ..." (counted in env/tool_error_rate): silent drift would train on a context the model
never sees at inference. The assistant's text goes back as `content`, not as structured `tool_calls`, so
the template renders exactly what was sampled. The prompt is opaque to the environment (PromptStream
rendered it); the turns are rendered after a stand-in prompt, which a chat template renders the same way
in every call, so only the rendering after it is compared.

**Prompts.** `tool_prompt` renders messages with the template's `tools` list when the template renders
one (Qwen2.5's does); otherwise (SmolLM2's ignores `tools`) `tool_messages` puts the format's
instructions, the tools' JSON schemas and the call syntax, in the system message (replacing a template's
default system message). Data rows for `task.chat_template=true` can carry those messages as their prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flowrl.data.builtin.calculator import calculate, answer_score
from flowrl.data.conversations import Messages, render_chat
from flowrl.data.multiturn.envs import EnvStep
from flowrl.data.isolation.sandbox import ToolResult, run_python
from flowrl.data.scoring.scorers import resolve, scorer_name
from flowrl.data.multiturn.tool_calls import Tool, ToolCall, get_format

STAND_IN: Messages = [{"role": "user", "content": ""}]  # the prompt's place when turns are rendered


@dataclass(frozen=True)
class ChatTool:
    tool: Tool
    run: Callable[[dict[str, Any], dict[str, Any]], ToolResult]  # (arguments, sandbox limits) -> result


TOOLS: dict[str, ChatTool] = {}


def register_tool(tool: Tool, run: Callable[[dict[str, Any], dict[str, Any]], ToolResult]) -> ChatTool:
    """Adds a tool to the registry under `tool.name` (`env_options.tools` names it)."""
    TOOLS[tool.name] = ChatTool(tool, run)
    return TOOLS[tool.name]


def _string_argument(arguments: dict[str, Any], key: str, tool: str) -> str | ToolResult:
    value = arguments.get(key)
    return value if isinstance(value, str) else ToolResult("", f"{tool} needs {{{key!r}: <string>}}")


def _calculator(arguments: dict[str, Any], limits: dict[str, Any]) -> ToolResult:
    expression = _string_argument(arguments, "expression", "calculator")
    return expression if isinstance(expression, ToolResult) else \
        calculate(expression, tuple(sorted(limits.items())))  # the calculator env's sandboxed, cached evaluation


def _python(arguments: dict[str, Any], limits: dict[str, Any]) -> ToolResult:
    code = _string_argument(arguments, "code", "python")
    return code if isinstance(code, ToolResult) else run_python(code, **limits)


register_tool(Tool("calculator", "Evaluates an arithmetic expression in Python syntax and returns its value.",
                   {"type": "object", "properties": {"expression": {"type": "string", "description":
                    "e.g. (17 + 25) * 3"}}, "required": ["expression"]}), _calculator)
register_tool(Tool("python", "Runs Python code in a sandbox and returns what it prints.",
                   {"type": "object", "properties": {"code": {"type": "string", "description":
                    "a Python program; print the result"}}, "required": ["code"]}), _python)


class ChatToolEnvConfig(BaseModel):
    """`roles.rollout.env_options` of `roles.rollout.env=chat_tools`."""

    model_config = ConfigDict(extra="forbid")
    tools: list[str] = Field(default_factory=lambda: ["calculator", "python"], min_length=1,
                             description="Registered tools the model may call (flowrl.data.multiturn.chat_env.TOOLS).")
    tool_format: str = Field("hermes", description="The tool-call format (flowrl.data.multiturn.tool_calls.FORMATS) or "
                                                   "'module:attribute'.")
    reward: str = Field("auto", description="Scorer of the final answer when the row has a ground_truth: 'auto' "
                                            "picks by data_source, else a name as in data.reward.")
    max_calls_per_turn: int = Field(4, ge=1, description="Calls run per turn; later ones get an error result.")
    max_result_chars: int = Field(1000, ge=1, description="A tool result is cut to this many characters.")
    timeout_s: float = Field(2.0, gt=0, description="The sandbox's wall-clock limit per call.")
    memory_mb: int = Field(256, ge=16, description="The sandbox's address-space limit per process.")
    max_output_bytes: int = Field(4096, ge=1, description="The sandbox's output limit per call.")
    max_processes: int = Field(16, ge=1, description="The sandbox's process limit.")
    unsafe_no_sandbox: bool = Field(False, description="Run tools without the OS sandbox (warns).")

    def limits(self) -> dict[str, Any]:
        return self.model_dump(include={"timeout_s", "memory_mb", "max_output_bytes", "max_processes",
                                        "unsafe_no_sandbox"})


def tool_schemas(names: list[str]) -> list[dict[str, Any]]:
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        raise ValueError(f"roles.rollout.env_options.tools: unknown tool {unknown[0]!r}; registered: {sorted(TOOLS)}")
    return [TOOLS[n].tool.schema() for n in names]


def tool_messages(messages: Messages, tools: list[str], tool_format: str = "hermes") -> Messages:
    """`messages` with the format's tool instructions in the system message (added first when there is none)."""
    tool_schemas(tools)
    text = get_format(tool_format).instructions([TOOLS[n].tool for n in tools])
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def tool_prompt(tokenizer: Any, messages: Messages, tools: list[str], tool_format: str = "hermes") -> list[int]:
    """Prompt ids: the template's own `tools` rendering when it has one, else `tool_messages` (module doc)."""
    plain = render_chat(tokenizer, messages, True)
    listed = list(tokenizer.apply_chat_template(messages, tools=tool_schemas(tools), tokenize=True,
                                                add_generation_prompt=True, return_dict=False))
    return listed if listed != plain else render_chat(tokenizer, tool_messages(messages, tools, tool_format), True)


class ChatToolEnv:
    """One episode of tool use in chat messages (module doc); options: ChatToolEnvConfig."""

    def __init__(self, tokenizer: Any, **options: Any):
        try:
            self.config = ChatToolEnvConfig(**options)
        except ValidationError as err:
            raise ValueError("; ".join(f"roles.rollout.env_options.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                       for e in err.errors())) from None
        tool_schemas(self.config.tools)
        self.format = get_format(self.config.tool_format)
        self.tokenizer, self.eos = tokenizer, tokenizer.eos_token_id
        self.head = render_chat(tokenizer, STAND_IN, True)
        self.messages: Messages = []
        self.tail: list[int] = []  # every sampled turn and observation so far, as the context holds them
        self.meta: dict[str, Any] = {}

    def reset(self, prompt_ids: list[int], meta: dict[str, Any]) -> None:
        self.messages, self.tail, self.meta = [], [], meta

    def step(self, turn_ids: list[int]) -> EnvStep:
        closed = bool(turn_ids) and turn_ids[-1] == self.eos
        text = self.tokenizer.decode(turn_ids[:-1] if closed else turn_ids)
        self.messages.append({"role": "assistant", "content": text})
        calls = self.format.parse(text)
        if calls == []:
            return EnvStep(reward=self.score(text), done=True)
        results, error = self._run(calls)
        self.messages += [{"role": "tool", "content": result} for result in results]
        observation = self.observation(turn_ids, closed, num_results=len(results))
        if isinstance(observation, str):
            return EnvStep(done=True, error=observation)
        self.tail += list(turn_ids) + observation
        return EnvStep(observation_ids=observation, error=error)

    def observation(self, turn_ids: list[int], closed: bool, num_results: int) -> list[int] | str:
        """The tokens the template adds after the sampled turn, or a one-line continuity error (module doc)."""
        turn = len(self.messages) - num_results
        upto = render_chat(self.tokenizer, STAND_IN + self.messages[:turn], False)
        ends = [i for i, t in enumerate(upto) if t == self.eos and i >= len(self.head)]
        if not ends:
            return f"token continuity: the chat template puts no eos (id {self.eos}) after an assistant turn"
        prefix = upto[:ends[-1] + 1]
        pending = [] if closed else [self.eos]
        sampled = self.head + self.tail + list(turn_ids) + pending
        if prefix != sampled:
            return f"token continuity: {self._first_difference(sampled, prefix)}"
        after = render_chat(self.tokenizer, STAND_IN + self.messages, True)
        if after[:len(prefix)] != prefix:
            return (f"token continuity: the chat template renders turn {self._turns()} differently once tool results "
                    f"follow (it rewrites earlier turns)")
        return pending + after[len(prefix):]

    def score(self, text: str) -> float:
        """The final answer's reward: the row's scorer when it has a ground_truth, else its `answer`'s last integer."""
        meta = self.meta
        if "ground_truth" not in meta:
            return answer_score(text, meta.get("answer", ""), last=True)
        source = str(meta.get("data_source", ""))
        name = scorer_name(source, self.config.reward)
        if name is None:
            raise ValueError(f"roles.rollout.env_options.reward: no built-in scorer for data_source {source!r}; "
                             f"name one (e.g. 'gsm8k')")
        extra = meta.get("extra_info")
        extra = json.loads(extra) if isinstance(extra, str) and extra else extra
        return float(resolve(name)(source, text, str(meta["ground_truth"]), extra))

    def _run(self, calls: list[ToolCall] | str) -> tuple[list[str], str]:
        """Each call's result text (an error as "error: ..."), and the step's first error."""
        if isinstance(calls, str):
            return [f"error: {calls}"], calls
        results, errors = [], []
        for i, call in enumerate(calls):
            if i >= self.config.max_calls_per_turn:
                result = ToolResult("", f"more than {self.config.max_calls_per_turn} tool calls in one turn")
            elif call.name not in self.config.tools:
                result = ToolResult("", f"unknown tool {call.name!r}; tools: {', '.join(self.config.tools)}")
            else:
                result = TOOLS[call.name].run(call.arguments, self.config.limits())
            errors += [result.error] if result.error else []
            text = f"error: {result.error}" if result.error else result.output.strip()
            results.append(text[:self.config.max_result_chars])
        return results, errors[0] if errors else ""

    def _turns(self) -> int:
        return sum(m["role"] == "assistant" for m in self.messages)

    def _first_difference(self, sampled: list[int], rendered: list[int]) -> str:
        at = next((i for i, (a, b) in enumerate(zip(sampled, rendered)) if a != b), min(len(sampled), len(rendered)))
        start = len(self.head)
        return (f"the chat template re-tokenizes turn {self._turns()} differently from the context at token "
                f"{at - start} after the prompt (context {self.tokenizer.convert_ids_to_tokens(sampled[at:at + 4])}, "
                f"template {self.tokenizer.convert_ids_to_tokens(rendered[at:at + 4])})")
