"""Loading a RunConfig: a JSON, YAML or TOML file, `--set a.b=value` overrides, and validation whose
error is one line naming each bad field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, ValidationError

from flowrl.graph.role import ROLES
from flowrl.graph.role_config import SectionError
from flowrl.config.presets import apply_cuda
from flowrl.config.moved_keys import move_train_keys
from flowrl.config.run_config import RunConfig, move_legacy_sections


def format_error(err: ValidationError, prefix: str = "") -> str:
    parts = []
    for e in err.errors():
        if isinstance(e.get("ctx", {}).get("error"), SectionError):  # a role section's: already one dotted line
            parts.append(str(e["ctx"]["error"]))
            continue
        loc = ".".join(str(p) for p in (prefix, *e["loc"]) if p != "")
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)


def validate(model: type[BaseModel], values: dict[str, Any], prefix: str = "", strict: bool | None = None) -> Any:
    """Build `model` from values, raising ValueError that names each bad field; `strict` refuses coercion
    ("4" or 4.0 for an int) in a model not strict itself. No float anywhere in it may be inf or nan."""
    try:
        built = model.model_validate(values, strict=strict)
    except ValidationError as err:
        raise ValueError(f"invalid config: {format_error(err, prefix)}") from None
    bad = next(non_finite(built.model_dump(), prefix), None)
    if bad is not None:
        raise ValueError(f"invalid config: {bad[0]}: {bad[1]} is not a finite number")
    return built


def non_finite(value: Any, where: str = "") -> Iterator[tuple[str, float]]:
    """(dotted name, value) of every inf or nan float in nested dicts and lists."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from non_finite(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from non_finite(item, f"{where}[{i}]")


def set_dotted(values: dict[str, Any], key: str, raw: str) -> None:
    """Apply one `a.b=value` override; the value is parsed as JSON when it can be."""
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        if isinstance(node.get(part), str) and node is values.get("roles"):
            node[part] = {"use": node[part]}  # roles.<name>=<class> is roles.<name>.use, beside its options
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"--set {key}: {part!r} is not a section")
    if isinstance(value, str) and isinstance(node.get(leaf), dict) and node is values.get("roles"):
        node[leaf]["use"] = value
    else:
        node[leaf] = value


def load_run_config(path: str | None = None, overrides: list[str] = ()) -> RunConfig:
    values: dict[str, Any] = read_config_file(path) if path else {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected key=value")
        set_dotted(values, key.strip(), raw.strip())
    values = move_legacy_sections(move_train_keys(values))
    apply_cuda(values, frozenset(ROLES.get("rollout").config.model_fields) - {"engine"})
    return validate(RunConfig, values)


def read_config_file(path: str) -> dict[str, Any]:
    """A JSON, YAML or TOML file of RunConfig values (by suffix); every problem is one line naming the file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--config {path}: no such file")
    text = file.read_text(errors="replace")
    suffix = file.suffix.lower()
    try:
        if suffix == ".json":
            values = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml  # optional: JSON and TOML configs need nothing extra

            values = yaml.safe_load(text)
        elif suffix == ".toml":
            import tomllib

            values = tomllib.loads(text)
        else:
            raise ValueError(f"--config {path}: unknown format {suffix or '(no suffix)'!r}; use .json, .yaml or .toml")
    except ValueError as err:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        if str(err).startswith("--config"):
            raise
        raise ValueError(f"--config {path}: not valid {suffix[1:].upper()}: {err}") from None
    except Exception as err:  # yaml's errors
        raise ValueError(f"--config {path}: not valid YAML: {' '.join(str(err).split())}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a mapping of sections, got {type(values).__name__}")
    return values
