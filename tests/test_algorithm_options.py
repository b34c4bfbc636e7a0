"""Options many algorithms share are declared once (issue 24.2, flowrl.rl.options): each prebuilt algorithm takes
group_size, kl_coef and rollout_correction from the shared configs, with their bounds and descriptions, and
keeps only its own default value; the user's keys stay flat (algo.group_size)."""

import ast
from pathlib import Path

import pytest

from flowrl.algorithms import REGISTRY
from flowrl.config import load_run_config, validate
from flowrl.rl import options
from flowrl.rl.correction import RolloutCorrectionConfig

SHARED = {"group_size": options.GroupSampling, "rollout_correction": options.Sampled}
OWN_GROUP = {"reinforce_pp", "remax"}  # a group of 1 is allowed: whitening over the batch, or the greedy baseline
OWN_CORRECTION = {"grpo_async"}  # token-level correction by default: its samples lag the weights


def shared_field(name: str, field: str):
    if field == "kl_coef":
        kinds = [m for m in (options.KLLoss, options.KLReward) if issubclass(REGISTRY[name].config_cls, m)]
        assert len(kinds) == 1, f"{name}: kl_coef from one of KLLoss, KLReward, got {kinds}"
        return kinds[0].model_fields["kl_coef"]
    return SHARED[field].model_fields[field]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_shared_option_has_the_shared_bounds_and_description(name):
    fields = REGISTRY[name].config_cls.model_fields
    for field in ("group_size", "kl_coef", "rollout_correction"):
        if field not in fields or (field, name) in {("group_size", n) for n in OWN_GROUP} | {
                ("rollout_correction", n) for n in OWN_CORRECTION}:
            continue
        shared = shared_field(name, field)
        assert (fields[field].description, fields[field].metadata) == (shared.description, shared.metadata), \
            f"{name}.{field} is declared again; take it from flowrl.rl.options"


def test_no_algorithm_file_declares_a_shared_option_with_a_field_of_its_own():
    """A differing default is stated on the shared type (`group_size: GroupSize = 4`), never with Field(...)."""
    allowed = {("reinforce_pp", "group_size"), ("remax", "group_size"), ("grpo_async", "rollout_correction")}
    for path in sorted((Path(__file__).parent.parent / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    node.target.id in ("group_size", "kl_coef", "rollout_correction"):
                declared = isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "Field"
                assert not declared or (path.stem, node.target.id) in allowed, f"{path.name}: {node.target.id}"


def test_the_flat_keys_still_set_them_and_bad_values_name_the_field():
    algo = load_run_config(None, ["algo.group_size=3", "algo.kl_coef=0.01", "algo.rollout_correction.is_level=token"])
    grpo = validate(REGISTRY["grpo"].config_cls, algo.algo, prefix="algo", strict=True)
    token = RolloutCorrectionConfig(is_level="token").build()
    assert (grpo.group_size, grpo.kl_coef, grpo.rollout_correction.build()) == (3, 0.01, token)
    assert REGISTRY["rloo"].make_config().group_size == 4 and REGISTRY["grpo"].make_config().group_size == 8
    assert REGISTRY["grpo"].make_config().kl_coef == 0.001 and REGISTRY["cispo"].make_config().kl_coef == 0.0
    with pytest.raises(ValueError, match=r"^invalid config: algo.group_size: Input should be greater than or equal "
                                         r"to 2$"):
        validate(REGISTRY["rloo"].config_cls, {"group_size": 1}, prefix="algo", strict=True)
    with pytest.raises(ValueError, match=r"^invalid config: algo.kl_coef: Input should be greater than or equal to 0$"):
        validate(REGISTRY["ppo"].config_cls, {"kl_coef": -1.0}, prefix="algo", strict=True)


def _another_value(field):
    """A valid value other than the field's default, to trace the algorithm with."""
    default, kind = field.get_default(call_default_factory=True), field.annotation
    choices = getattr(kind, "__args__", ())
    if isinstance(default, bool):
        return not default
    if isinstance(default, str) or default is None and all(isinstance(c, str) for c in choices):
        return next(c for c in choices if c != default)
    if default is None:
        return 2.0
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default / 2 if default else 0.01
    return {"is_level": "token"}  # the rollout correction, the one nested config


def _fields_read(algorithm, values) -> set[str]:
    """The config fields the algorithm's graph (and the losses it builds) read while it is traced."""
    from test_docs_losses import CLASSES, INPUTS

    read, recording = set(), [False]

    class Recorded(algorithm.config_cls):
        def __getattribute__(self, name):
            if recording[0] and name in type(self).model_fields:
                read.add(name)
            return super().__getattribute__(name)

    cfg = Recorded(**values)
    recording[0] = True
    algorithm.trace(INPUTS, CLASSES, cfg)
    return read


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_option_of_every_prebuilt_algorithm_is_read(name):
    """An `algo.*` key nothing reads would be accepted and silently do nothing (issue 42): the fields read while
    tracing with the defaults and with each field changed in turn (DAPO's max_response_len is read once
    overlong_buffer_len is on) must be all of the config's."""
    algorithm = REGISTRY[name]
    fields = algorithm.config_cls.model_fields
    read = _fields_read(algorithm, {})
    for field, info in fields.items():
        try:
            read |= _fields_read(algorithm, {field: _another_value(info)})
        except ValueError:  # a value its validator refuses alone (pydantic's ValidationError is a ValueError)
            continue
    assert read == set(fields), f"{name}: algo.{sorted(set(fields) - read)} read by nothing"
