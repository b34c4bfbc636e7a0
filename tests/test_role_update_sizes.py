"""Each train role's passes are sized by its own section (roles.<name>.mini_batch_size, micro_batch_size,
forward_micro_batch_size, epochs; issue 42 point 2): a critic whose micro-batch differs from the actor's runs
its passes with its own, the reference starts from the actor's sizes, and train.<size> still sets them all."""
import json
import warnings
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import flowrl as fl
from flowrl.algorithms import grpo, ppo
from flowrl.config import load_run_config
from flowrl.roles import Actor, Critic, Ref
from flowrl.graph.role import role_spec
from flowrl.runtime.trainer import train
from flowrl.runtime.factory import make_factory
from fakes import ROLE_CLASSES, FakeTrainEngine, ParityTask

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
SPLIT = ["roles.actor.mini_batch_size=8", "roles.actor.micro_batch_size=4", "roles.actor.forward_micro_batch_size=8",
         "roles.critic.mini_batch_size=6", "roles.critic.micro_batch_size=2", "roles.critic.epochs=2"]


class RecordingEngine(FakeTrainEngine):
    """Records the rows of each forward pass and the sizes of each update it is asked for."""

    def __init__(self):
        super().__init__()
        self.forward_rows: list[int] = []
        self.update_sizes: list[tuple[int, int, int]] = []

    def forward(self, batch, *, micro_batch_size=8, **kwargs):
        self.forward_rows.append(micro_batch_size)
        return super().forward(batch, micro_batch_size=micro_batch_size, **kwargs)

    def update(self, batch, loss_fn, *, mini_batch_size=8, micro_batch_size=8, epochs=1, **kwargs):
        self.update_sizes.append((mini_batch_size, micro_batch_size, epochs))
        return super().update(batch, loss_fn, mini_batch_size=mini_batch_size, micro_batch_size=micro_batch_size,
                              epochs=epochs, **kwargs)


def role_settings(*sets: str, world_size: int = 1):
    """Each train role's UpdateSettings as the factory gives a rank of a pool of `world_size`."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the new keys: no deprecation
        cfg = load_run_config(None, list(sets))
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    extra = {"critic": role_spec("critic")}  # the critic's section beside GRPO's roles
    factory = make_factory(cfg, plan, ParityTask(), Path("unused"), extra)
    pool = fl.Pool(name="p", roles=["actor", "ref", "critic"], world_size=world_size)
    return factory.for_pool(pool).context.role_settings


def batch_of(rows: int) -> TensorDict:
    ids = torch.ones(rows, 3, dtype=torch.long)
    return TensorDict(prompt_ids=ids, prompt_mask=ids, response_ids=ids, response_mask=ids,
                      advantages=torch.zeros(rows, 3), batch_size=[rows])


def test_each_role_gets_its_own_sizes_and_the_reference_starts_from_the_actors():
    s = role_settings(*SPLIT)
    assert (s["actor"].mini_batch_size, s["actor"].micro_batch_size, s["actor"].forward_rows, s["actor"].epochs) \
        == (8, 4, 8, 1)
    assert (s["critic"].mini_batch_size, s["critic"].micro_batch_size, s["critic"].forward_rows,
            s["critic"].epochs) == (6, 2, 2, 2)  # forward_micro_batch_size 0: its own micro-batch
    assert (s["ref"].micro_batch_size, s["ref"].forward_rows) == (4, 8)  # the actor's, its section setting none
    assert role_settings(*SPLIT, "roles.ref.forward_micro_batch_size=16")["ref"].forward_rows == 16


def test_a_critic_with_its_own_micro_batch_runs_its_passes_with_it():
    s = role_settings(*SPLIT)
    actor, critic, ref = (Actor(RecordingEngine(), s["actor"]), Critic(RecordingEngine(), s["critic"]),
                          Ref(RecordingEngine(), s["ref"]))
    batch = batch_of(6)
    critic.update(critic.values(batch), loss=None)
    actor.update(actor.logprobs(ref.logprobs(batch)), loss=None)
    assert (critic.engine.forward_rows, critic.engine.update_sizes) == ([2], [(6, 2, 2)])
    assert (actor.engine.forward_rows, actor.engine.update_sizes) == ([8], [(8, 4, 1)])
    assert ref.engine.forward_rows == [8]


def test_sizes_split_over_a_pools_ranks_naming_the_roles_key():
    s = role_settings(*SPLIT, world_size=2)
    assert (s["actor"].mini_batch_size, s["actor"].micro_batch_size, s["critic"].micro_batch_size) == (4, 2, 1)
    with pytest.raises(ValueError, match="roles.critic.micro_batch_size=3 must be divisible by the world_size 2"):
        role_settings(*SPLIT, "roles.critic.micro_batch_size=3", world_size=2)


@pytest.mark.parametrize("key,value", [("mini_batch_size", 8), ("micro_batch_size", 4),
                                       ("forward_micro_batch_size", 8), ("epochs", 2)])
def test_the_deprecated_train_key_sets_every_role_that_has_it_with_one_warning(key, value):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_run_config(None, [f"train.{key}={value}"])
    assert [str(w.message) for w in caught] == [f"train.{key} is deprecated; use roles.actor.{key}, "
                                                f"roles.critic.{key} (each role's own)"]
    for name in ("actor", "critic", "ref", "learned_reward", "reward_model", "teacher"):
        section = cfg.section(name)
        assert getattr(section, key, value) == value, name  # the frozen roles have no mini_batch_size or epochs
    assert key not in type(cfg.train).model_fields


def test_a_roles_own_size_wins_over_the_deprecated_train_key():
    with pytest.warns(FutureWarning, match="train.micro_batch_size is deprecated"):
        cfg = load_run_config(None, ["train.micro_batch_size=8", "roles.critic.micro_batch_size=2"])
    assert (cfg.section("actor").micro_batch_size, cfg.section("critic").micro_batch_size) == (8, 2)


def test_sizes_only_sections_of_roles_the_run_lacks_say_nothing():
    """The cuda preset and a deprecated train.<size> give the critic a section a GRPO run does not read."""
    from flowrl.config import used_sections, warn_no_effect

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cfg = load_run_config(None, ["train.micro_batch_size=8", "roles.actor.mini_batch_size=8"])
    used = used_sections({name: role_spec(name) for name in ("actor", "rollout", "ref", "reward")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_no_effect(cfg, used)
    cfg = load_run_config(None, ["roles.critic.lr=0.1"])
    with pytest.warns(UserWarning, match=r"roles.critic.\* has no effect"):
        warn_no_effect(cfg, used)


def test_a_ppo_run_with_a_critic_micro_batch_of_its_own_trains(tmp_path):
    cfg = load_run_config(None, [
        "algorithm=ppo", "train.steps=1", "train.batch_size=4", "roles.rollout.max_new_tokens=4", "eval.every=0",
        "checkpoint.every=0", "checkpoint.export=false", "roles.actor.mini_batch_size=4",
        "roles.actor.micro_batch_size=4", "roles.critic.mini_batch_size=4", "roles.critic.micro_batch_size=1",
        f"train.output_dir={tmp_path}"])
    history = train(cfg, ppo, progress=False)
    assert len(history) == 1 and "critic/vf_loss" in history[0] and "actor/pg_loss" in history[0], history
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert torch.isfinite(torch.tensor(rows[-1]["critic/vf_loss"]))


def test_the_trained_roles_and_only_they_size_updates():
    """mini_batch_size and epochs sit on the sections of the roles registered trainable (the declared trait)."""
    from flowrl.graph.role import ROLES
    from flowrl.roles.configs import TrainedRoleConfig, TrainRoleConfig

    built_in = ("actor", "critic", "ref", "teacher", "reward_model", "learned_reward")  # (tests register others)
    for name in built_in:
        spec = ROLES.get(name)
        assert issubclass(spec.config, TrainRoleConfig)
        assert issubclass(spec.config, TrainedRoleConfig) == spec.trainable, name
    assert [name for name in built_in if ROLES.get(name).trainable] == ["actor", "critic", "learned_reward"]


def test_the_docs_table_of_update_sizes_gives_the_codes_defaults():
    import re

    from flowrl.roles.configs import UPDATE_SIZES, TrainedRoleConfig

    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    said = dict(re.findall(r"^\| `(\w+)` \| [^|]+ \| (\d+)", text, re.M))
    assert {key: int(said[key]) for key in UPDATE_SIZES} == \
        {key: TrainedRoleConfig.model_fields[key].default for key in UPDATE_SIZES}
