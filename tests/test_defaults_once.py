"""Each option's default is written once: in its config class, not again as a defaulted keyword of the object
the config builds (torchtitan's Configurable.Config.build: the built object takes its config), and not again,
at another value, in another config holding the same option. Walks the registered engine and executor configs
and the rollout correction's with each built class's __init__, and every config class reachable from the run
config, the registered engines, roles, algorithms, executors and weight transports."""

import inspect
import types
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import flowrl.algorithms  # noqa: F401 (registers the prebuilt algorithms)
from flowrl.config.run_config import RunConfig
from flowrl.config.sections import CheckpointConfig
from flowrl.engines.configs import ROLLOUT_ENGINES, TRAIN_ENGINES
from flowrl.engines.weights.transport_configs import TransportConfig
from flowrl.graph.algorithm import ALGORITHMS
from flowrl.graph.role import ROLES
from flowrl.plan.calibrate import PlanSection
from flowrl.rl.correction import RolloutCorrectionConfig
from flowrl.runtime.executor import LocalExecutor
from flowrl.runtime.executor_configs import ExecutorConfig, LocalExecutorConfig, RayExecutorConfig

KNOWN = {  # written twice today (issue 42 point 2, not yet moved): the list may only shrink
    ("LocalExecutorConfig", "LocalExecutor"): {"gc_freeze"},
}


def _built(config: type) -> list[type]:
    """The classes `config.build` returns (its return annotation; a union gives each)."""
    returned = typing.get_type_hints(config.build)["return"]
    args = typing.get_args(returned) if isinstance(returned, types.UnionType) or typing.get_origin(returned) \
        is typing.Union else (returned,)
    return [a for a in args if isinstance(a, type) and a is not type(None)]


def _pairs() -> list[tuple[type, type]]:
    configs = [TRAIN_ENGINES.get(name) for name in TRAIN_ENGINES.names()]
    configs += [config for config in map(_rollout_engine, ROLLOUT_ENGINES.names()) if config is not None]
    # flowrl's own: an engine a test registers (test_open_roles' counting rollout) is not the project's to check
    configs = [config for config in configs if config.__module__.startswith("flowrl.")]
    pairs = [(config, built) for config in [*configs, RolloutCorrectionConfig] for built in _built(config)]
    from flowrl.runtime.ray.executor import RayExecutor  # the executors' build returns the base, Executor

    return pairs + [(LocalExecutorConfig, LocalExecutor), (RayExecutorConfig, RayExecutor)]


def _fields(config: type) -> set[str]:
    """The config's fields, and those of the run config section it holds (an executor's `options`)."""
    fields = set(config.model_fields)
    options = config.model_fields.get("options")
    return fields | (set(options.annotation.model_fields) if options is not None else set())


def _defaulted_twice(config: type, built: type) -> set[str]:
    params = inspect.signature(built.__init__).parameters.values()
    defaulted = {p.name for p in params if p.default is not inspect.Parameter.empty}
    return defaulted & _fields(config)


def test_no_config_field_is_a_defaulted_keyword_of_what_it_builds():
    found = {(c.__name__, b.__name__): twice for c, b in _pairs() if (twice := _defaulted_twice(c, b))}
    new = {pair: names - KNOWN.get(pair, set()) for pair, names in found.items() if names - KNOWN.get(pair, set())}
    assert not new, f"defaults written again in the built class: {new}"
    fixed = {pair: names - found.get(pair, set()) for pair, names in KNOWN.items() if names - found.get(pair, set())}
    assert not fixed, f"now written once: remove them from KNOWN: {fixed}"


def test_the_walk_sees_a_field_defaulted_twice():
    class Config(RolloutCorrectionConfig):
        pass

    class Built:
        def __init__(self, is_level: str = "token", other: int = 0):
            pass

    assert _defaulted_twice(Config, Built) == {"is_level"}  # is_level is a field; `other` is not


SAME_NAME = {  # one name, two defaults, because they are two options (or one option's per-component values)
    "chat_template": "task.chat_template (wrap prompts, a bool) and roles.rollout.chat_template (a Jinja text)",
    "compile": "HFTrainConfig's train passes and HFStaticRolloutConfig's decode step (None: on CUDA only)",
    "device": "train.device and a pool's (cpu) and a plan prediction's GPU model (H100-80G)",
    "group_size": "each algorithm's own, in its config class (GPG's paper samples 5)",
    "loss_agg_mode": "each algorithm's own, in its config class (RLOO's is verl's seq-mean-token-mean)",
    "lr": "roles.critic starts from lr 5e-3 (CriticConfig.ENGINE_DEFAULTS): the value head's, the actor's 2e-3",
    "micro_batch_size": "a train role's (rows per backward, TrainRoleConfig) and HFRolloutConfig's (rows per generate())",
    "name": "executor.name and task.name",
    "gpu_memory_utilization": "the vLLM rollout's share of a GPU (0.5) and the vLLM teacher's (0.3), which shares the "
                              "GPU with the student's engines",
    "kv_cache_gb": "the in-process vLLM engines' (None: vLLM's own CPU default) and a vLLM server process's (1.0 GiB, "
                   "VLLM_CPU_KVCACHE_SPACE takes whole GiB)",
}
"""Option names whose defaults differ between config classes, each with the reason; the list may only shrink."""


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic classes an annotation names (through unions, lists, dicts)."""
    found = [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []
    return found + [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _config_classes() -> set[type[BaseModel]]:
    """Every config class reachable from the run config and the registries, nested sections and the base that
    declares the fields of a config that only builds (flowrl.engines.hf.options) included."""
    roots = [RunConfig, RolloutCorrectionConfig]
    roots += [TRAIN_ENGINES.get(n) for n in TRAIN_ENGINES.names()]
    roots += [config for config in map(_rollout_engine, ROLLOUT_ENGINES.names()) if config is not None]
    roots += [ROLES.get(n).config for n in ROLES.names()] + [ALGORITHMS.get(n).config_cls for n in ALGORITHMS.names()]
    roots += [ExecutorConfig.registry.get(n) for n in ExecutorConfig.registry.names()]
    roots += [TransportConfig.registry.get(n) for n in TransportConfig.registry.names()]
    seen: set[type[BaseModel]] = set()
    while roots:
        config = roots.pop()
        if config not in seen:
            seen.add(config)
            roots += [m for field in config.model_fields.values() for m in _models_in(field.annotation)]
            # XConfig(XOptions): the options hold the fields an engine takes, the config builds the engine
            roots += [base for base in config.__bases__ if base.__name__.endswith("Options")]
    return seen


def _rollout_engine(name: str) -> type[BaseModel] | None:
    """The registered rollout engine's config; None for one whose optional package is missing (vllm)."""
    try:
        return ROLLOUT_ENGINES.get(name)
    except ValueError:  # a name from the registry itself: only its missing package is an error
        return None


def _defaults(configs: set[type[BaseModel]]) -> dict[str, dict[str, set[str]]]:
    """option name -> repr of a default -> the classes declaring it there (a field a class declares itself, or a
    value a role section starts its engine from: ENGINE_DEFAULTS)."""
    found: dict[str, dict[str, set[str]]] = {}
    for config in configs:
        for name in config.__dict__.get("__annotations__", {}):
            field = config.model_fields.get(name)
            default = None if field is None else field.get_default(call_default_factory=True)
            if field is not None and default is not PydanticUndefined:
                found.setdefault(name, {}).setdefault(repr(default), set()).add(config.__name__)
        for name, value in config.__dict__.get("ENGINE_DEFAULTS", {}).items():
            found.setdefault(name, {}).setdefault(repr(value), set()).add(f"{config.__name__}.ENGINE_DEFAULTS")
    return found


def test_no_two_configs_hold_one_option_at_different_defaults():
    differing = {name: values for name, values in _defaults(_config_classes()).items() if len(values) > 1}
    new = {name: values for name, values in differing.items() if name not in SAME_NAME}
    assert not new, f"one option, two defaults (write it once, or say why in SAME_NAME): {new}"
    gone = set(SAME_NAME) - set(differing)
    assert not gone, f"now one default each: remove them from SAME_NAME: {gone}"


def test_the_walk_sees_two_defaults_of_one_option():
    class Outer(BaseModel):
        nested: RolloutCorrectionConfig | None = None
        is_threshold: float = 3.0  # RolloutCorrectionConfig's is 2.0

    walked = _config_classes()
    assert CheckpointConfig in walked and PlanSection in walked  # sections nested in the run config
    walked.add(Outer)
    assert _defaults(walked)["is_threshold"] == {"2.0": {"RolloutCorrectionConfig"}, "3.0": {"Outer"}}
