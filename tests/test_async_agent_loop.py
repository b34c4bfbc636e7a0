"""The async agent loop (one coroutine per episode over a StreamingEngine): the batch loop's rows, tools that run
while other episodes generate, a hanging tool cut off alone, the python sandbox through it."""

import asyncio
import string
import threading
import time

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.data.isolation import bwrap
from flowrl.data.builtin.calculator import CalculatorEnv, CalculatorTask
from flowrl.data.multiturn.envs import EnvSpec, EnvStep
from flowrl.engines.agents.loop import run_episodes
from flowrl.engines.agents.async_loop import play_episodes, run_episodes_async
from flowrl.engines.configs import ModelSource
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.streaming.protocol import Sample
from flowrl.engines.models.tiny_model import build_char_tokenizer, build_tiny_model
from flowrl.roles import Rollout
from flowrl.roles.configs import RolloutConfig
from test_multiturn import calculator_prompts

CALC = build_char_tokenizer(CalculatorTask.chars)
EOS = CALC.eos_token_id
PATTERNS = ["=", "+1=", "7", "123", "1=", "*2=", "3"]  # turns; "=" presses the calculator, the rest answer


def policy(context: list[int], max_new_tokens: int) -> tuple[list[int], list[float], FinishReason]:
    """A deterministic turn for a context: its last token copied (the answer, when the calculator just showed the
    result) or one of PATTERNS (eos after the short ones), cut to max_new_tokens."""
    h = sum((i + 1) * t for i, t in enumerate(context))
    text = PATTERNS[h % len(PATTERNS)]
    ids = [context[-1], EOS] if h % 3 == 0 and context[-1] != EOS else \
        CALC.encode(text) + ([EOS] if len(text) < 3 else [])
    ids = ids[:max_new_tokens]
    return ids, [-0.1 * (h % 5 + 1) - 0.01 * j for j in range(len(ids))], \
        FinishReason.STOP if ids[-1] == EOS else FinishReason.LENGTH


class BatchPolicy:
    """The RolloutEngine of `policy`: row by row over the left-padded contexts."""

    def generate(self, prompt_ids_BP, prompt_mask_BP, params, *, seed=None):
        turns = [policy(ids[mask.bool()].tolist(), params.max_new_tokens) for ids, mask in
                 zip(prompt_ids_BP, prompt_mask_BP)]
        width = max(len(ids) for ids, _, _ in turns)
        pad = [width - len(ids) for ids, _, _ in turns]
        return TensorDict(response_ids=torch.tensor([ids + [0] * p for (ids, _, _), p in zip(turns, pad)]),
                          response_mask=torch.tensor([[1] * len(ids) + [0] * p for (ids, _, _), p in zip(turns, pad)]),
                          rollout_logprobs=torch.tensor([lp + [0.0] * p for (_, lp, _), p in zip(turns, pad)]),
                          finish_reason=torch.tensor([int(f) for _, _, f in turns]), batch_size=[len(turns)])


class StreamPolicy:
    """The StreamingEngine of `policy`: each sample takes `delay_s`; `timeline` holds (row's prompt, start, end)."""

    def __init__(self, delay_s: float = 0.0, version: int = 3, answer=policy):
        self.delay_s, self.version, self.answer, self.timeline = delay_s, version, answer, []

    async def sample(self, request):
        start = time.perf_counter()
        await asyncio.sleep(self.delay_s)
        ids, logprobs, finish = self.answer(list(request.prompt_ids), request.params.max_new_tokens)
        self.timeline.append((request.prompt_ids[0], start, time.perf_counter()))
        return Sample(request, ids, logprobs, [self.version] * len(ids), finish)


def calculator_episodes(rows=12):
    task = CalculatorTask(max_operand=9)
    examples = [task.example(1, i) for i in range(rows)]
    envs = [CalculatorEnv(CALC) for _ in examples]
    prompts = [CALC.encode(text) for text, _ in examples]
    for env, prompt, (_, meta) in zip(envs, prompts, examples):
        env.reset(prompt, meta)
    return envs, prompts


def test_the_async_loop_plays_the_batch_loops_episodes_on_the_calculator():
    finishes = set()
    for max_total_tokens in (10, 15):  # 10: turns cut by the budget (one at exactly the budget left, no eos)
        limits = dict(params=SamplingParams(max_new_tokens=3), max_turns=3, max_total_tokens=max_total_tokens,
                      pad_id=0)
        batch, batch_stats = run_episodes(BatchPolicy(), *calculator_episodes(), **limits)
        out, stats = run_episodes_async(StreamPolicy(), *calculator_episodes(), **limits, step_timeout_s=30)
        for key in ("response_ids", "response_mask", "loss_mask", "rollout_logprobs", "finish_reason", "scores",
                    "num_turns"):
            assert torch.equal(out[key], batch[key]), key
        assert stats["tool_error"] == batch_stats["tool_error"] and stats["tool_calls"] == batch_stats["tool_calls"]
        assert sum(stats["tool_calls"]) >= 5 and out["scores"].max() == 1.0
        # the version of each turn token; -1 on observations and padding
        assert torch.equal(out["token_versions"], torch.where(out["loss_mask"].bool(), 3, -1))
        finishes |= set(out["finish_reason"].tolist())
    assert finishes == {FinishReason.STOP, FinishReason.MAX_TOKENS, FinishReason.MAX_TURNS}  # every way to end


class SleepyEnv:
    """Observes [5] after `calls` steps that each sleep (row + 1) / 10 s, then is done (reward 1); records its steps."""

    def __init__(self, row, timeline, calls=2):
        self.row, self.sleep_s, self.timeline, self.calls = row, 0.1 * (row + 1), timeline, calls

    def reset(self, prompt_ids, meta):
        pass

    def step(self, turn_ids):
        if self.calls == 0:
            return EnvStep(reward=1.0, done=True)
        start = time.perf_counter()
        time.sleep(self.sleep_s)
        self.calls -= 1
        self.timeline.append((self.row, start, time.perf_counter()))
        return EnvStep(observation_ids=[5])


def short_turn(context, max_new_tokens):
    return [4, EOS], [-0.5, -0.5], FinishReason.STOP


def test_tools_run_while_other_episodes_generate_and_the_call_takes_the_longest_episode_not_the_sum():
    steps = []
    engine = StreamPolicy(delay_s=0.01, answer=short_turn)
    envs = [SleepyEnv(row, steps) for row in range(4)]
    start = time.perf_counter()
    out, stats = run_episodes_async(engine, envs, [[row] for row in range(4)], SamplingParams(max_new_tokens=2),
                                    max_turns=3, max_total_tokens=16, pad_id=0, env_workers=4)
    elapsed = time.perf_counter() - start
    assert out["scores"].tolist() == [1.0] * 4 and out["num_turns"].tolist() == [3] * 4
    assert elapsed < 1.3, elapsed  # the longest episode's tools: 2 x 0.4 s; one after another: 2 s
    _, slow_start, slow_end = next(s for s in steps if s[0] == 3)  # row 3's first tool call
    served = [row for row, begin, end in engine.timeline if slow_start < begin and end < slow_end]
    assert served.count(0) == 2 and 1 in served, engine.timeline  # row 0 played its 2nd and 3rd turns meanwhile
    assert stats["timing_s/env"] < elapsed and stats["timing_s/env"] > 0.7  # wall time with a tool running


class HangingEnv:
    """Row 1's step blocks until `release` is set; the others answer (reward 1, done) at once."""

    def __init__(self, row, release):
        self.row, self.release = row, release

    def reset(self, prompt_ids, meta):
        pass

    def step(self, turn_ids):
        if self.row == 1:
            self.release.wait()
        return EnvStep(observation_ids=[6]) if turn_ids[0] == 4 else EnvStep(reward=1.0, done=True)


def test_a_hanging_tool_is_cut_off_with_a_tool_error_and_the_other_episodes_finish():
    release = threading.Event()
    engine = StreamPolicy(answer=lambda context, n: ([4 if context[-1] != 6 else 7, EOS], [-1.0, -1.0],
                                                     FinishReason.STOP))
    start = time.perf_counter()
    try:
        out, stats = asyncio.run(play_episodes(engine, [HangingEnv(row, release) for row in range(3)], [[0], [1], [2]],
                                               SamplingParams(max_new_tokens=2), max_turns=3, max_total_tokens=16,
                                               pad_id=0, step_timeout_s=0.3))
    finally:
        release.set()  # lets the abandoned thread end
    assert time.perf_counter() - start < 2.0
    assert stats["tool_error"] == ["", "environment step timed out after 0.3 s", ""]
    assert out["scores"].tolist() == [1.0, 0.0, 1.0] and out["num_turns"].tolist() == [2, 1, 2]
    assert out["finish_reason"].tolist() == [FinishReason.STOP] * 3
    # the other episodes played both their turns while row 1's step hung
    assert max(end for row, _, end in engine.timeline if row != 1) < start + 0.3


@pytest.mark.skipif(bool(bwrap.problem()), reason=f"no sandbox here: {bwrap.problem()}")
def test_the_python_sandbox_answers_through_the_async_loop():
    tokenizer = build_char_tokenizer(string.printable.replace("\x0b", "").replace("\x0c", ""))
    code = ["```python\nprint(6 * 7)\n```", "```python\n1 / 0\n```"]

    def answer(context, max_new_tokens):
        asked = tokenizer.decode(context)
        text = code[int(asked[-1])] if asked[-1] in "01" else "42"
        ids = tokenizer.encode(text) + [tokenizer.eos_token_id]
        return ids, [-1.0] * len(ids), FinishReason.STOP

    spec = EnvSpec("python", {"timeout_s": 2.0, "max_observation_tokens": 64}, max_turns=2, max_total_tokens=200)
    envs = [spec.make(tokenizer) for _ in range(2)]
    prompts = [tokenizer.encode(f"6*7? {row}") for row in range(2)]
    for env, prompt in zip(envs, prompts):
        env.reset(prompt, {"answer": "42"})
    out, stats = run_episodes_async(StreamPolicy(answer=answer), envs, prompts, SamplingParams(max_new_tokens=64),
                                    max_turns=2, max_total_tokens=200, pad_id=0, step_timeout_s=30)
    observations = [tokenizer.decode(ids[(loss == 0) & (mask == 1)].tolist()) for ids, loss, mask in
                    zip(out["response_ids"], out["loss_mask"], out["response_mask"])]
    assert observations == ["output: 42\n", "error: ZeroDivisionError: division by zero\n"]
    assert stats["tool_error"] == ["", "ZeroDivisionError: division by zero"]
    assert out["scores"].tolist() == [1.0, 1.0] and out["num_turns"].tolist() == [2, 2]


def test_interact_plays_coroutine_episodes_through_the_threaded_streamer_keeping_the_samplers_logprobs(tmp_path):
    """roles.rollout.async_episodes on the tiny model: the `hf` engine as a ThreadedStreamer; the train engine's
    logprobs of the model's turns, read in one pass over each episode, equal the sampler's."""
    path = build_tiny_model(tmp_path / "model", chars=CalculatorTask.chars)
    section = RolloutConfig.model_validate({"engine": "hf", "env": "calculator", "max_new_tokens": 3, "max_turns": 3,
                                            "max_total_tokens": 12, "async_episodes": True})
    tokenizer, actor = load_tokenizer(path), HFTrainEngine(load_causal_lm(path), HFTrainConfig(), kind="actor")
    engine = section.engine.build(ModelSource(path), tokenizer=tokenizer, device="cpu", share=actor)
    rollout = Rollout(engine=engine, params=section.engine.sampling(), env=section.env_spec(), tokenizer=tokenizer,
                      meta_keys=CalculatorTask.meta_keys, make_streamer=section.engine.streamer)
    try:
        batch = rollout.interact(calculator_prompts(tokenizer), n=4)
    finally:
        rollout.close()
    assert rollout.streamer is not None and not rollout.streamer.thread.is_alive()  # used, and closed with the role
    assert (batch["num_turns"] > 1).any() and (batch["loss_mask"] < batch["response_mask"]).any()
    mask = batch["loss_mask"].bool()
    assert torch.allclose(actor.forward(batch)["logprobs"][mask], batch["rollout_logprobs"][mask], atol=1e-4)
    assert (batch["rollout_logprobs"][~mask] == 0).all()


class HungEngine:
    """A StreamingEngine that answers row 0's first turn and never row 1's."""

    def __init__(self):
        self.cancelled = 0

    async def sample(self, request):
        if request.prompt_ids[0] == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        await asyncio.sleep(0.5)  # row 0 is still sampling when row 1's deadline passes
        return Sample(request, [4, EOS], [-1.0, -1.0], [0, 0], FinishReason.STOP)


def test_a_hung_engine_fails_the_call_in_one_line_naming_the_setting():
    engine, start = HungEngine(), time.perf_counter()
    with pytest.raises(TimeoutError, match=r"^async agent loop: the rollout engine returned no sample within "
                                           r"roles\.rollout\.stream_timeout_s=0\.2s$"):
        run_episodes_async(engine, [HangingEnv(row, threading.Event()) for row in range(2)], [[0], [1]],
                           SamplingParams(max_new_tokens=2), max_turns=2, max_total_tokens=8, pad_id=0,
                           sample_timeout_s=0.2)
    assert time.perf_counter() - start < 0.45  # row 0's sample (0.5 s) was cancelled, not awaited
    assert engine.cancelled == 1
