
import pytest
import torch

import flowrl as fl
from flowrl.algorithms import dapo, grpo
from flowrl.data import PromptStream
from flowrl.engines.protocols import SamplingParams
from flowrl.roles import Actor, Ref, Reward, Rollout
from fakes import ROLE_CLASSES, FakeRolloutEngine, FakeTokenizer, FakeTrainEngine, ParityTask

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}


def make_roles(task=ParityTask()):
    actor = Actor(engine=FakeTrainEngine())
    return {
        "actor": actor,
        "ref": Ref(engine=FakeTrainEngine()),
        "rollout": Rollout(engine=FakeRolloutEngine(), params=SamplingParams(max_new_tokens=2), source=actor,
                           weight_sync=lambda train, rollout: None),
        "reward": Reward(fn=task.reward, tokenizer=FakeTokenizer(), meta_keys=task.meta_keys),
    }


def test_colocated_plan_inserts_sync_and_shares_module():
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    assert [n.name for n in plan.nodes][:2] == ["rollout.sync_weights", "rollout.generate"]
    assert plan.shares_weights("rollout")
    assert {n.pool for n in plan.nodes if n.role == "actor"} == {"global"}
    assert next(n for n in plan.nodes if n.name == "group_advantage").pool == "driver"
    assert "actor.update @global" in plan.describe()


def test_split_plan_does_not_share_module():
    placement = fl.Placement(pools=[fl.Pool(name="train", roles=["actor", "ref"]),
                                    fl.Pool(name="gen", roles=["rollout"])])
    plan = fl.compile_plan(grpo, placement, INPUTS, ROLE_CLASSES)
    assert not plan.shares_weights("rollout")
    assert plan.pools["rollout"].name == "gen"


def test_placement_errors_name_the_role():
    twice = fl.Placement(pools=[fl.Pool(name="a", roles=["actor"]), fl.Pool(name="b", roles=["actor", "rollout"])])
    with pytest.raises(fl.PlanError, match="role 'actor' is in pools 'a' and 'b'"):
        fl.compile_plan(grpo, twice, INPUTS, ROLE_CLASSES)
    with pytest.raises(ValueError, match="unknown role 'actr'"):
        fl.Pool(name="a", roles=["actr"])
    no_ref = fl.Placement(pools=[fl.Pool(name="a", roles=["actor", "rollout"])])
    with pytest.raises(fl.GraphError, match="role 'ref'"):
        fl.compile_plan(grpo, no_ref, INPUTS, ROLE_CLASSES)


def test_unused_placed_role_warns():
    with pytest.warns(UserWarning, match="role 'critic' is placed but grpo does not use it"):
        fl.compile_plan(grpo, fl.Placement.colocated(), INPUTS, ROLE_CLASSES)  # colocated() places critic too


def test_executor_equals_hand_written_loop():
    task = ParityTask()
    plan = fl.compile_plan(grpo.options(group_size=4), fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS,
                           ROLE_CLASSES, {"group_size": 4})
    compiled = make_roles()
    stream = PromptStream(task, FakeTokenizer(), batch_size=3, seed=1)
    batch, logged = fl.LocalExecutor(plan, compiled).run_step(0, stream)

    eager = make_roles()
    prompts = next(PromptStream(task, FakeTokenizer(), batch_size=3, seed=1))
    expected = grpo(prompts, actor=eager["actor"], rollout=eager["rollout"], ref=eager["ref"],
                    reward=eager["reward"], cfg=grpo.make_config({"group_size": 4}))
    # compiled, only actor.update reads old logprobs and it is one step: they are deferred to it, never written
    assert set(batch.keys()) | {"old_logprobs"} == set(expected.keys())
    for key in ("response_ids", "scores", "advantages", "ref_logprobs", "group"):
        assert torch.equal(batch[key], expected[key]), key
    assert compiled["actor"].engine.old_from_current
    assert not eager["actor"].engine.old_from_current and not expected["old_logprobs"].isnan().any()
    (seen, loss), = compiled["actor"].engine.updates
    assert torch.equal(seen["advantages"], eager["actor"].engine.updates[0][0]["advantages"])
    assert logged["actor/pg_loss"] == 1.0 and "reward/mean" in logged and "timing_s/actor.update" in logged


def test_fill_resamples_until_groups_are_informative():
    class HalfUniform(ParityTask):
        # prompts with even uid: every sample scores 1 (no signal); odd uids: parity of the sample
        def reward(self, responses, meta):
            return [1.0] * len(responses)

    task = ParityTask()
    roles = make_roles(task)
    plan = fl.compile_plan(dapo, fl.Placement.colocated(("actor", "rollout")), INPUTS, ROLE_CLASSES,
                           {"group_size": 4, "max_sampling_rounds": 3})
    batches = PromptStream(task, FakeTokenizer(), batch_size=4, seed=0)
    batch, logged = fl.LocalExecutor(plan, roles).run_step(0, batches)
    groups = torch.unique(batch["group"])
    assert groups.numel() <= 4
    for g in groups:
        assert batch["scores"][batch["group"] == g].std() > 0  # only informative groups survive
    assert logged["sampling/rounds"] >= 1

    uniform = make_roles(HalfUniform())
    batch, logged = fl.LocalExecutor(plan, uniform).run_step(0, PromptStream(task, FakeTokenizer(), 4))
    assert logged["sampling/rounds"] == 3 and logged["sampling/skipped_step"] == 1.0
    assert uniform["actor"].engine.updates == []  # nothing to learn from: no update


def test_world_size_mismatch_is_an_error():
    placement = fl.Placement(pools=[fl.Pool(name="g", roles=["actor", "rollout", "ref"], world_size=2)])
    plan = fl.compile_plan(grpo, placement, INPUTS, ROLE_CLASSES)
    with pytest.raises(fl.PlanError, match="pool 'g' has world_size 2"):
        fl.LocalExecutor(plan, make_roles())


def test_weight_sync_runs_only_after_updates():
    calls = []
    roles = make_roles()
    roles["rollout"].weight_sync = lambda train, rollout: calls.append(1)
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    executor = fl.LocalExecutor(plan, roles)
    stream = PromptStream(ParityTask(), FakeTokenizer(), batch_size=2)
    for step in range(3):
        executor.run_step(step, stream)
    assert len(calls) == 2  # before steps 1 and 2; step 0 starts in sync


def test_old_logprobs_deferred_only_when_update_is_their_only_reader():
    from flowrl.algorithms import ppo

    grpo_plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    # a node of the plan: the update, with the logprobs call folded into it and reading what that call read
    update = next(n for n in grpo_plan.nodes if n.name == "actor.update")
    assert "actor.logprobs" not in [n.name for n in grpo_plan.nodes]
    assert update.kwargs["deferred"] == fl.graph.Deferred("logprobs", {}) and "old_logprobs" not in update.reads
    assert grpo_plan.graph.has_edge("rollout.generate", "actor.update")  # it follows the folded call's inputs
    assert "actor.update @global" in grpo_plan.describe() and "actor.logprobs deferred into it" in grpo_plan.describe()
    ppo_plan = fl.compile_plan(ppo, fl.Placement.colocated(), INPUTS, ROLE_CLASSES)  # KL-in-reward reads them
    assert next(n for n in ppo_plan.nodes if n.name == "actor.logprobs").kwargs == {}
    assert "deferred" not in next(n for n in ppo_plan.nodes if n.name == "actor.update").kwargs


def test_non_finite_reward_is_an_error():
    task = ParityTask()
    roles = make_roles(task)
    roles["reward"].fn = lambda texts, meta: [float("nan")] * len(texts)
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    with pytest.raises(ValueError, match="reward nan for response 0 .* rewards must be finite"):
        fl.LocalExecutor(plan, roles).run_step(0, PromptStream(task, FakeTokenizer(), batch_size=2))


def test_a_baseline_scoring_pass_logs_under_its_own_name():
    from flowrl.algorithms import remax

    plan = fl.compile_plan(remax, fl.Placement.colocated(("actor", "rollout")), INPUTS, ROLE_CLASSES)
    _, logged = fl.LocalExecutor(plan, make_roles()).run_step(0, PromptStream(ParityTask(), FakeTokenizer(), 2))
    assert "baseline/mean" in logged and "reward/mean" in logged


def test_closing_the_executor_closes_each_role_once():
    """A run's end releases what roles hold: a role class's optional close() (the rollout closes its engine)."""
    closed = []

    class ClosingEngine(FakeRolloutEngine):
        def close(self):
            closed.append(self)

    roles = make_roles()
    roles["rollout"].engine = ClosingEngine()
    plan = fl.compile_plan(grpo, fl.Placement.colocated(("actor", "rollout", "ref")), INPUTS, ROLE_CLASSES)
    executor = fl.LocalExecutor(plan, roles)
    executor.close()
    executor.close()
    assert closed == [roles["rollout"].engine]  # once; roles without close() (actor, ref, reward) are left be


def test_a_deferral_target_must_take_the_folded_call():
    class Stateless:
        @fl.graph_method(writes=("cached",), defer_to="use")
        def cache(self, batch):
            return batch

        @fl.graph_method(reads=("cached",))
        def use(self, batch):  # no `deferred`: the plan could not hand it the folded call
            return batch

    with pytest.raises(fl.GraphError, match=r"cache: defer_to='use', but use\(\) takes no `deferred` argument"):
        fl.role("stateless_deferral")(Stateless)
