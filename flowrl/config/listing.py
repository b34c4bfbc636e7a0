"""`flowrl config`'s listing: one line per option with its default and description."""

from __future__ import annotations

from typing import Any, Iterator

from pydantic import BaseModel

from flowrl.config.run_config import RunConfig


def config_lines(model: type[BaseModel], prefix: str = "", values: BaseModel | None = None) -> Iterator[str]:
    """One line per leaf field with its default and description (the one place they are documented);
    `values` (an instance) supplies defaults set by a parent's default_factory."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        default: Any = getattr(values, name) if values is not None else info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):  # a role section's engine shows at the section's level (FLAT)
            yield from config_lines(type(default), prefix if name in getattr(model, "FLAT", ()) else f"{key}.", default)
            continue
        yield f"{key:32s} {default!r:>14}  {info.description or ''}"


def section_lines(cfg: RunConfig, names: Iterator[str] | tuple[str, ...]) -> list[str]:
    """The options of each named role's section, roles.<name>.* (`use` is described once, under `roles`)."""
    lines = []
    for name in names:
        section = cfg.section(name)
        lines += [line for line in config_lines(type(section), f"roles.{name}.", section)
                  if not line.startswith(f"roles.{name}.use ")]
    return lines
