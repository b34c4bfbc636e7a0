"""Role factories: build a plan's roles from the run configuration, in whichever process hosts them.

Executors receive a RoleFactory, never the run configuration: the local
executor's roles come from `factory.build(names)`, and each Ray pool's ranks
build theirs from `factory.for_pool(pool)` (the pool's device and its share of
the batch sizes). Each role builds from a BuildContext holding its own section of the run config
(`roles.<name>`: flowrl.graph.role.RoleSpec.build).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flowrl.config import RunConfig
from flowrl.data.dataset import DatasetTask
from flowrl.engines.configs import ModelSource
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.graph.role import RoleSpec
from flowrl.plan.placement import Pool
from flowrl.plan.planner import Plan
from flowrl.roles.configs import EngineRoleConfig, TrainRoleConfig
from flowrl.roles.context import BuildContext, UpdateSettings


def model_path(cfg: RunConfig, task: Any) -> Path:
    """The configured model folder, or the built-in tiny model (built once) for the task's alphabet."""
    if cfg.model.path is not None:
        return model_folder(cfg.model.path, "model.path")
    return build_tiny_model(Path(cfg.train.output_dir) / "tiny-model", chars=task.chars,
                            hidden_size=cfg.model.tiny_hidden_size, num_layers=cfg.model.tiny_num_layers,
                            seed=cfg.train.seed)


def model_folder(path: str, field: str) -> Path:
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{field}: {path!r} is not a Hugging Face model folder (no config.json)")
    return Path(path)


@dataclass(frozen=True)
class RoleFactory:
    """Builds roles by name in this process; picklable, so Ray workers build their pool's roles with it."""

    context: BuildContext
    specs: dict[str, RoleSpec]

    @property
    def seed(self) -> int:
        return self.context.seed

    def build(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The roles in `names`, each role's weight source or base (if among them) built first."""
        built: dict[str, Any] = {}
        base = replace(self.context, roles=built)
        for name in _sources_first(names, self.specs):
            built[name] = self.specs[name].build(base.named(name))
        return built

    def for_pool(self, pool: Pool) -> "RoleFactory":
        """The factory a Ray pool's ranks build from: its device, and one rank's share of the batch sizes."""
        return replace(self, context=replace(self.per_rank(pool).context, device=pool.device))

    def per_rank(self, pool: Pool) -> "RoleFactory":
        """The factory with one rank's share (Pool.share) of each role's global batch sizes (roles.<name>.*):
        what a Ray pool's ranks and the local executor's torchrun ranks build from."""
        c = self.context
        shared = {role: _share(s, pool, role, c.sections[role]) for role, s in c.role_settings.items()}
        return replace(self, context=replace(c, role_settings=shared))

    def folders(self) -> tuple[Path, ...]:
        """The model folders its roles load from (model.path, model.reward_path, roles.<name>.model)."""
        c = self.context
        return (c.model.path, *((c.reward_model.path,) if c.reward_model is not None else ()),
                *(source.path for source in c.role_models.values()))

    def relocated(self, moved: dict[str, Path]) -> "RoleFactory":
        """The factory loading each model folder from `moved[str(folder)]` (e.g. a node's copy of it)."""
        c = self.context
        reward = None if c.reward_model is None else replace(c.reward_model, path=moved[str(c.reward_model.path)])
        model = replace(c.model, path=moved[str(c.model.path)])
        own = {name: replace(source, path=moved[str(source.path)]) for name, source in c.role_models.items()}
        return replace(self, context=replace(c, model=model, reward_model=reward, role_models=own))


def make_factory(cfg: RunConfig, plan: Plan, task: Any, path: Path, extra: dict[str, RoleSpec] | None = None) -> RoleFactory:
    """The factory for `plan`'s roles (and `extra` ones, e.g. the evaluation's) under run config `cfg`."""
    t, m = cfg.train, cfg.model
    reward_model = None if m.reward_path is None else ModelSource(model_folder(m.reward_path, "model.reward_path"),
                                                                  m.dtype)
    specs = {**(extra or {}), **plan.specs}
    sections = {name: cfg.section(name, spec) for name, spec in specs.items()}
    own = {name: ModelSource(model_folder(section.model, f"roles.{name}.model"), m.dtype, m.gradient_checkpointing)
           for name, section in sections.items() if isinstance(section, EngineRoleConfig) and section.model}
    settings = {name: section.update_settings(t.balance_batch) for name, section in sections.items()
                if isinstance(section, TrainRoleConfig)}  # each role's passes sized by its own section
    context = BuildContext(model=ModelSource(path, m.dtype, m.gradient_checkpointing), sections=sections,
                           device=t.device, role_settings=settings, seed=t.seed, task=task, reward_model=reward_model,
                           shared=plan.shared(),
                           reward_fn_timeout_s=None if isinstance(task, DatasetTask) else cfg.data.reward_fn_timeout_s,
                           role_models=own, sync_timeout_s=cfg.sync.timeout_s)
    return RoleFactory(context, specs)


def _share(settings: UpdateSettings, pool: Pool, role: str, section: TrainRoleConfig) -> UpdateSettings:
    """One rank's share of role `role`'s global batch sizes on `pool` (those its section has)."""
    return replace(settings, **{key: pool.share(getattr(settings, key), f"roles.{role}.{key}")
                                for key in ("mini_batch_size", "micro_batch_size", "forward_micro_batch_size")
                                if key in type(section).model_fields})


def _sources_first(names: tuple[str, ...], specs: dict[str, RoleSpec]) -> list[str]:
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for source in (specs[name].weights_from, specs[name].base_of):
            if source in names:
                visit(source)
        order.append(name)

    for name in names:
        visit(name)
    return order
