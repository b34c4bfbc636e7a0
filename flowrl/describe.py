"""Print config fields with their defaults and descriptions (the one place they are documented)."""

from __future__ import annotations

from typing import Any, Iterator

from pydantic import BaseModel


def config_lines(model: type[BaseModel], prefix: str = "", values: BaseModel | None = None) -> Iterator[str]:
    """One line per leaf field; `values` (an instance) supplies defaults set by a parent's default_factory."""
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        default: Any = getattr(values, name) if values is not None else info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            yield from config_lines(type(default), f"{key}.", default)
            continue
        yield f"{key:32s} {default!r:>14}  {info.description or ''}"
