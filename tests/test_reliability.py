"""Nothing lost, every failure named: resume checks, damaged checkpoints, a full disk, CLI errors."""

import dataclasses
import errno
import json
import os
import subprocess
import sys

import pytest
from pathlib import Path

import cli_process
from flowrl.config import load_run_config
from flowrl.runtime.store import checkpoint
from flowrl.runtime.store.resume import RunFinished
from flowrl.runtime.trainer import train

FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=8"]


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", *FAST, *overrides])


def cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "flowrl", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env)


def forked_cli(*args, cwd):
    """`flowrl ARGS` in a fresh process but for its imports, done once (tests/cli_process.py): about 7 s of CPU
    less per call than `cli`, which keeps import-time output covered."""
    return cli_process.run(*args, cwd=cwd)


def test_a_finished_run_says_so_and_a_longer_one_resumes(tmp_path, capsys):
    train(config(tmp_path, "train.steps=2"), progress=False)
    with pytest.raises(RunFinished, match=r"holds a finished run \(step 2 of train.steps=2\)"):
        train(config(tmp_path, "train.steps=2"), progress=False)
    capsys.readouterr()
    more = train(config(tmp_path, "train.steps=3"), progress=False)
    assert [row["step"] for row in more] == [3]
    assert f"resumed from step 2 ({tmp_path / 'checkpoints' / 'step_000002'})" in capsys.readouterr().err
    done = cli("train", "grpo", "--steps", "3", "--output-dir", str(tmp_path), *sum((["--set", o] for o in FAST), []),
               cwd=tmp_path)
    assert done.returncode == 3 and done.stderr.strip().count("\n") == 0 and "finished run" in done.stderr


def test_changed_settings_are_listed_and_a_new_lr_applies(tmp_path, capsys):
    train(config(tmp_path, "train.steps=2"), progress=False)
    rows = train(config(tmp_path, "train.steps=3", "roles.actor.lr=0.001", "algo.kl_coef=0.01"), progress=False)
    assert rows[0]["actor/lr"] == pytest.approx(0.001)  # the checkpoint's optimizer had 0.002
    err = capsys.readouterr().err
    assert "resuming with changed settings: algo {} -> {'kl_coef': 0.01}, roles.actor.lr 0.002 -> 0.001\n" in err


def test_settings_a_checkpoint_fixes_are_refused_by_name(tmp_path):
    train(config(tmp_path, "train.steps=2"), progress=False)
    recipe = (tmp_path / "tiny-model" / "flowrl_tiny.json").read_text()
    with pytest.raises(ValueError, match=r"model.tiny_hidden_size: the checkpoint .* was made with 64, not 32"):
        train(config(tmp_path, "train.steps=3", "model.tiny_hidden_size=32"), progress=False)
    assert (tmp_path / "tiny-model" / "flowrl_tiny.json").read_text() == recipe  # the built model is untouched


def test_a_damaged_newest_checkpoint_falls_back_to_an_intact_one(tmp_path):
    train(config(tmp_path, "train.steps=4", "checkpoint.every=2"), progress=False)
    engine = tmp_path / "checkpoints" / "step_000004" / "actor" / "__0_0.distcp"
    engine.write_bytes(engine.read_bytes()[:100])  # truncated
    with pytest.warns(UserWarning, match=r"step_000004 is damaged \(actor/__0_0.distcp has 100 bytes"):
        rows = train(config(tmp_path, "train.steps=5", "checkpoint.every=2"), progress=False)
    assert [row["step"] for row in rows] == [3, 4, 5]
    assert checkpoint.damage(tmp_path / "checkpoints" / "step_000004") is None  # rewritten whole by the rerun


def test_a_pointer_to_a_missing_checkpoint_keeps_history(tmp_path):
    train(config(tmp_path, "train.steps=4", "checkpoint.every=2"), progress=False)
    (tmp_path / "checkpoints" / "latest").write_text("step_000099")
    with pytest.warns(UserWarning, match="names 'step_000099', which does not exist"):
        rows = train(config(tmp_path, "train.steps=5"), progress=False)
    assert [row["step"] for row in rows] == [5]
    logged = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4, 5]


def test_no_intact_checkpoint_is_an_error_and_deletes_nothing(tmp_path):
    train(config(tmp_path, "train.steps=2"), progress=False)
    (tmp_path / "checkpoints" / "step_000002" / "state.json").write_text("{}")
    with pytest.raises(ValueError, match="no intact checkpoint among"), pytest.warns(UserWarning):
        train(config(tmp_path, "train.steps=3"), progress=False)
    assert (tmp_path / "checkpoints" / "step_000002" / "state.json").exists()


def test_a_full_disk_is_named_and_the_previous_checkpoint_survives(tmp_path, monkeypatch):
    from fakes import FakeTrainEngine

    checkpoint.save(tmp_path, 1, {"actor": FakeTrainEngine()}, {"x": 1})

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_atomic", full)
    with pytest.raises(checkpoint.CheckpointError, match=r"step_000002: could not be written \(the disk is full\)"):
        checkpoint.save(tmp_path, 2, {"actor": FakeTrainEngine()}, {"x": 2})
    monkeypatch.undo()
    assert checkpoint.latest(tmp_path).name == "step_000001" and not list(tmp_path.glob(".tmp_*"))


def test_a_restart_from_scratch_logs_each_step_once(tmp_path):
    train(config(tmp_path, "train.steps=2", "eval.every=1"), progress=False)
    train(config(tmp_path, "train.steps=2", "eval.every=1", "checkpoint.resume=false"), progress=False)
    logged = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged == [0, 1, 2]


@pytest.mark.parametrize("args, message", [
    (["--config", "missing.json"], "flowrl: error: --config missing.json: no such file"),
    (["--config", "bad.json"], "flowrl: error: --config bad.json: not valid JSON: Expecting value"),
    (["--config", "bad.yaml"], "flowrl: error: --config bad.yaml: not valid YAML"),
    (["--config", "bad.toml"], "flowrl: error: --config bad.toml: not valid TOML"),
    (["--set", "train.steps=true"], "flowrl: error: invalid config: train.steps: Input should be a valid integer"),
    (["--set", "train.output_dir=/proc/flowrl"], "flowrl: error: train.output_dir '/proc/flowrl': cannot write"),
    (["--set", "task.name=no_such_module:Task"], "flowrl: error: task.name: cannot load 'no_such_module:Task': "
                                                 "ModuleNotFoundError"),
    (["--set", "task.name=broken_tasks:NoReward"], "flowrl: error: task.name 'broken_tasks:NoReward': the task "
                                                   "has no 'reward'"),
    (["--set", "task.name=broken_tasks:RaisingReward"], "flowrl: error: reward function RaisingReward.reward "
                                                        "raised ZeroDivisionError: division by zero"),
    (["--set", "task.name=broken_tasks:ForeignCharacters"], "flowrl: error: prompt 0 ('1+ä='): the tokenizer "
                                                            "cannot encode it"),
    (["--set", "model.path=garbage_model"], "flowrl: error: model_path 'garbage_model': config.json is not valid "
                                            "JSON"),
    (["--set", 'algo.group_size="4"'], "flowrl: error: invalid config: algo.group_size: Input should be a valid "
                                       "integer"),
    (["--set", "algo.group_size=4.0"], "flowrl: error: invalid config: algo.group_size: Input should be a valid "
                                       "integer"),
    (["--set", "roles.rollout.temperature=Infinity"], "flowrl: error: invalid config: roles.rollout.temperature: inf "
                                                      "is not a finite number"),
    (["--set", "algo.entropy_coef=NaN"], "flowrl: error: invalid config: algo.entropy_coef: nan is not a finite "
                                         "number"),
    (["--set", 'train.output_dir=""'], "flowrl: error: invalid config: train.output_dir: Value error, an empty path"),
    (["--set", "task.name=broken_tasks:HugeReward"], "flowrl: error: reward 3e+38 for response 0 of the batch"),
    (["--set", "task.name=broken_tasks:InfiniteReward"], "flowrl: error: reward inf for response 0 of the batch"),
])
def test_cli_mistakes_end_in_one_line(tmp_path, args, message):
    (tmp_path / "bad.json").write_text('{"train": ')
    (tmp_path / "bad.yaml").write_text("train: [1\n")
    (tmp_path / "bad.toml").write_text("[train\n")
    (tmp_path / "garbage_model").mkdir()
    (tmp_path / "garbage_model" / "config.json").write_text("\x00garbage")
    done = forked_cli("train", "grpo", *args, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr


def test_debug_shows_the_traceback(tmp_path):
    done = forked_cli("--debug", "train", "grpo", "--config", "missing.json", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" in done.stderr and "no such file" in done.stderr


def test_a_metrics_line_cut_short_by_a_kill_is_dropped_on_resume(tmp_path):
    train(config(tmp_path, "train.steps=2"), progress=False)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "reward/me')  # killed while appending step 3's row
    rows = train(config(tmp_path, "train.steps=3"), progress=False)
    logged = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [3] and logged == [1, 2, 3]


def test_the_cli_imports_nothing_heavy_before_its_arguments_parse():
    """`flowrl --help` must answer at once: importing the CLI loads neither torch nor transformers."""
    code = "import sys, flowrl.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_ranks_checking_one_output_dir_at_once_do_not_trip_on_each_other(tmp_path):
    """Every rank of a torchrun job checks train.output_dir at start-up; one shared probe file made one rank's
    unlink fail under another's (a 2-rank CI run failed so)."""
    from concurrent.futures import ThreadPoolExecutor

    from flowrl.runtime.trainer import _check_writable

    def check_many(_):
        for _ in range(200):
            _check_writable(tmp_path / "run")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(check_many, range(4)))
    assert list((tmp_path / "run").iterdir()) == []


def test_plan_refuses_zero_gpus_and_a_negative_env_timeout_refuses_the_first_episode(tmp_path):
    plan = forked_cli("plan", "grpo", "--gpus", "0", cwd=tmp_path)
    assert plan.returncode == 2 and plan.stderr.strip() == ("flowrl: error: placement: --gpus 0 must be a positive "
                                                            "multiple of --nodes 1"), plan.stderr
    from flowrl.data.builtin.calculator import CalculatorEnv

    with pytest.raises(ValueError, match=r"^roles.rollout.env_options.timeout_s: expected a number > 0, got -1$"):
        CalculatorEnv(None, timeout_s=-1)


def test_scorers_and_reward_servers_refuse_absurd_rewards_naming_the_row(tmp_path):
    from flowrl.data.scoring.http_reward import HttpScorer
    from flowrl.data.scoring.pool import Sample, ScoringPool
    from reward_servers import scores, serve

    (tmp_path / "score.py").write_text("def nan(**_):\n    return float('nan')\n")
    sample = Sample(f"{tmp_path / 'score.py'}:nan", "src", "x", "x", None, "train.jsonl row 7")
    for workers in (0, 1):
        with pytest.raises(ValueError, match=r"reward nan for train.jsonl row 7 from scorer '.*score.py:nan'"):
            ScoringPool(workers).score([sample])
    with serve(scores([1.0, 2e6])) as url:
        with pytest.raises(ValueError, match=r"reward 2000000.0 for row 8 from reward server http://127.0.0.1"):
            HttpScorer(url).score([sample, dataclasses.replace(sample, where="row 8")])
