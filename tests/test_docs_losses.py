"""Each default once: every prebuilt algorithm's effective loss, built from its default config, equals its row in
docs/algorithms.md's "## Effective losses" table; every loss preset's default equals its op's own unless the preset
names the difference; a loss's model outputs are the union of its terms' needs, and only those are computed."""

import inspect
import re
from functools import partial
from pathlib import Path

import pytest
from fakes import ROLE_CLASSES
from flowrl.algorithms import REGISTRY
from flowrl.graph.role import ROLES
from flowrl.rl import losses
from flowrl.rl.distillation import DistillTerm
from flowrl.rl.loss_terms import EntropyTerm, KLTerm, Loss, NLLTerm, PolicyTerm, ValueTerm

DOC = Path(__file__).parent.parent / "docs" / "algorithms.md"
INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer", "conversation", "pair"}
CLASSES = {**ROLE_CLASSES, **{name: ROLES.get(name).cls for name in ("conversations", "learned_reward", "kl_ctrl",
                                                                     "teacher")}}
HEADER = "| name | policy objective | aggregation | KL loss | entropy bonus | rollout correction | value loss |"


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _objective(term: PolicyTerm) -> str:
    fn = term.objective
    options = fn.keywords if isinstance(fn, partial) else {}
    name = (fn.func if isinstance(fn, partial) else fn).__name__
    inside = ", IS weights inside" if term.inside else ""
    return f"`{name}`" + (f" ({', '.join(f'{k}={_number(v)}' for k, v in options.items())}{inside})" if options
                          else inside and f" ({inside[2:]})")


def _correction(loss: Loss) -> str:
    c = loss.rollout_correction
    if c is None:
        return "-"
    return ", ".join(part for part in (c.is_level and f"{c.is_level} IS {_number(c.config.is_threshold)}",
                                       c.rs_level and f"{c.rs_level} RS {_number(c.config.rs_threshold)}") if part)


def describe_policy(loss_fn) -> list[str]:
    """[objective, aggregation, KL loss, entropy bonus, rollout correction] of an actor's loss."""
    loss = loss_fn if isinstance(loss_fn, Loss) else getattr(loss_fn, "loss", None)
    if not isinstance(loss, Loss):  # a loss of its own kind, not a sum of token terms (sft_loss.BradleyTerryLoss)
        fields = ", ".join(f"{k}={_number(v)}" for k, v in vars(loss_fn).items())
        return [f"`{type(loss_fn).__name__}` ({fields})", "-", "-", "-", "-"]
    row = ["-", loss.loss_agg_mode, "-", "-", _correction(loss)]
    for term in loss.terms:
        if isinstance(term, PolicyTerm):
            row[0] = _objective(term)
        elif isinstance(term, NLLTerm):
            row[0] = "`nll` (supervised)"
        elif isinstance(term, DistillTerm):
            names = ("kind", "policy_gradient", "loss_max_clamp")
            options = ", ".join(f"{k}={_number(getattr(term, k))}" for k in names)
            row[0] = f"`distill` ({options})"
        elif isinstance(term, KLTerm):
            row[2] = f"{_number(term.coef)} {term.kind}"
        elif isinstance(term, EntropyTerm):
            row[3] = _number(term.bonus)
    return row


def effective_row(name: str) -> str:
    graph, _ = REGISTRY[name].trace(INPUTS, CLASSES)
    updates = {n: graph.nodes[n]["node"].kwargs["loss"] for n in graph.nodes if n.endswith(".update")}
    policy = next(loss for n, loss in updates.items() if n != "critic.update")
    value = updates.get("critic.update")
    value_cell = "-" if value is None else f"clip {_number(value.terms[0].clip)}, {value.loss_agg_mode}"
    assert value is None or isinstance(value.terms[0], ValueTerm)
    return "| " + " | ".join([f"`{name}`", *describe_policy(policy), value_cell]) + " |"


def doc_rows() -> dict[str, str]:
    text = DOC.read_text().split("## Effective losses", 1)[1].split("\n## ", 1)[0]
    assert HEADER in text, f"docs/algorithms.md, ## Effective losses: the table starts {HEADER}"
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^\| `(\w+)` \|", line.strip())
        if match:
            rows[match[1]] = line.strip()
    return rows


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_algorithms_effective_loss_is_its_row(name):
    rows, expected = doc_rows(), effective_row(name)
    assert rows.get(name) == expected, f"docs/algorithms.md, ## Effective losses: the {name} row should be\n{expected}"


def test_no_row_for_an_unknown_algorithm():
    assert set(doc_rows()) == set(REGISTRY)


@pytest.mark.parametrize("preset", losses.PRESETS, ids=lambda p: p.__name__)
def test_a_presets_defaults_are_its_ops_unless_it_names_the_difference(preset):
    objective = preset.bound_objective(preset())
    op = objective.func if isinstance(objective, partial) else objective
    defaults = {k: p.default for k, p in inspect.signature(op).parameters.items() if p.default is not p.empty}
    for key, value in (objective.keywords if isinstance(objective, partial) else {}).items():
        if key in preset.differs_from_op:
            assert value != defaults[key], f"{preset.__name__}.{key} equals {op.__name__}'s default: drop the note"
        else:
            assert value == defaults[key], f"{preset.__name__}: {key}={value}, {op.__name__} says {defaults[key]}"


if __name__ == "__main__":  # prints the table: python tests/test_docs_losses.py
    print(HEADER + "\n|" + " --- |" * (HEADER.count(" | ") + 1) + "\n" + "\n".join(effective_row(n) for n in REGISTRY))


@pytest.mark.parametrize("name, option, expected", [
    ("grpo", {"clip": 0.3}, {"clip_low": 0.3, "clip_high": 0.3, "dual_clip": 3.0}),
    ("dapo", {"clip_high": 0.3}, {"clip_low": 0.2, "clip_high": 0.3, "dual_clip": 3.0}),
    ("rloo", {"dual_clip": 2.0}, {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 2.0}),
    ("dppo", {"divergence": "kl"}, {"clip_low": 0.15, "clip_high": 0.15, "ratio_cap": 3.0}),
])
def test_a_presets_options_are_the_algorithms_flat_keys(name, option, expected):
    graph, _ = REGISTRY[name].trace(INPUTS, CLASSES, option)
    objective = graph.nodes["actor.update"]["node"].kwargs["loss"].term("pg_loss").objective
    assert objective.keywords == expected
    assert (objective.func.__name__ == "dppo_kl") == (name == "dppo")


def test_an_entropy_bonus_set_on_any_algorithm_asks_the_engine_for_entropy():
    for name in ("grpo", "dapo", "ppo", "gspo", "otb"):
        graph, _ = REGISTRY[name].trace(INPUTS, CLASSES, {"entropy_coef": 0.01})
        loss = graph.nodes["actor.update"]["node"].kwargs["loss"]
        assert loss.needs == ("logprobs", "entropy"), name
        default, _ = REGISTRY[name].trace(INPUTS, CLASSES)
        assert default.nodes["actor.update"]["node"].kwargs["loss"].needs == ("logprobs",), name
