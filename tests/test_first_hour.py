"""What a new user meets in the first hour (issue 48): each fix with the behaviour it gives."""

import importlib.util
import re

import pytest

from flowrl import cli
from flowrl.config import load_run_config
from flowrl.runtime.trainer import train


def test_each_plain_train_gets_a_folder_of_its_own_and_an_explicit_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grpo = cli.config_from_args(cli.parse(["train", "grpo"]))
    ppo = cli.config_from_args(cli.parse(["train", "ppo", "train.steps=3"]))
    assert re.fullmatch(r"runs/grpo-\d{8}-\d{6}", grpo.train.output_dir), grpo.train.output_dir
    assert re.fullmatch(r"runs/ppo-\d{8}-\d{6}", ppo.train.output_dir), ppo.train.output_dir
    explicit = cli.config_from_args(cli.parse(["train", "grpo", "train.output_dir=mine"]))
    assert explicit.train.output_dir == "mine"  # the resume rule: the same folder, the same run
    assert cli.config_from_args(cli.parse(["train", "grpo", "--output-dir", "mine"])).train.output_dir == "mine"


def test_the_ray_executor_without_ray_names_the_extra(tmp_path, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a))
    assert cli.main(["train", "grpo", "train.steps=1", "executor.name=ray", f"train.output_dir={tmp_path}"]) == \
        cli.EXIT_USER_ERROR
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "flowrl: error: executor.name=ray needs Ray: install the checkout's ray extra, pip install -e '.[ray]'")


def test_a_response_longer_than_the_context_blames_max_new_tokens(tmp_path):
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "train.steps=1", "roles.rollout.max_new_tokens=100"])
    with pytest.raises(ValueError, match=r"^roles.rollout.max_new_tokens=100 leaves no room for a prompt in the "
                                         r"model's context of 64 tokens \(max_position_embeddings\); set it below 64$"):
        train(cfg, progress=False)
