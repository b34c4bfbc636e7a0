"""Open roles and engines: user roles, two reward-like roles in one graph, engines chosen by config."""

import pytest
import torch

import flowrl as fl
from flowrl.config import load_run_config
from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.engines.configs import ROLLOUT_ENGINES
from flowrl.engines.hf.configs import HFRolloutConfig
from flowrl.engines.models.folders import load_value_model
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.errors import GraphError
from flowrl.graph.role import ROLES
from flowrl.runtime.trainer import make_plan, train
from custom_roles import Judge, grpo_judged, grpo_rule_and_rm

COMMON = ["train.steps=3", "train.batch_size=8", "eval.every=0", "checkpoint.export=false"]


def config(tmp_path, *overrides):
    return load_run_config(None, [f"train.output_dir={tmp_path}", *COMMON, *overrides])


def test_a_user_role_is_registered_like_the_built_in_ones():
    assert ROLES.get("judge").cls is Judge and ROLES.get("judge").on_driver
    assert ROLES.get("actor").trainable and ROLES.get("rollout").weights_from == "actor"
    with pytest.raises(GraphError, match="role 'empty' .* has no @flowrl.graph_method"):
        fl.role("empty")(type("Empty", (), {}))
    with pytest.raises(GraphError, match="follows 'actor'.* exactly one graph method of kind 'sync'"):
        fl.role("follower", weights_from="actor")(type("Follower", (), {"score": Judge.score}))


def test_a_user_role_trains_end_to_end(tmp_path):
    """The judge (a user role on the driver) scores each response; a stage adds its score to the reward."""
    rows = train(config(tmp_path), algo=grpo_judged, progress=False)
    assert len(rows) == 3
    for row in rows:
        assert 0.0 <= row["judge/mean"] <= 1.0
        assert row["combined/mean"] == pytest.approx(row["reward/mean"] + 0.5 * row["judge/mean"], abs=1e-6)


@pytest.fixture(scope="module")
def arithmetic_reward_model(tmp_path_factory):
    """A learned reward model sharing the arithmetic run's tokenizer."""
    base = build_tiny_model(tmp_path_factory.mktemp("base") / "model", chars=ArithmeticTask.chars, seed=3)
    torch.manual_seed(1)
    model = load_value_model(base)
    torch.nn.init.normal_(model.score.weight, std=1.0)
    path = tmp_path_factory.mktemp("rm") / "model"
    model.save_pretrained(path)
    return path


def test_a_rule_reward_and_a_learned_reward_model_in_one_graph(tmp_path, arithmetic_reward_model):
    cfg = config(tmp_path, f"model.reward_path={arithmetic_reward_model}")
    plan = make_plan(cfg, grpo_rule_and_rm, ArithmeticTask(4))
    assert plan.specs["reward"].cls.__name__ == "Reward" and plan.specs["reward_model"].cls.__name__ == "RewardModel"
    assert plan.pools["reward_model"].name == "global" and "reward" not in plan.pools  # the rule runs on the driver
    rows = train(cfg, algo=grpo_rule_and_rm, progress=False)
    for row in rows:
        assert row["rm/mean"] != 0.0 and 0.0 <= row["reward/mean"] <= 1.0
        assert row["combined/mean"] == pytest.approx(row["reward/mean"] + 0.5 * row["rm/mean"], abs=1e-5)


class CountingRolloutConfig(HFRolloutConfig):
    """The HF engine under another registered name, counting its builds: shows `roles.rollout.engine` selects it."""

    def build(self, source, **kwargs):
        type(self).built = getattr(type(self), "built", 0) + 1
        return super().build(source, **kwargs)


def test_the_rollout_engine_is_chosen_by_name_from_the_registry(tmp_path):
    ROLLOUT_ENGINES.register("counting", CountingRolloutConfig, replace=True)
    cfg = config(tmp_path, "roles.rollout.engine=counting", "roles.rollout.micro_batch_size=7", "train.steps=1")
    assert type(cfg.rollout) is CountingRolloutConfig and cfg.rollout.micro_batch_size == 7
    CountingRolloutConfig.built = 0
    train(cfg, progress=False)
    assert CountingRolloutConfig.built == 1
    with pytest.raises(ValueError, match="roles.rollout: Value error, unknown rollout engine 'nope'; registered: "):
        load_run_config(None, ["roles.rollout.engine=nope"])
    with pytest.raises(ValueError, match="roles.actor.lr: Input should be greater than 0"):
        load_run_config(None, ["roles.actor.lr=-1"])
