"""RoleConfig: a role's own section of the run config, `roles.<name>`, and what builds the role from it.

A role declares its config class where it is registered, and that class documents and checks the role's
options once (pydantic fields with descriptions and bounds):

    class JudgeConfig(flowrl.RoleConfig):
        threshold: float = Field(0.5, ge=0, le=1, description="Score at or above which a response passes.")

    @flowrl.role("judge", config=JudgeConfig)
    class Judge:
        def __init__(self, config: JudgeConfig): ...

`--set roles.judge.threshold=0.3` then reaches it. `use` binds the name to another registered role class
(`roles.reward.use=llm_judge`, or the shorthand `roles.reward=llm_judge`), whose config the section is.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class RoleConfig(BaseModel):
    """The options every role section has; a role's own config class adds its options."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)
    FLAT: ClassVar[tuple[str, ...]] = ()  # nested models whose fields the section shows at its own level
    use: str = Field("", description="The registered role class this role name is bound to ('': the class "
                                     "registered under the name itself), e.g. roles.reward.use=llm_judge.")

    def build(self, cls: type, ctx: Any) -> Any:
        """The role `cls` configured by this section (ctx: flowrl.roles.context.BuildContext). By default
        `cls(self)` when the role declares options of its own, else `cls()`; roles holding engines build them
        here (flowrl.roles.configs)."""
        return cls(self) if set(type(self).model_fields) - {"use"} else cls()

    @classmethod
    def starting_from(cls, source: "RoleConfig", values: dict[str, Any]) -> dict[str, Any]:
        """The values of a section whose role builds on `source`'s (flowrl.roles.configs: its engine values)."""
        return values


class SectionError(ValueError):
    """A bad role section: one line naming the dotted field (`roles.actor.lr: Input should be greater than 0`)."""


def engine_source(name: str, spec: Any) -> str | None:
    """The role whose section role `name`'s starts from: the first engine section its registration builds on,
    when that is another role's (the reference builds on `actor`)."""
    source = spec.engines[0] if spec.engines else None
    return source if source != name else None


def section(name: str, raw: Any, spec: Any, source: RoleConfig | None = None) -> RoleConfig:
    """Role `name`'s section (`raw`: a dict, or a validated section) as `spec.config`, starting from `source`."""
    config = spec.config
    if isinstance(raw, config):
        return raw
    values = raw.model_dump() if isinstance(raw, BaseModel) else dict(raw)
    if source is not None:
        values = config.starting_from(source, values)
    try:
        return config.model_validate(values)
    except ValidationError as err:
        raise SectionError("; ".join(f"{_dotted(name, e['loc'], config)}: {e['msg']}" for e in err.errors())) \
            from None


def sections(raw: Any, spec_of: Callable[[str], Any]) -> dict[str, Any]:
    """`roles` of a run config: each name's section validated by its bound class's config (`use`, else the name's
    own registration; `spec_of(impl)` gives it, None when not registered). A name not registered yet (a user
    role whose module the algorithm imports) keeps its dict, validated once the run knows its roles."""
    if not isinstance(raw, dict):
        raise SectionError(f"roles: expected a mapping of role names to their sections, e.g. "
                           f"{{'actor': {{'lr': 1e-6}}}}, got {raw!r}")
    done: dict[str, Any] = {}

    def resolve(name: str) -> Any:
        if name not in done:
            value = raw.get(name, {})
            value = {"use": value} if isinstance(value, str) else value
            if not isinstance(value, (dict, BaseModel)):
                raise SectionError(f"roles.{name}: expected a section (a mapping of options) or a registered role "
                                   f"name, got {value!r}")
            impl = (value.get("use") if isinstance(value, dict) else value.use) or name
            spec = spec_of(impl)
            if spec is None and impl != name:
                raise SectionError(f"roles.{name}.use: unknown role {impl!r}")
            source = engine_source(name, spec) if spec is not None else None
            done[name] = value if spec is None else section(name, value, spec, resolve(source) if source else None)
        return done[name]

    return {name: resolve(name) for name in raw}


def _dotted(name: str, loc: tuple[Any, ...], config: type[RoleConfig]) -> str:
    """The error's field as the user writes it: a section's flattened parts (its engine) are not in the key."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in config.FLAT:  # its own checks (which engine, a decay needing its steps) name the section
        parts = parts[1:]
    return ".".join(("roles", name, *parts))
