import inspect

import pytest
import torch
from tensordict import TensorDict

import flowrl as fl
from flowrl.algorithms import dapo, dppo, grpo, ppo, reinforce_pp, remax
from fakes import ROLE_CLASSES
from flowrl.graph.trace import SOURCE

INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}


def names(order):
    return [n for n in order]


def test_grpo_trace_has_nodes_and_data_edges():
    graph, order = grpo.trace(INPUTS, ROLE_CLASSES)
    assert order == ["rollout.generate", "reward.score", "actor.logprobs", "ref.logprobs", "group_advantage",
                     "actor.update"]
    # ref and old logprobs both read only rollout outputs: no edge between them
    assert not graph.has_edge("actor.logprobs", "ref.logprobs")
    assert graph.has_edge("reward.score", "group_advantage")  # scores
    assert graph.has_edge("ref.logprobs", "actor.update")  # ref_logprobs feed the KL loss
    assert graph.has_edge(SOURCE, "rollout.generate")


def test_config_drops_unused_role():
    _, order = grpo.trace(INPUTS, ROLE_CLASSES, {"kl_coef": 0.0})
    assert "ref.logprobs" not in order


def test_missing_field_names_field_and_node():
    @fl.algorithm
    def broken(batch, actor, rollout):
        batch = rollout.generate(batch)
        return actor.update(batch, loss=fl_loss())

    with pytest.raises(fl.GraphError, match=r"actor.update reads 'advantages'"):
        broken.trace(INPUTS, ROLE_CLASSES)


def fl_loss():
    from flowrl.rl import losses

    return losses.ppo_loss()


def test_role_not_given_is_named():
    classes = {k: v for k, v in ROLE_CLASSES.items() if k != "ref"}
    with pytest.raises(fl.GraphError, match=r"role 'ref' \(ref.logprobs\), which was not given"):
        grpo.trace(INPUTS, classes)


def test_stale_batch_and_unknown_method():
    @fl.algorithm
    def stale(batch, rollout, reward):
        generated = rollout.generate(batch)
        reward.score(generated)
        return reward.score(generated)

    with pytest.raises(fl.GraphError, match="stale batch"):
        stale.trace(INPUTS, ROLE_CLASSES)

    @fl.algorithm
    def typo(batch, rollout):
        return rollout.genrate(batch)

    with pytest.raises(fl.GraphError, match="no graph method 'genrate'"):
        typo.trace(INPUTS, ROLE_CLASSES)


def test_bad_signature_rejected():
    with pytest.raises(fl.GraphError, match="'model' is neither a role"):
        fl.algorithm(lambda batch, model: batch)


def test_dapo_has_fill_after_filter():
    graph, order = dapo.trace(INPUTS, ROLE_CLASSES)
    assert order.index("drop_uniform_groups") < order.index("_fill") < order.index("actor.logprobs")
    # the filter and the fill change rows: what follows depends on them, not just on generate
    assert graph.has_edge("drop_uniform_groups", "_fill") and graph.has_edge("_fill", "actor.logprobs")
    assert not graph.has_edge("rollout.generate", "actor.logprobs")


def test_ppo_uses_critic():
    graph, order = ppo.trace(INPUTS, ROLE_CLASSES)
    assert graph.has_edge("critic.values", "gae_advantage")
    assert graph.has_edge("gae_advantage", "critic.update")  # returns


def test_remax_scores_a_greedy_rollout_as_the_baseline():
    graph, order = remax.trace(INPUTS, ROLE_CLASSES)
    generates = [n for n in order if graph.nodes[n]["node"].method == "generate"]
    assert generates == ["rollout.generate", "rollout.generate#2"]
    assert graph.nodes["rollout.generate"]["node"].kwargs == {"greedy": True}
    assert order.index("keep_as_baseline") < order.index("rollout.generate#2")
    # the advantage reads the greedy baseline kept before resampling, and the sampled scores
    assert "baseline_scores" in graph.nodes["remax_advantage"]["node"].reads
    # the baseline reaches the advantage through the resampling, which repeats its rows
    assert graph.has_edge("keep_as_baseline", "rollout.generate#2")
    assert graph.has_edge("rollout.generate#2", "remax_advantage")
    assert graph.has_edge("reward.score#2", "remax_advantage")
    assert not graph.has_edge("reward.score", "remax_advantage")


def test_reinforce_pp_folds_kl_into_token_rewards_and_drops_ref_without_it():
    graph, order = reinforce_pp.trace(INPUTS, ROLE_CLASSES)
    assert graph.has_edge("ref.logprobs", "token_rewards")
    assert graph.has_edge("token_rewards", "reinforce_pp_advantage")
    _, order = reinforce_pp.trace(INPUTS, ROLE_CLASSES, {"kl_coef": 0.0})
    assert "ref.logprobs" not in order


def test_dppo_divergence_picks_the_loss():
    from flowrl.rl.ops.policy_loss import dppo_kl, dppo_tv

    for divergence, objective in (("tv", dppo_tv), ("kl", dppo_kl)):
        graph, order = dppo.trace(INPUTS, ROLE_CLASSES, {"divergence": divergence})
        assert graph.nodes["actor.update"]["node"].kwargs["loss"].term("pg_loss").objective.func is objective
        assert "ref.logprobs" not in order  # no KL by default
    with pytest.raises(ValueError, match="divergence"):
        dppo.make_config({"divergence": "js"})


def test_stage_bare_and_with_args_keeps_signature_and_runs_eagerly():
    @fl.stage
    def double(batch, *, factor: int = 2):
        batch["x"] = batch["x"] * factor
        return batch

    @fl.stage(reads=("x",), writes=("y",))
    def copy(batch):
        batch["y"] = batch["x"].clone()
        return batch

    assert list(inspect.signature(double).parameters) == ["batch", "factor"]
    td = TensorDict({"x": torch.tensor([1, 2, 3])}, batch_size=[3])
    tripled = double.options(factor=3)
    assert tripled is not double and double.bound == {}
    assert tripled(td.clone())["x"].tolist() == [3, 6, 9]
    assert copy(td.clone())["y"].tolist() == [1, 2, 3]


def test_algorithm_options_returns_validated_copy():
    small = grpo.options(group_size=4)
    assert small is not grpo and grpo.overrides == {}
    assert small.make_config().group_size == 4
    with pytest.raises(ValueError, match="group_size"):
        grpo.options(group_size=1).make_config()


def test_bad_call_arguments_fail_at_trace_time():
    @fl.algorithm
    def typo_kwarg(batch, rollout):
        return rollout.generate(batch, n=2, temprature=0.5)

    with pytest.raises(fl.GraphError, match="unknown sampling option 'temprature'"):
        typo_kwarg.trace(INPUTS, ROLE_CLASSES)

    @fl.algorithm
    def zero_samples(batch, rollout):
        return rollout.generate(batch, n=0)

    with pytest.raises(fl.GraphError, match="n must be an int >= 1"):
        zero_samples.trace(INPUTS, ROLE_CLASSES)

    from flowrl.rl import stages

    @fl.algorithm
    def bad_stage_kwarg(batch, rollout, reward):
        batch = reward.score(rollout.generate(batch, n=2))
        return stages.group_advantage(batch, norm_std=False)

    with pytest.raises(fl.GraphError, match="stage group_advantage: got an unexpected keyword argument 'norm_std'"):
        bad_stage_kwarg.trace(INPUTS, ROLE_CLASSES)

    @fl.algorithm
    def update_without_loss(batch, actor, rollout):
        return actor.update(rollout.generate(batch))

    with pytest.raises(fl.GraphError, match="actor.update: missing a required argument: 'loss'"):
        update_without_loss.trace(INPUTS, ROLE_CLASSES)


def test_a_methods_row_multiplier_is_declared_not_read_from_a_keyword_named_n():
    """The sampler declares that its `n` multiplies rows (memory and streamed requests are sized by it); another
    method's keyword called n multiplies nothing."""
    from flowrl.graph.trace import Spec, Tracer

    graph, _ = grpo.trace(INPUTS, ROLE_CLASSES, {"group_size": 3, "kl_coef": 0.0})
    generate = graph.nodes["rollout.generate"]["node"]
    assert generate.row_multiplier() == 3 and "n" not in generate.other_kwargs()
    tracer = Tracer(frozenset({"x"}))
    spec = Spec(reads=("x",), writes=("y",))
    tracer.record(tracer.latest, "other", spec, {"n": 5})
    assert tracer.graph.nodes["other"]["node"].row_multiplier() == 1
