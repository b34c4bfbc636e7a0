"""Objects named by the user as "package.module:attribute" or "path/to/file.py:attribute" (algorithms, tasks,
environments, reward scorers, tool-call formats): one resolver for all of them.

A module beside the user (`mytasks:MyTask` run from the folder holding mytasks.py) is found without
PYTHONPATH=.: the working directory is searched after every installed package, as `python -m` would
search it first. A file is imported by its path; its module is left out of sys.modules afterwards, so
cloudpickle sends what it defines to Ray workers by value.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable


def import_attribute(name: str, where: str, built_in: Iterable[str], kind: str = "") -> Any:
    """The attribute `name` points at; otherwise one line starting with `where` (e.g. "task.name: ") naming it
    (a `kind` of thing: "scorer"), and listing the `built_in` names it could have been. The one resolver of
    flowrl for names the user writes: algorithms, tasks, environments, rewards and tool formats."""
    target, sep, attr = name.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"{where}unknown {kind + ' ' if kind else ''}{name!r}; built in: {sorted(built_in)}, or "
                         f"'module:attribute' or 'file.py:attribute'")
    try:
        module = import_file(target) if target.endswith(".py") else import_module(target)
        return getattr(module, attr)
    except Exception as err:  # ImportError, AttributeError, or whatever the module raises as it imports
        raise ValueError(f"{where}cannot load {name!r}: {type(err).__name__}: {err}") from None


def import_module(name: str) -> ModuleType:
    """`importlib.import_module`, and if the module's top package is not installed, from the working directory."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        top, cwd = name.split(".")[0], os.getcwd()
        if err.name != top or cwd in sys.path or not _beside(Path(cwd), top):
            raise
        sys.path.append(cwd)
        return importlib.import_module(name)


def import_file(path: str) -> ModuleType:
    """The Python file at `path` as a module (imported once per file and process)."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ImportError(f"no file {str(file)!r}")
    name = f"flowrl_user_{file.stem}_{hashlib.sha1(str(file).encode()).hexdigest()[:8]}"
    if name not in _FILES:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # while it runs: dataclasses and pydantic look their module up
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
        _FILES[name] = module
    return _FILES[name]


_FILES: dict[str, ModuleType] = {}


def _beside(folder: Path, top: str) -> bool:
    return (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()
