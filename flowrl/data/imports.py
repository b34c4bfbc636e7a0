"""Objects named by the user as "package.module:attribute" (tasks, environments)."""

from __future__ import annotations

import importlib
from typing import Any, Iterable


def import_attribute(name: str, where: str, built_in: Iterable[str]) -> Any:
    """The attribute `name` points at; otherwise one line starting with `where` (e.g. "task.name: ") naming it,
    and listing the `built_in` names it could have been."""
    module, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"{where}unknown {name!r}; built in: {sorted(built_in)}, or 'module:attribute'")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as err:  # ImportError, AttributeError, or whatever the module raises as it imports
        raise ValueError(f"{where}cannot load {name!r}: {type(err).__name__}: {err}") from None
