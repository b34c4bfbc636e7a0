"""Every wait has a deadline (issue 29.2): each fault below ends within its configured timeout with one line
naming what did not answer, or scores 0 and is counted."""

import json
import os
import socket
import string
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import pytest
import torch
from tensordict import TensorDict

from flowrl import metrics
from flowrl.config import load_run_config
from flowrl.data.isolation import bwrap
from flowrl.data.builtin.calculator import PythonEnv
from flowrl.data.multiturn.envs import EnvStep
from flowrl.data.scoring.http_reward import HttpScorer
from flowrl.data.scoring.pool import Sample, ScoringPool
from flowrl.engines.agents.loop import run_episodes
from flowrl.engines.protocols import FinishReason, SamplingParams
from flowrl.engines.models.tiny_model import build_char_tokenizer
from flowrl.runtime import distributed
from flowrl.runtime.trainer import train
from reward_servers import serve


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", "eval.every=0", "checkpoint.export=false",
                                  "train.batch_size=4", *overrides])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def scorers(tmp_path):
    (tmp_path / "scorers.py").write_text(
        "import os, signal, time\n"
        "def hang(**_):\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    time.sleep(3600)\n"
        "def ok(**_):\n    return 1.0\n"
        "def die(**_):\n    os._exit(7)\n")
    return lambda name, where="row 0": Sample(f"{tmp_path / 'scorers.py'}:{name}", "src", "x", "x", None, where)


def test_a_scorer_that_never_returns_scores_zero_within_the_timeout_and_its_process_is_killed(scorers, caplog):
    pool = ScoringPool(num_workers=2, timeout_s=1.0)
    began = time.monotonic()
    with metrics.collect() as logged:
        assert pool.score([scorers("hang"), scorers("ok"), scorers("hang"), scorers("ok")]) == [0.0, 1.0, 0.0, 1.0]
    assert time.monotonic() - began < 4  # one round of 1 s per worker, not 1 s per sample in turn
    assert "2 of 4 samples ran past data.reward_timeout_s=1 and scored 0.0" in caplog.text
    assert logged["reward/timed_out"] == 2.0  # counted in the step's metrics
    assert pool.score([scorers("ok")] * 6) == [1.0] * 6  # the replaced workers score the next batch at once
    pids = [w.process.pid for w in pool._workers]
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_scorer_that_kills_its_process_is_one_line_naming_the_row(scorers):
    with pytest.raises(ValueError, match=r"scorers.py:die' failed on row 3 .*its scoring process died \(exit code 7\)"):
        ScoringPool(num_workers=1, timeout_s=5.0).score([scorers("die", "row 3")])


def test_a_task_reward_function_that_hangs_stops_the_run_in_one_line(tmp_path):
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^reward function HangingReward.reward \(data.reward_fn_timeout_s\) did "
                                           r"not return within 1 s; the run stops here"):
        train(config(tmp_path, "train.steps=1", "task.name=broken_tasks:HangingReward",
                     "data.reward_fn_timeout_s=1"), progress=False)
    assert time.monotonic() - began < 60


def test_a_reward_server_that_trickles_its_answer_hits_the_total_deadline():
    def trickle(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        for _ in range(100):
            handler.wfile.write(b" ")
            handler.wfile.flush()
            time.sleep(0.1)

    with serve(trickle) as url:
        began = time.monotonic()
        with pytest.raises(ValueError, match=r"1 attempts failed, the last with TimeoutError: the answer took longer "
                                             r"than data.reward_timeout_s"):
            HttpScorer(url, timeout_s=1.0, attempts=1).score([Sample("x", "src", "x", "x", None, "row 0")])
        assert time.monotonic() - began < 2.5  # each read came within the socket timeout


def test_a_ray_address_nothing_listens_on_is_one_line_at_once(monkeypatch):
    from flowrl.runtime.ray.executor import init_ray

    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    began = time.monotonic()
    with pytest.raises(ValueError, match=r"RAY_ADDRESS '127.0.0.1:\d+': no Ray cluster answers there within 15 s "
                                         r"\(Connection refused\)"):
        init_ray()
    assert time.monotonic() - began < 15


@pytest.mark.parametrize("env, message", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, r"RANK=2 is outside WORLD_SIZE=2: ranks are 0..1"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, r"RANK='x', WORLD_SIZE='2': expected whole numbers"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, r"MASTER_ADDR is not set"),
])
def test_an_inconsistent_torchrun_environment_is_one_line(monkeypatch, env, message):
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        distributed.check_rendezvous(5.0)


def test_a_torchrun_master_nobody_listens_on_is_named_within_the_rendezvous_timeout(monkeypatch):
    port = free_port()
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"the torchrun master 127.0.0.1:{port} \(MASTER_ADDR:MASTER_PORT\) did "
                                           rf"not answer within executor.rendezvous_timeout_s=1"):
        distributed.check_rendezvous(1.0)
    assert time.monotonic() - began < 3


def test_prompts_all_longer_than_the_context_are_refused_at_load(tmp_path):
    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": "1+" * 100 + "1="}],
             "reward_model": {"ground_truth": "2"}, "extra_info": {}}] * 4
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"data.train_files: all 4 prompts are longer than the 62 tokens the model's "
                                         r"context leaves \(max_position_embeddings less roles.rollout.max_new_tokens=2\)"):
        train(config(tmp_path / "run", "train.steps=1", f"data.train_files={tmp_path / 'long.jsonl'}",
                     "data.reward=exact_match"), progress=False)


@pytest.mark.parametrize("overrides, message", [
    (["roles.rollout.max_lora_rank=8", "roles.actor.lora_rank=16"],
     r"^roles.actor.lora_rank=16 is above roles.rollout.max_lora_rank=8"),
    (["roles.rollout.max_lora_rank=8"], r"^roles.rollout.max_lora_rank=8 serves the actor's LoRA adapter, but "
                                        r"roles.actor.lora_rank is 0"),
    (["roles.rollout.max_lora_rank=12", "roles.actor.lora_rank=8"],
     r"^roles.rollout.max_lora_rank=12: vLLM takes one of \(1, 8, 16"),
])
def test_vllm_lora_options_that_contradict_each_other_are_refused_before_vllm_starts(tmp_path, overrides, message):
    """They failed after the first step (or in vLLM's start-up) before."""
    with pytest.raises(ValueError, match=message):
        train(config(tmp_path, "train.steps=1", "roles.rollout.engine=vllm", *overrides), progress=False)
    assert not (tmp_path / "tiny-model").exists()  # refused before any model was built


def test_a_reward_function_under_its_deadline_still_logs_into_the_step():
    from flowrl.data.scoring.pool import call_with_deadline

    with metrics.collect() as logged:
        assert call_with_deadline(lambda x: metrics.log("judge/calls", x) or x, (3.0,), 5.0, "f") == 3.0
    assert logged == {"judge/calls": 3.0}


def test_a_vllm_start_up_that_hangs_stops_the_run_in_one_line_within_the_timeout(tmp_path, monkeypatch):
    vllm_rollout = pytest.importorskip("flowrl.engines.vllm.rollout")
    started = []

    def hang(**_):  # a start-up that never ends (a stuck device, a lock held by a dead process, ...)
        started.append(time.monotonic())
        time.sleep(30)  # without the deadline the test fails after 30 s rather than hanging

    monkeypatch.setattr(vllm_rollout.vllm, "LLM", hang)
    with pytest.raises(TimeoutError, match=r"^vLLM did not start within 1 s \(roles.rollout.start_timeout_s\); the run "
                                           r"stops here"):
        train(config(tmp_path, "train.steps=1", "roles.rollout.engine=vllm", "model.tiny_hidden_size=128",
                     "roles.rollout.start_timeout_s=1"), progress=False)
    assert len(started) == 1 and time.monotonic() - started[0] < 3  # within the timeout (+2 s)
    assert not (tmp_path / "checkpoints").exists()  # nothing to resume from was written: a rerun starts afresh


class ScriptedEngine:
    """Row i of the k-th call answers turns[k][i] (the rows still playing, in order); logprobs -0.5."""

    def __init__(self, turns):
        self.turns, self.calls = turns, 0

    def generate(self, prompt_ids_BP, prompt_mask_BP, params, *, seed=None):
        rows = self.turns[self.calls][:len(prompt_ids_BP)]
        self.calls += 1
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return TensorDict(response_ids=ids, response_mask=mask, rollout_logprobs=-0.5 * mask.float(),
                          finish_reason=torch.zeros(len(rows), dtype=torch.long), batch_size=[len(rows)])


class HangsOnItsSecondStep:
    """Observes [50] after the first turn; its second step never returns (unless told to stop hanging)."""

    release = None  # a threading.Event the test sets at its end, so the abandoned thread ends too

    def __init__(self):
        self.steps = 0

    def reset(self, prompt_ids, meta):
        pass

    def step(self, turn_ids):
        self.steps += 1
        if self.steps == 2:
            self.release.wait(30)  # without the deadline the test fails after 30 s rather than hanging
        return EnvStep(observation_ids=[50], reward=0.5)


@pytest.mark.parametrize("workers", [2, 0])
def test_an_environment_step_that_never_returns_ends_its_episode_with_reward_zero_and_the_batch_goes_on(workers):
    """Rows 0 and 2 hang on their second step; rows 1 and 3 (0.5 a step) play all 3 turns."""
    HangsOnItsSecondStep.release = threading.Event()

    class Steady(HangsOnItsSecondStep):
        def step(self, turn_ids):
            self.steps += 1
            return EnvStep(observation_ids=[50], reward=0.5)

    envs = [HangsOnItsSecondStep(), Steady(), HangsOnItsSecondStep(), Steady()]
    engine = ScriptedEngine([[[5]] * 4, [[6]] * 4, [[7]] * 2])
    began = time.monotonic()
    with metrics.collect() as logged, ThreadPoolExecutor(workers) if workers else nullcontext() as pool:
        out, stats = run_episodes(engine, envs, [[2]] * 4, SamplingParams(max_new_tokens=1), max_turns=3,
                                  max_total_tokens=8, pad_id=0, pool=pool, step_timeout_s=0.5)
    took = time.monotonic() - began
    HangsOnItsSecondStep.release.set()
    assert 0.5 <= took < (0.5 if workers else 1.0) + 1.5  # two hung steps at once, or (no pool) one after the other
    assert stats["tool_error"] == ["environment step timed out after 0.5 s", "", "environment step timed out after "
                                   "0.5 s", ""]
    assert out["scores"].tolist() == [0.0, 1.5, 0.0, 1.5]  # the hung episodes' first 0.5 is not kept
    assert out["num_turns"].tolist() == [2, 3, 2, 3]
    assert out["response_ids"][0].tolist()[:3] == [5, 50, 6] and out["response_mask"][0].sum() == 3
    assert out["finish_reason"].tolist() == [FinishReason.STOP, FinishReason.MAX_TURNS] * 2
    assert logged["env/timed_out"] == 2.0
    assert [e.steps for e in envs] == [2, 3, 2, 3]  # a timed-out environment is never stepped again


def test_a_python_tool_call_that_spins_for_ever_ends_within_its_timeout_and_scores_zero():
    if bwrap.problem():
        pytest.skip(f"the tool's sandbox cannot start here: it needs {bwrap.problem()}")
    tokenizer = build_char_tokenizer(string.printable.replace("\x0b", "").replace("\x0c", ""))
    env = PythonEnv(tokenizer, timeout_s=1.0)
    env.reset(tokenizer.encode("6*7?"), {"answer": "42"})
    turn = tokenizer.encode("```python\nwhile True: pass\n```") + [tokenizer.eos_token_id]
    engine = ScriptedEngine([[turn]])
    began = time.monotonic()
    out, stats = run_episodes(engine, [env], [tokenizer.encode("6*7?")], SamplingParams(max_new_tokens=64),
                              max_turns=1, max_total_tokens=200, pad_id=tokenizer.pad_token_id, step_timeout_s=60)
    assert time.monotonic() - began < 1.0 + 2  # the sandbox's wall clock, not the step deadline (60 s)
    assert stats["tool_error"] == ["timeout after 1.0s"] and out["scores"].tolist() == [0.0]
