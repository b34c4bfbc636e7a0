"""Every wait has a deadline (issue 29.2): each fault below ends within its configured timeout with one line
naming what did not answer, or scores 0 and is counted."""

import json
import os
import socket
import time

import pytest

from flowrl import metrics
from flowrl.config import load_run_config
from flowrl.data.http_reward import HttpScorer
from flowrl.data.scoring_pool import Sample, ScoringPool
from flowrl.runtime import distributed
from flowrl.runtime.trainer import train
from reward_servers import serve


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", "train.eval_every=0", "train.export=false",
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
    from flowrl.runtime.ray_executor import init_ray

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
                                           rf"not answer within train.rendezvous_timeout_s=1"):
        distributed.check_rendezvous(1.0)
    assert time.monotonic() - began < 3


def test_prompts_all_longer_than_the_context_are_refused_at_load(tmp_path):
    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": "1+" * 100 + "1="}],
             "reward_model": {"ground_truth": "2"}, "extra_info": {}}] * 4
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"data.train_files: all 4 prompts are longer than the 62 tokens the model's "
                                         r"context leaves \(max_position_embeddings less rollout.max_new_tokens=2\)"):
        train(config(tmp_path / "run", "train.steps=1", f"data.train_files={tmp_path / 'long.jsonl'}",
                     "data.reward=exact_match"), progress=False)


@pytest.mark.parametrize("overrides, message", [
    (["rollout.max_lora_rank=8", "actor.lora_rank=16"], r"^actor.lora_rank=16 is above rollout.max_lora_rank=8"),
    (["rollout.max_lora_rank=8"], r"^rollout.max_lora_rank=8 serves the actor's LoRA adapter, but actor.lora_rank "
                                  r"is 0"),
    (["rollout.max_lora_rank=12", "actor.lora_rank=8"], r"^rollout.max_lora_rank=12: vLLM takes one of \(1, 8, 16"),
])
def test_vllm_lora_options_that_contradict_each_other_are_refused_before_vllm_starts(tmp_path, overrides, message):
    """They failed after the first step (or in vLLM's start-up) before."""
    with pytest.raises(ValueError, match=message):
        train(config(tmp_path, "train.steps=1", "rollout.engine=vllm", *overrides), progress=False)
    assert not (tmp_path / "tiny-model").exists()  # refused before any model was built


def test_a_reward_function_under_its_deadline_still_logs_into_the_step():
    from flowrl.data.scoring_pool import call_with_deadline

    with metrics.collect() as logged:
        assert call_with_deadline(lambda x: metrics.log("judge/calls", x) or x, (3.0,), 5.0, "f") == 3.0
    assert logged == {"judge/calls": 3.0}
