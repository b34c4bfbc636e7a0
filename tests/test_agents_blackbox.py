"""Black-box agents (flowrl.roles.agents): programs drive episodes through the endpoint; the rows hold exactly
the sampled tokens with masks for the model's own; a hung or crashing agent ends its own episode, counted."""

import os
import sys
import time
from pathlib import Path

import pytest
import torch

from flowrl.engines.hf.configs import HFRolloutConfig, HFTrainConfig
from flowrl import metrics
from flowrl.config import load_run_config
from flowrl.data.batch import prompt_batch
from flowrl.engines.models.folders import load_causal_lm, load_tokenizer
from flowrl.engines.hf.rollout import HFRolloutEngine
from flowrl.engines.train.hf_engine import HFTrainEngine
from flowrl.engines.protocols import SamplingParams
from flowrl.engines.service.episodes import Call, episode_tokens
from flowrl.engines.protocols import FinishReason
from flowrl.engines.streaming.thread_streamer import ThreadedStreamer
from flowrl.graph.context import CallInfo, calling
from flowrl.roles import Rollout
from flowrl.roles.agents import AgentSpec
from flowrl.runtime.trainer import train

import agent_programs

HERE = Path(__file__).parent
PARAMS = SamplingParams(max_new_tokens=3)


def rollout_with(model_path, spec):
    tokenizer = load_tokenizer(model_path)
    engine = HFRolloutEngine(load_causal_lm(model_path), tokenizer, HFRolloutConfig())
    return Rollout(engine=engine, params=PARAMS, agent=spec, tokenizer=tokenizer, pad_id=tokenizer.pad_token_id,
                   make_streamer=lambda e: ThreadedStreamer(e, pad_id=tokenizer.pad_token_id))


def prompts(tokenizer, texts=("12+3=", "7*8=")):
    return prompt_batch([tokenizer.encode(t) for t in texts], tokenizer.pad_token_id, range(len(texts)))


def play(rollout, batch, n=2):
    with calling(CallInfo(step=0, call=0)):
        return rollout.agents(batch, n=n)


def test_chained_calls_become_one_row_with_the_clients_tokens_out_of_the_loss():
    calls = [Call((5, 6), (7, 8), (-0.1, -0.2), (3, 3), FinishReason.STOP),
             Call((5, 6, 7, 8, 15), (9,), (-0.3,), (4,), FinishReason.LENGTH)]
    row = episode_tokens(calls, [1])
    # prompt 5 6 | 7 8 (sampled) | 15 (client) | 9 (sampled)
    assert row.prompt == [5, 6] and row.ids == [7, 8, 15, 9] and row.loss == [1, 1, 0, 1]
    assert row.logprobs == [-0.1, -0.2, 0.0, -0.3] and row.versions == [3, 3, -1, 4]
    assert row.finish == FinishReason.LENGTH and row.calls == 2 and row.unchained == 0
    broken = episode_tokens([calls[0], Call((5, 9), (2,), (-0.5,), (4,), FinishReason.STOP)], [1])
    assert broken.prompt == [5, 9] and broken.ids == [2] and broken.unchained == 1  # the last chain is kept
    assert episode_tokens([], [4, 4]).prompt == [4, 4] and episode_tokens([], [4, 4]).ids == []


def test_agent_rows_train_on_exactly_the_sampled_tokens(tiny_model_path):
    rollout = rollout_with(tiny_model_path, AgentSpec("agent_programs:two_calls", max_total_tokens=16))
    equals = rollout.tokenizer.encode("=")
    try:
        batch = play(rollout, prompts(rollout.tokenizer))
    finally:
        rollout.close()
    assert batch.batch_size[0] == 4 and (batch["num_turns"] == 2).all()
    for row in range(4):
        loss, mask = batch["loss_mask"][row], batch["response_mask"][row]
        ids = batch["response_ids"][row][mask.bool()].tolist()
        assert equals[0] in ids and (loss[mask.bool()] == 0).sum() == 1  # the client's "="
    actor = HFTrainEngine(load_causal_lm(tiny_model_path), HFTrainConfig(), kind="actor")
    logprobs = actor.forward(batch)["logprobs"]
    sampled = batch["loss_mask"].bool()
    assert torch.allclose(logprobs[sampled], batch["rollout_logprobs"][sampled], atol=1e-4)
    assert (batch["rollout_logprobs"][~sampled] == 0).all()
    assert ((batch["token_versions"] == 0) == sampled).all()
    assert set(batch["scores"].tolist()) <= {0.0, 1.0}


def test_a_hung_or_crashing_agent_ends_its_own_episode_within_the_deadline(tiny_model_path):
    spec = AgentSpec("agent_programs:hangs_every_third", timeout_s=2.0, max_total_tokens=16)
    rollout = rollout_with(tiny_model_path, spec)
    try:
        with metrics.collect() as logged:
            batch = play(rollout, prompts(rollout.tokenizer, ("1+1=", "2+2=")), n=2)
        assert logged["agent/timed_out"] == 2  # rows 0 and 3
        errors = list(batch["tool_error"])
        assert [bool(e) for e in errors] == [True, False, False, True] and "agent_timeout_s=2" in errors[0]
        assert batch["scores"][0] == 0 and batch["num_turns"][0] == 1  # its one call before it hung
        crash = AgentSpec("agent_programs:crashes", max_total_tokens=16)
        rollout.agent, rollout.service.start_agent = crash, crash.runner()
        with metrics.collect() as logged:
            batch = play(rollout, prompts(rollout.tokenizer, ("3+3=",)), n=1)
        assert logged["agent/failed"] == 1 and "RuntimeError: the agent's own bug" in batch["tool_error"][0]
    finally:
        rollout.close()


HANG = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
CRASH = "import sys; print('the agent', 'crashed', file=sys.stderr); sys.exit(3)"


def gone(pid, within_s):
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_hung_or_crashing_agent_program_ends_its_own_episode_counted(tiny_model_path, tmp_path):
    hung = AgentSpec(command=(sys.executable, "-c", HANG, str(tmp_path / "pid")), timeout_s=5.0, max_total_tokens=16)
    rollout = rollout_with(tiny_model_path, hung)
    try:
        with metrics.collect() as logged:
            batch = play(rollout, prompts(rollout.tokenizer, ("1+1=",)), n=1)
        assert logged["agent/timed_out"] == 1 and logged["agent/failed"] == 0
        assert "agent_timeout_s=5" in batch["tool_error"][0] and batch["scores"][0] == 0
        assert gone(int((tmp_path / "pid").read_text()), within_s=30)  # its runner kills its process group
        crash = AgentSpec(command=(sys.executable, "-c", CRASH), max_total_tokens=16)
        rollout.agent, rollout.service.start_agent = crash, crash.runner()
        with metrics.collect() as logged:
            batch = play(rollout, prompts(rollout.tokenizer, ("3+3=",)), n=1)
        assert logged["agent/failed"] == 1 and logged["agent/timed_out"] == 0
        assert batch["tool_error"][0] == "agent exited 3: the agent crashed" and batch["scores"][0] == 0
    finally:
        rollout.close()


def test_an_engine_failure_stops_the_episodes_and_the_step(tiny_model_path):
    """The endpoint answers 500 then 503 (tests/test_service_endpoint.py); the role raises the engine's error."""
    from test_service_endpoint import DiesAfter

    tokenizer = load_tokenizer(tiny_model_path)
    rollout = Rollout(engine=HFRolloutEngine(load_causal_lm(tiny_model_path), tokenizer, HFRolloutConfig()), params=PARAMS,
                      agent=AgentSpec("agent_programs:two_calls", max_total_tokens=16), tokenizer=tokenizer,
                      pad_id=tokenizer.pad_token_id, make_streamer=lambda e: DiesAfter(good=1))
    try:
        with pytest.raises(RuntimeError, match="the rollout engine failed while serving agent episodes: "
                                               "RuntimeError: worker 3 died"):
            play(rollout, prompts(tokenizer), n=1)
    finally:
        rollout.close()


def test_an_outside_process_over_plain_http(tiny_model_path):
    spec = AgentSpec(command=(sys.executable, str(HERE / "agent_programs.py")), max_total_tokens=16)
    rollout = rollout_with(tiny_model_path, spec)
    try:
        batch = play(rollout, prompts(rollout.tokenizer), n=1)
    finally:
        rollout.close()
    lengths = batch["loss_mask"].sum(-1)
    assert (lengths > 0).all() and torch.equal(batch["scores"], lengths.float())  # it printed its reply's length
    assert list(batch["tool_error"]) == ["", ""]


def test_grpo_trains_on_agent_episodes(tmp_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "algorithm=agent_programs:grpo_agent",
                                 "roles.rollout.agent=agent_programs:two_calls", "roles.rollout.max_new_tokens=3",
                                 "roles.rollout.max_total_tokens=16", "train.steps=2", "train.batch_size=2",
                                 "algo.group_size=2", "checkpoint.every=0", "checkpoint.export=false"])
    history = train(cfg, progress=False)
    assert len(history) == 2 and all(row["agent/calls/mean"] == 2 for row in history)
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in history if "loss" in row)
