"""The real stack on CPU: tiny Qwen2 model saved and loaded from disk, HF engines, local executor."""

import json
import re
import math
import subprocess
import sys

import pytest
import torch

import flowrl as fl
from flowrl.rl import losses
from flowrl.config import load_run_config
from flowrl.engines.models.folders import load_tokenizer
from flowrl.engines.train.sharded_checkpoint import read_model
from flowrl.runtime.trainer import train
from transformers import AutoModelForCausalLM
from crash import train_until_crash
import cli_process


def config(tmp_path, *overrides):
    return load_run_config(None, [f"train.output_dir={tmp_path}", *overrides])


def rewards(history):
    return [row["reward/mean"] for row in history]


def test_default_grpo_run_raises_reward(tmp_path):
    history = train(config(tmp_path, "train.steps=40", "checkpoint.every=0"), progress=False)
    r = rewards(history)
    first, last = sum(r[:5]) / 5, sum(r[-5:]) / 5
    assert last > first + 0.15, r
    assert (tmp_path / "checkpoints" / "step_000040" / "actor").exists()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "final")  # the trained actor, as HF weights
    saved = read_model(tmp_path / "checkpoints/step_000040/actor")
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in saved.items())
    assert load_tokenizer(tmp_path / "final").decode(load_tokenizer(tmp_path / "final").encode("1+2=")) == "1+2="
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(41))
    evals = [r["eval/reward/mean"] for r in rows if "eval/reward/mean" in r]
    assert len(evals) == 5 and evals[-1] > evals[0] + 0.15, evals  # greedy accuracy at 0, 10, .., 40


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    straight = train(config(tmp_path / "a", "train.steps=4", "checkpoint.every=2"), progress=False)

    train_until_crash(config(tmp_path / "b", "train.steps=4", "checkpoint.every=2"), 3)
    resumed = train(config(tmp_path / "b", "train.steps=4", "checkpoint.every=2"), progress=False)
    assert [row["step"] for row in resumed] == [3, 4]
    logged = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 1, 2, 3, 4]  # the crashed run's step 3 row is replaced, not duplicated
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm"):
        assert [row[key] for row in resumed] == [row[key] for row in straight[2:]], key
    a, b = (read_model(tmp_path / run / "checkpoints/step_000004/actor")
            for run in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("algorithm", ["ppo", "dapo", "rloo", "reinforce_pp", "remax", "gspo", "cispo", "dppo"])
def test_each_algorithm_trains_on_the_real_engines(tmp_path, algorithm):
    history = train(config(tmp_path, f"algorithm={algorithm}", "train.steps=2", "train.batch_size=8"),
                    progress=False)
    assert len(history) == 2
    last = history[-1]
    assert math.isfinite(last["actor/pg_loss"]) and math.isfinite(last["actor/grad_norm"])
    if algorithm == "ppo":
        assert math.isfinite(last["critic/vf_loss"])


def test_graph_errors_come_before_any_model_loads(tmp_path):
    @fl.algorithm
    def no_advantages(batch, actor, rollout, reward):
        batch = rollout.generate(batch, n=2)
        return actor.update(batch, loss=losses.ppo_loss())

    with pytest.raises(fl.GraphError, match="reads 'advantages'"):
        train(config(tmp_path), algo=no_advantages, progress=False)
    assert not (tmp_path / "tiny-model").exists()


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "flowrl", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_cli_train_plan_and_bad_input(tmp_path):
    done = run_cli("train", "grpo", "--steps", "2", "--output-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"step 2: eval/reward/mean=\S+ reward/mean=", done.stdout) and "done: 2 steps" in done.stdout
    assert "it/s" not in done.stderr  # no progress bar when stderr is not a terminal (a log file)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0 holds the evaluation before training

    plan = cli_process.run("plan", "dapo", cwd=tmp_path)  # forked: the real `python -m flowrl` ran above
    assert plan.returncode == 0 and "_fill @driver" in plan.stdout and "rollout.sync_weights" in plan.stdout

    bad = cli_process.run("train", "grpo", "--set", "algo.group_size=1", cwd=tmp_path)
    assert bad.returncode == 2 and "algo.group_size" in bad.stderr
    unknown = cli_process.run("train", "grpx", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown 'grpx'" in unknown.stderr


def test_bad_model_path_and_algo_option_are_named(tmp_path):
    with pytest.raises(ValueError, match="model.path: '/nonexistent' is not a Hugging Face model folder"):
        train(config(tmp_path, "model.path=/nonexistent"), progress=False)
    with pytest.raises(ValueError, match="algo.loss_agg_mode: Input should be 'token-mean'"):
        train(config(tmp_path, "algo.loss_agg_mode=mean"), progress=False)


def test_split_placement_matches_the_hybrid_engine(tmp_path):
    """A rollout with its own copy, refreshed by full weight syncs, samples what the shared module samples."""
    split = ('placement={"pools": [{"name": "train", "roles": ["actor", "ref"]}, '
             '{"name": "gen", "roles": ["rollout"]}]}')
    hybrid = train(config(tmp_path / "hybrid", "train.steps=3"), progress=False)
    separate = train(config(tmp_path / "split", "train.steps=3", split), progress=False)
    for key in ("reward/mean", "response_length/mean", "actor/pg_loss"):
        assert [row[key] for row in separate] == pytest.approx([row[key] for row in hybrid], abs=1e-6), key


def test_a_task_object_can_be_passed_from_python(tmp_path):
    from fakes import ParityTask

    history = train(config(tmp_path, "train.steps=1", "eval.every=0"), progress=False, task=ParityTask())
    assert len(history) == 1 and "reward/mean" in history[0]


def test_a_custom_task_plugs_in_by_name(tmp_path):
    history = train(config(tmp_path, "task.name=fakes:ParityTask", "train.steps=2", "eval.every=0"),
                    progress=False)
    assert len(history) == 2 and 0.0 <= history[-1]["reward/mean"] <= 1.0
    with pytest.raises(ValueError, match="task.name: cannot load 'fakes:Nope'"):
        train(config(tmp_path, "task.name=fakes:Nope"), progress=False)
    with pytest.raises(ValueError, match="task.name: unknown 'gsm8k'"):
        train(config(tmp_path, "task.name=gsm8k"), progress=False)


def test_gradient_checkpointing_trains_the_same(tmp_path):
    plain = train(config(tmp_path / "a", "train.steps=2", "eval.every=0"), progress=False)
    saved = train(config(tmp_path / "b", "train.steps=2", "eval.every=0", "model.gradient_checkpointing=true"),
                  progress=False)
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm"):
        assert [r[key] for r in saved] == pytest.approx([r[key] for r in plain], abs=1e-5), key


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_named(tmp_path):
    with pytest.raises(ValueError, match="train.device: 'cuda', but torch sees no CUDA device"):
        train(config(tmp_path, "train.device=cuda"), progress=False)
