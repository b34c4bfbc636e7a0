"""RunConfig: the sections, the weight transport, the placement, the algorithm's options and each role's
section (roles.<name>), and the move of the sections used before each role had its own."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializeAsAny, field_validator, model_validator

from flowrl.engines.weights.transport_configs import TransportConfig
import flowrl.roles  # noqa: F401 (registers the built-in roles the role sections name)
from flowrl.graph.role import ROLES, RoleSpec
from flowrl.graph.role_config import RoleConfig, SectionError, engine_source, section, sections
from flowrl.plan.placement import Placement
from flowrl.plan.calibrate import PlanSection
from flowrl.config.moved_keys import move_train_keys
from flowrl.config.sections import (CheckpointConfig, DataConfig, DebugConfig, EvalConfig, ExecutorSection,
                                    ModelConfig, Section, TaskConfig, TrainConfig)


class RunConfig(Section):
    algorithm: str = Field("grpo", description="A registered name (flowrl.graph.algorithm.ALGORITHMS: the prebuilt ones) "
                                                  "or 'module:attribute'.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    executor: ExecutorSection = Field(default_factory=ExecutorSection)
    debug: DebugConfig = Field(default_factory=DebugConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    sync: SerializeAsAny[TransportConfig] = Field(
        default_factory=lambda: TransportConfig.model_validate({}), description="The weight transport "
        "(`sync.transport`, a name in flowrl.engines.weights.transport_configs.TRANSPORTS) and its options.")
    placement: Placement | Literal["auto"] = Field("auto", description="Resource pools, or 'auto': every model "
                                                   "role on one pool (the hybrid engine) of one rank per torchrun "
                                                   "rank, or with executor.name=ray on CUDA, of every GPU of the "
                                                   "Ray cluster (split by executor.rollout_share).")
    algo: dict[str, Any] = Field(default_factory=dict, description="The algorithm's own options, validated "
                                                                   "by its config class.")
    plan: PlanSection = Field(default_factory=PlanSection, description="The planner's prediction for this run's "
                              "layout (flowrl.runtime.layout.plan_record).")
    roles: dict[str, Any] = Field(default_factory=dict, description="Each role's own section, roles.<name>: "
                                  "its engine and options (roles.actor.lr, roles.rollout.engine, roles.rollout.env, "
                                  "roles.judge.<option>), validated by the role's config class; `use` (or "
                                  "roles.<name>=<role>) binds the name to another registered role class, e.g. "
                                  "roles.reward=llm_judge. `flowrl config ALGO` lists the sections of its roles.")

    @model_validator(mode="before")
    @classmethod
    def _legacy_sections(cls, data: Any) -> Any:
        return move_legacy_sections(move_train_keys(data)) if isinstance(data, dict) else data

    @field_validator("placement", mode="wrap")
    @classmethod
    def _auto_or_pools(cls, value: Any, handler: Any) -> Any:
        """One error naming the bad pool field, not one per kind of placement."""
        if value == "auto" or isinstance(value, Placement):
            return value
        if isinstance(value, str):
            raise ValueError(f"expected 'auto' or pools ({{\"pools\": [...]}}), got {value!r}")
        return Placement.model_validate(value)

    @field_validator("roles", mode="before")
    @classmethod
    def _sections(cls, roles: Any) -> dict[str, Any]:
        return sections(roles, _registered)

    @property
    def actor(self) -> Any:
        """The actor's engine config (roles.actor)."""
        return self.section("actor").engine

    @property
    def critic(self) -> Any:
        return self.section("critic").engine

    @property
    def rollout(self) -> Any:
        """The rollout's engine config (roles.rollout; its environment options are the section's own)."""
        return self.section("rollout").engine

    def section(self, name: str, spec: RoleSpec | None = None) -> RoleConfig:
        """Role `name`'s section, roles.<name> (its defaults when the run sets none), as `spec`'s config class
        (default: the class bound to the name)."""
        spec = spec or ROLES.get(self._bound(name))
        source = engine_source(name, spec)
        return section(name, self.roles.get(name, {}), spec, self.section(source) if source else None)

    def _bound(self, name: str) -> str:
        value = self.roles.get(name, {})
        return (value.get("use") if isinstance(value, dict) else getattr(value, "use", "")) or name

    def role_classes(self, algorithm_roles: tuple[str, ...] = ()) -> dict[str, type]:
        """The classes bound to role names for this run (every other role keeps its registered class).

        model.reward_path alone scores the `reward` role with the learned reward model, unless the algorithm
        uses the `reward_model` role itself (then `reward` stays the task's reward function).
        """
        bindings = {name: self._bound(name) for name in self.roles if self._bound(name) != name}
        if self.model.reward_path is not None and "reward_model" not in algorithm_roles:
            bindings.setdefault("reward", "reward_model")
        return {name: ROLES.get(impl).cls for name, impl in bindings.items()}

    def check_roles(self, specs: dict[str, RoleSpec]) -> None:
        """Each section of a role the run builds (`specs`), checked by that role's config; a section naming no
        registered role is an error in one line."""
        for name in self.roles:
            if name in specs:
                self.section(name, specs[name])
            elif self._bound(name) not in ROLES:
                raise SectionError(f"roles.{name}: no role {name!r} is registered; registered roles are "
                                   f"{ROLES.names()}")


LEGACY_SECTIONS = ("actor", "critic", "rollout")
"""The engine sections of the run config before each role had its own (issue 24): `actor.lr` is roles.actor.lr."""


LEGACY_JUDGE = {"judge_template": "template", "judge_max_score": "max_score",
                "judge_max_new_tokens": "answer_tokens"}
"""The generative judge's options that were data.* keys: now its section's (flowrl.roles.judge.JudgeConfig)."""


def move_legacy_sections(values: dict[str, Any]) -> dict[str, Any]:
    """`actor.*`, `critic.*` and `rollout.*` moved under roles.<name>, and data.judge_* under the judge's
    section (what roles.<name> sets wins); each key used says once that it is deprecated."""
    legacy = [name for name in LEGACY_SECTIONS if name in values]
    roles = values.get("roles", {})
    if not isinstance(roles, dict):
        return values
    values, roles = dict(values), dict(roles)
    _move_judge_options(values, roles)
    for name in legacy:
        given = values.pop(name)
        old, new = (_as_values(given, name), _as_values(roles.get(name, {}), f"roles.{name}"))
        _refuse_conflicts(_set_values(given, old), _set_values(roles.get(name), new), name, f"roles.{name}")
        roles[name] = {**old, **new}
        for key in old:
            warnings.warn(f"{name}.{key} is deprecated; use roles.{name}.{key}", FutureWarning, stacklevel=2)
    values["roles"] = roles
    return values


def _move_judge_options(values: dict[str, Any], roles: dict[str, Any]) -> None:
    """data.judge_* into the section of each role name bound to llm_judge (llm_judge's own if none is)."""
    data = values.get("data")
    moved = {key: data[key] for key in LEGACY_JUDGE if key in data} if isinstance(data, dict) else {}
    if not moved:
        return
    values["data"] = {k: v for k, v in data.items() if k not in moved}
    bound = [name for name, section in roles.items() if _as_values(section, name).get("use") == "llm_judge"]
    for name in bound or ["llm_judge"]:
        section = _as_values(roles.get(name, {}), f"roles.{name}")
        _refuse_conflicts({LEGACY_JUDGE[key]: value for key, value in moved.items()},
                          _set_values(roles.get(name), section), "data", f"roles.{name}",
                          {new: old for old, new in LEGACY_JUDGE.items()})
        roles[name] = {**{LEGACY_JUDGE[key]: value for key, value in moved.items()}, **section}
        for key in moved:
            warnings.warn(f"data.{key} is deprecated; use roles.{name}.{LEGACY_JUDGE[key]}", FutureWarning,
                          stacklevel=3)


def _refuse_conflicts(old: dict[str, Any], new: dict[str, Any], old_where: str, new_where: str,
                      old_keys: dict[str, str] | None = None) -> None:
    """One line when a deprecated key and its new place are both given, with different values (one would be
    dropped without a word); the same value twice is accepted (the deprecation line says the rest)."""
    for key in old.keys() & new.keys():
        if not _same(old[key], new[key]):
            raise SectionError(f"{old_where}.{(old_keys or {}).get(key, key)}={old[key]!r} and {new_where}.{key}="
                               f"{new[key]!r} disagree; give it once, as {new_where}.{key}")


def _same(a: Any, b: Any) -> bool:
    """Equal values, numbers spelled differently included ("1e-3" and 0.001)."""
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _set_values(section: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The options a section sets: a config object's own (not its defaults), a mapping's all."""
    return section.model_dump(exclude_unset=True) if isinstance(section, BaseModel) else values


def _as_values(section: Any, where: str) -> dict[str, Any]:
    if isinstance(section, BaseModel):
        return section.model_dump()
    if isinstance(section, str):
        return {"use": section}
    if not isinstance(section, dict):
        raise SectionError(f"{where}: expected a section (a mapping of options), got {section!r}")
    return section


def _registered(name: str) -> RoleSpec | None:
    return ROLES.get(name) if name in ROLES else None
