"""Each role's own section, roles.<name> (issue 24.1): a user role's options from the command line, the built-in
sections, the old flat keys as aliases, and one-line errors naming the field."""

import json
import sys
import warnings
from pathlib import Path

import pytest

import cli_process
import flowrl as fl
from flowrl import cli
from flowrl.config import load_run_config, used_sections, warn_no_effect
from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.errors import GraphError
from flowrl.graph.role import ROLES
from flowrl.runtime.trainer import make_plan, resolve_algorithm

RUN = ["train.steps=1", "train.batch_size=4", "eval.every=0", "checkpoint.export=false", "checkpoint.every=0"]


def test_a_user_role_takes_its_option_from_the_command_line(tmp_path, capsys):
    sys.modules.pop("graded_roles", None)  # the role registers when the run imports the algorithm, after load
    argv = ["train", "graded_roles:graded", "--output-dir", str(tmp_path), "--set", "roles.grader.threshold=0.3"]
    assert cli.main([*argv, *(a for item in RUN for a in ("--set", item))]) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["grader/threshold"] == pytest.approx(0.3)  # the default is 0.5


def test_a_user_roles_bad_value_or_unknown_role_is_one_line_naming_the_field():
    graded = resolve_algorithm("graded_roles:graded")  # registered now: the section is checked at load
    with pytest.raises(ValueError, match=r"^invalid config: roles.grader.threshold: Input should be less than or "
                                         r"equal to 1$"):
        load_run_config(None, ["roles.grader.threshold=2"])
    with pytest.raises(ValueError, match=r"^invalid config: roles.grader.treshold: Extra inputs are not permitted$"):
        load_run_config(None, ["roles.grader.treshold=0.3"])
    cfg = load_run_config(None, ["roles.gradr.threshold=0.3"])  # perhaps a role the algorithm's module registers
    with pytest.raises(ValueError, match=r"^roles.gradr: no role 'gradr' is registered; registered roles are \["):
        cfg.check_roles(make_plan(cfg, graded, ArithmeticTask(4)).specs)
    with pytest.raises(ValueError, match=r"^invalid config: roles.reward.use: unknown role 'nope'$"):
        load_run_config(None, ["roles.reward=nope"])


def test_a_section_of_a_role_the_graph_lacks_warns_that_it_has_no_effect():
    cfg = load_run_config(None, ["roles.grader.threshold=0.3", "roles.critic.lr=0.1"])
    plan = make_plan(cfg, resolve_algorithm("grpo"), ArithmeticTask(4))
    with pytest.warns(UserWarning) as record:
        warn_no_effect(cfg, used_sections(plan.specs))
    said = sorted(str(w.message) for w in record)
    assert said == ["roles.critic.* has no effect: no role of the algorithm builds on it",
                    "roles.grader.* has no effect: no role of the algorithm builds on it"]


def test_each_built_in_role_has_its_section_and_the_reference_starts_from_the_actors():
    cfg = load_run_config(None, ["roles.actor.lr=0.1", "roles.actor.compile=true", "roles.ref.compile=false",
                                 "roles.rollout.env=calculator", "roles.rollout.max_turns=2"])
    ref, critic, rollout = cfg.section("ref"), cfg.section("critic"), cfg.section("rollout")
    assert (ref.engine.lr, ref.engine.compile, cfg.actor.compile) == (0.1, False, True)
    assert (critic.engine.lr, critic.engine.compile) == (5e-3, False)  # the critic's own default, not the actor's
    assert (rollout.env, rollout.max_turns, rollout.env_spec().max_turns) == ("calculator", 2, 2)
    assert "env" not in type(cfg.rollout).model_fields  # the rollout role's option, not its engine's
    assert type(cfg.section("llm_judge")).__name__ == "JudgeConfig"


def test_old_flat_keys_are_aliases_that_say_once_they_are_deprecated():
    new = load_run_config(None, ["roles.actor.lr=0.1", "roles.rollout.env=calculator", "roles.critic.lr=0.2"])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        old = load_run_config(None, ["actor.lr=0.1", "rollout.env=calculator", "critic.lr=0.2"])
    assert old.model_dump() == new.model_dump()
    assert [str(w.message) for w in record] == ["actor.lr is deprecated; use roles.actor.lr",
                                                "critic.lr is deprecated; use roles.critic.lr",
                                                "rollout.env is deprecated; use roles.rollout.env"]
    both = load_run_config(None, ["actor.lr=0.3", "roles.actor.lr=0.3", "actor.compile=true"])
    assert (both.actor.lr, both.actor.compile) == (0.3, True)  # an alias and its new key that agree merge
    with pytest.raises(ValueError, match="^actor.lr=0.1 and roles.actor.lr=0.3 disagree"):  # issue 40.6: no drop
        load_run_config(None, ["actor.lr=0.1", "roles.actor.lr=0.3"])


def test_the_deprecation_is_one_line_on_the_command_line(tmp_path):
    done = cli_process.run("plan", "grpo", "--set", "actor.lr=0.1", cwd=tmp_path, timeout=300)  # a process of its own
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["flowrl: warning: actor.lr is deprecated; use roles.actor.lr"]


def test_a_binding_is_the_sections_use_and_the_shorthand_still_works():
    short, long = (load_run_config(None, [item]) for item in ("roles.reward=llm_judge", "roles.reward.use=llm_judge"))
    assert short.model_dump() == long.model_dump()
    assert short.role_classes() == {"reward": ROLES.get("llm_judge").cls}
    assert type(short.section("reward")).__name__ == "JudgeConfig"  # the judge's config, on its own engine
    for order in (["roles.reward=llm_judge", "roles.reward.temperature=0.5"],
                  ["roles.reward.temperature=0.5", "roles.reward=llm_judge"]):  # the shorthand beside its options
        both = load_run_config(None, order)
        assert (both.role_classes(), both.section("reward").engine.temperature) == (short.role_classes(), 0.5)


def test_the_role_decorator_takes_a_config_bare_or_with_arguments():
    bare = fl.role(type("Bare", (), {"run": fl.graph_method(lambda self, batch: batch)}))
    assert ROLES.get("bare").cls is bare and ROLES.get("bare").config is fl.RoleConfig
    rollout = ROLES.get("rollout")
    fl.role("my_rollout", weights_from="actor")(type("MyRollout", (rollout.cls,), {}))  # configured as the rollout
    assert (ROLES.get("my_rollout").config, ROLES.get("my_rollout").engines) == (rollout.config, rollout.engines)
    cfg = load_run_config(None, ["roles.rollout=my_rollout", "roles.rollout.temperature=0.5"])
    assert cfg.rollout.temperature == 0.5  # its section holds the rollout's engine options
    with pytest.raises(GraphError, match="role 'odd': config=<class 'dict'> is not a flowrl.RoleConfig subclass"):
        fl.role("odd", config=dict)(type("Odd", (), {"run": fl.graph_method(lambda self, batch: batch)}))


def test_a_role_loads_its_own_model_when_its_section_names_one(tmp_path):
    """The reference defaults to the run's model (the actor's); roles.ref.model gives it another folder."""
    from flowrl.engines.models.tiny_model import build_tiny_model
    from flowrl.runtime.factory import make_factory

    policy, other = (build_tiny_model(tmp_path / name, chars=ArithmeticTask.chars, seed=seed)
                     for name, seed in (("policy", 1), ("other", 2)))
    grpo, task = resolve_algorithm("grpo"), ArithmeticTask(4)

    def weights(*overrides):
        cfg = load_run_config(None, [f"model.path={policy}", *overrides])
        roles = make_factory(cfg, make_plan(cfg, grpo, task), task, Path(cfg.model.path)).build(("actor", "ref"))
        return [roles[name].engine.model.get_input_embeddings().weight for name in ("actor", "ref")]

    actor, ref = weights()
    assert ref.equal(actor)  # the default: the actor's starting weights
    actor, ref = weights(f"roles.ref.model={other}")
    assert not ref.equal(actor) and ref.equal(weights(f"model.path={other}")[0])
    with pytest.raises(ValueError, match=r"^roles.ref.model: '.*nope' is not a Hugging Face model folder"):
        weights(f"roles.ref.model={tmp_path / 'nope'}")
    with pytest.raises(ValueError, match=r"^invalid config: roles.actor.model: Value error, the policy's folder is "
                                         r"model.path"):
        load_run_config(None, [f"roles.actor.model={other}"])


def test_the_judges_options_are_its_sections_and_the_data_keys_their_aliases():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        old = load_run_config(None, ["roles.reward=llm_judge", "data.judge_template=<{response}>",
                                     "data.judge_max_new_tokens=3"])
    new = load_run_config(None, ["roles.reward=llm_judge", "roles.reward.template=<{response}>",
                                 "roles.reward.answer_tokens=3"])
    assert old.model_dump() == new.model_dump()
    settings = new.section("reward").settings()  # what the judge builds with (flowrl.roles.judge.Judge.build)
    assert (settings.render("p", "r"), settings.max_new_tokens) == ("<r>", 3)
    assert [str(w.message) for w in record] == [
        "data.judge_template is deprecated; use roles.reward.template",
        "data.judge_max_new_tokens is deprecated; use roles.reward.answer_tokens"]
    with pytest.raises(ValueError, match=r"^invalid config: roles.reward.max_score: Input should be greater than 0$"):
        load_run_config(None, ["roles.reward=llm_judge", "roles.reward.max_score=0"])
