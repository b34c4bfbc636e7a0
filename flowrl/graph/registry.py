"""Registry: an open name -> object table, filled by decorators or lazily by "module:attribute" strings.

Roles, engines and algorithms are found by name in one of these, so adding
one is registering it, never editing a tuple or an if-chain. A lazy entry is
imported on first use (verl's rollout registry does the same), so an engine
whose package is heavy or missing costs nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, obj: T | str | None = None, *, replace: bool = False) -> Callable[[T], T] | T:
        """`registry.register("hf", HFConfig)`, `registry.register("x", "pkg.mod:Attr")` (lazy), or a decorator."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def put(value: T | str) -> T | str:
            old = self._entries.get(name)
            lazy_resolved = isinstance(old, str) and not isinstance(value, str)  # the lazy entry's module ran
            if old is not None and old is not value and not replace and not lazy_resolved \
                    and not _same_definition(old, value):
                raise ValueError(f"{self.kind} {name!r} is already registered ({_describe(old)}); "
                                 f"pass replace=True to override it")
            self._entries[name] = value
            return value

        return put if obj is None else put(obj)

    def get(self, name: str) -> T:
        """The entry called `name` (imported now if it was registered lazily)."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {self.names()}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attr = entry.partition(":")
            try:
                loaded = getattr(importlib.import_module(module), attr)
            except ImportError as err:
                raise ValueError(f"{self.kind} {name!r} needs {err.name or module!r}, which is not installed "
                                 f"({err})") from None
            if self._entries[name] is entry:  # importing the module may have registered the real entry itself
                self._entries[name] = loaded
            entry = self._entries[name]
        return entry

    def raw(self, name: str) -> T | str | None:
        """The entry as registered (a lazy one stays a "module:attribute" string); None if absent."""
        return self._entries.get(name)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _same_definition(old: object, new: object) -> bool:
    """A module re-imported (a notebook cell run twice, pickled classes in workers) redefines its entries."""
    return getattr(old, "__qualname__", None) == getattr(new, "__qualname__", 0) and \
        getattr(old, "__module__", None) == getattr(new, "__module__", 0)


def _describe(entry: object) -> str:
    return entry if isinstance(entry, str) else f"{getattr(entry, '__module__', '?')}." \
                                                 f"{getattr(entry, '__qualname__', repr(entry))}"
