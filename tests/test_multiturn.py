"""Multi-turn episodes: the agent loop over any rollout engine, the calculator and python tools, multi-turn GRPO."""

import string

import pytest
import torch
from tensordict import TensorDict

from flowrl.engines.hf.configs import HFTrainConfig
from flowrl.config import load_run_config
from flowrl.data.batch import prompt_batch
from flowrl.data.builtin.calculator import CalculatorTask
from flowrl.data.multiturn.envs import EnvSpec, EnvStep
from flowrl.engines.agents.loop import run_episodes
from flowrl.engines.configs import ModelSource
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.models.tiny_model import build_char_tokenizer, build_tiny_model
from flowrl.roles import Rollout
from flowrl.roles.configs import RolloutConfig
from flowrl.runtime.trainer import setup, train

EOS = 1


class ScriptedEngine:
    """Row i of the k-th call answers script[k][i]'s ids (then eos); records every context it was given."""

    def __init__(self, turns):
        self.turns, self.contexts = turns, []

    def generate(self, prompt_ids_BP, prompt_mask_BP, params, *, seed=None):
        self.contexts.append([ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids_BP, prompt_mask_BP)])
        rows = [self.turns[len(self.contexts) - 1][i][:params.max_new_tokens] for i in range(len(prompt_ids_BP))]
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return TensorDict(response_ids=ids, response_mask=mask, rollout_logprobs=-0.5 * mask.float(),
                          finish_reason=torch.zeros(len(rows), dtype=torch.long), batch_size=[len(rows)])


class EchoEnv:
    """Observes [50, 51] after each turn; done (reward 1) when a turn starts with 9."""

    def reset(self, prompt_ids, meta):
        self.prompt = prompt_ids

    def step(self, turn_ids):
        if turn_ids[0] == 9:
            return EnvStep(reward=1.0, done=True)
        return EnvStep(observation_ids=[50, 51], reward=0.25, error="boom" if turn_ids[0] == 7 else "")


def test_turns_and_observations_interleave_with_observations_out_of_the_loss():
    engine = ScriptedEngine([[[5, EOS], [7, EOS], [5] * 6], [[9, EOS], [5, EOS]]])
    out, stats = run_episodes(engine, [EchoEnv() for _ in range(3)], [[2, 3], [4], [6]],
                              SamplingParams(max_new_tokens=6), max_turns=3, max_total_tokens=8, pad_id=0)
    assert out["response_ids"][0].tolist() == [5, EOS, 50, 51, 9, EOS, 0, 0]
    assert out["loss_mask"][0].tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    assert out["response_mask"][0].tolist() == [1] * 6 + [0, 0]
    assert out["rollout_logprobs"][0].tolist() == [-0.5, -0.5, 0, 0, -0.5, -0.5, 0, 0]
    # token in, token out: each turn's context is the prompt and the response so far, never re-encoded
    assert engine.contexts[1][0] == [2, 3, 5, EOS, 50, 51] and engine.contexts[1][1] == [4, 7, EOS, 50, 51]
    # rows 1 and 2 fill the 8-token budget with an observation
    assert out["response_ids"][1].tolist() == [7, EOS, 50, 51, 5, EOS, 50, 51]
    assert out["response_ids"][2].tolist() == [5] * 6 + [50, 51] and len(engine.contexts) == 2
    assert out["finish_reason"].tolist() == [FinishReason.STOP, FinishReason.MAX_TOKENS, FinishReason.MAX_TOKENS]
    assert out["scores"].tolist() == [1.25, 0.5, 0.25] and out["num_turns"].tolist() == [2, 2, 1]
    assert stats["tool_error"] == ["", "boom", ""]


def test_a_turn_limit_and_a_turn_cut_by_the_budget_are_finish_reasons():
    engine = ScriptedEngine([[[5, EOS], [9, EOS], [5]], [[5, 5], [9, EOS]]])
    out, _ = run_episodes(engine, [EchoEnv() for _ in range(3)], [[2], [2], [2]], SamplingParams(max_new_tokens=8),
                          max_turns=2, max_total_tokens=5, pad_id=0)
    # row 0 has 1 token of budget left for its second turn: the turn is cut there and not sent
    assert out["response_ids"][0].tolist() == [5, EOS, 50, 51, 5] and out["loss_mask"][0].tolist() == [1, 1, 0, 0, 1]
    assert out["finish_reason"].tolist() == [FinishReason.MAX_TOKENS, FinishReason.STOP, FinishReason.STOP]
    assert out["num_turns"].tolist() == [2, 1, 2] and out["scores"].tolist() == [0.25, 1.0, 1.25]
    engine = ScriptedEngine([[[5, EOS]], [[5, EOS]]])
    out, _ = run_episodes(engine, [EchoEnv()], [[2]], SamplingParams(), max_turns=2, max_total_tokens=32, pad_id=0)
    assert out["finish_reason"].tolist() == [FinishReason.MAX_TURNS] and out["loss_mask"].sum() == 4


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("calc") / "model", chars=CalculatorTask.chars)


def calculator_rollout(path, engine_name, share=None, extra=None):
    section = RolloutConfig.model_validate(  # the rollout role's section: its engine and its environment
        {"engine": engine_name, "env": "calculator", "max_new_tokens": 3, "max_turns": 3, "max_total_tokens": 12,
         **(extra or {})})
    tokenizer = load_tokenizer(path)
    engine = section.engine.build(ModelSource(path), tokenizer=tokenizer, device="cpu", share=share)
    return Rollout(engine=engine, params=section.engine.sampling(), env=section.env_spec(), tokenizer=tokenizer,
                   meta_keys=CalculatorTask.meta_keys)


def calculator_prompts(tokenizer, rows=8):
    task = CalculatorTask(max_operand=9)
    examples = [task.example(0, i) for i in range(rows)]
    return prompt_batch([tokenizer.encode(p) for p, _ in examples], tokenizer.pad_token_id, range(rows),
                        {"answer": [m["answer"] for _, m in examples]})


@pytest.mark.parametrize("engine_name", ["hf", "hf_static"])
def test_episodes_on_a_real_engine_keep_the_samplers_logprobs_of_exactly_what_was_sampled(calculator_model,
                                                                                          engine_name):
    """The train engine's logprobs of the model's turns, read in one pass over the whole episode, equal the
    sampler's: nothing was retokenised, and observations sit in the context where the sampler saw them."""
    actor = HFTrainEngine(load_causal_lm(calculator_model), HFTrainConfig(), kind="actor")
    rollout = calculator_rollout(calculator_model, engine_name, share=actor)
    batch = rollout.interact(calculator_prompts(rollout.tokenizer), n=4)
    assert (batch["num_turns"] > 1).any() and (batch["loss_mask"] < batch["response_mask"]).any()
    logprobs = actor.forward(batch)["logprobs"]
    mask = batch["loss_mask"].bool()
    assert torch.allclose(logprobs[mask], batch["rollout_logprobs"][mask], atol=1e-4)
    assert (batch["rollout_logprobs"][~mask] == 0).all()
    assert set(batch.keys()) >= {"scores", "num_turns", "tool_error", "policy_version", "group"}


def test_episodes_on_vllm_keep_the_samplers_logprobs(tmp_path):
    pytest.importorskip("vllm")
    path = build_tiny_model(tmp_path / "model", chars=CalculatorTask.chars, hidden_size=128)  # head_dim 32
    rollout = calculator_rollout(path, "vllm", extra={"kv_cache_gb": 0.25, "block_size": 32})
    batch = rollout.interact(calculator_prompts(rollout.tokenizer), n=4)
    actor = HFTrainEngine(load_causal_lm(path), HFTrainConfig(), kind="actor")
    mask = batch["loss_mask"].bool()
    assert (batch["num_turns"] > 1).any()
    assert torch.allclose(actor.forward(batch)["logprobs"][mask], batch["rollout_logprobs"][mask], atol=1e-4)


class PythonScript:
    """One turn per row: python code that finishes, hangs, crashes or prints megabytes; then the answer."""

    CODE = ["print(6 * 7)", "while True: pass", "import sys; sys.exit(2)", "print('x' * 10**7)"]

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = 0

    def generate(self, prompt_ids_BP, prompt_mask_BP, params, *, seed=None):
        self.calls += 1
        texts = [f"```python\n{code}\n```" for code in self.CODE] if self.calls == 1 else ["42"] * 4
        ids = [self.tokenizer.encode(t) + [self.tokenizer.eos_token_id] for t in texts]
        width = max(map(len, ids))
        ids_BR = torch.tensor([r + [0] * (width - len(r)) for r in ids])
        mask = (torch.arange(width) < torch.tensor([len(r) for r in ids])[:, None]).long()
        return TensorDict(response_ids=ids_BR, response_mask=mask, rollout_logprobs=-mask.float(),
                          finish_reason=torch.zeros(4, dtype=torch.long), batch_size=[4])


def test_a_tool_that_hangs_crashes_or_floods_is_cut_off_with_a_named_error_and_the_episode_goes_on():
    tokenizer = build_char_tokenizer(string.printable.replace("\x0b", "").replace("\x0c", ""))
    env = EnvSpec("python", {"timeout_s": 0.5, "max_output_bytes": 1024}, max_turns=2, max_total_tokens=200)
    rollout = Rollout(engine=PythonScript(tokenizer), params=SamplingParams(max_new_tokens=64), env=env,
                      tokenizer=tokenizer, meta_keys=("answer",))
    prompts = prompt_batch([tokenizer.encode("6*7?")] * 4, tokenizer.pad_token_id, range(4), {"answer": ["42"] * 4})
    batch = rollout.interact(prompts)
    assert batch["tool_error"].tolist() == ["", "timeout after 0.5s", "exit 2", "output over 1024 bytes"]
    assert batch["scores"].tolist() == [1.0] * 4 and batch["num_turns"].tolist() == [2] * 4  # every episode answered
    observations = [tokenizer.decode(ids[(loss == 0) & (mask == 1)].tolist()) for ids, loss, mask in
                    zip(batch["response_ids"], batch["loss_mask"], batch["response_mask"])]
    assert observations[0] == "output: 42\n" and observations[1].startswith("error: timeout")


def test_bad_environment_settings_are_named(tmp_path):
    with pytest.raises(ValueError, match="roles.rollout.env: Value error, unknown 'nope'"):
        load_run_config(None, ["roles.rollout.env=nope"])
    with pytest.raises(ValueError, match="rollout.env_options: 'calculator' refused"):
        EnvSpec("calculator", {"timeout": 1}).make(build_char_tokenizer("0123"))
    rollout = Rollout(engine=None, params=SamplingParams())
    with pytest.raises(ValueError, match="set roles.rollout.env"):
        rollout.interact(prompt_batch([[2]], 0, [0]))
    unused = load_run_config(None, [f"train.output_dir={tmp_path}", "roles.rollout.env=calculator",
                                    "task.name=calculator"])
    with pytest.warns(UserWarning, match="roles.rollout.env has no effect: algorithm 'grpo' never calls rollout.interact"):
        setup(unused).executor.close()


CALCULATOR = ["algorithm=grpo_multiturn", "task.name=calculator", "task.max_operand=9", "roles.rollout.env=calculator",
              "roles.rollout.max_new_tokens=1", "roles.rollout.max_turns=2", "checkpoint.every=0", "checkpoint.export=false"]


def test_multiturn_grpo_on_the_calculator_raises_reward_by_learning_to_use_the_tool(tmp_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", *CALCULATOR, "train.steps=25", "eval.every=25"])
    history = train(cfg, progress=False)
    rewards, calls = ([row[key] for row in history] for key in ("reward/mean", "env/tool_calls/mean"))
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, rewards
    assert sum(calls[-5:]) / 5 > sum(calls[:5]) / 5 + 0.3, calls  # it learned to press "=" and copy the result
    assert history[-1]["eval/reward/mean"] > 0.5
