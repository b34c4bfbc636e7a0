"""Reading verl's command line: hydra's KEY=VALUE words and its YAML config tree as flat dotted keys; and the
hint a plain `flowrl train` gives for a verl key ("a verl key; with --verl it means ...")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.config.verl_keys import BY_KEY, VERL_SECTIONS, Mapped
from flowrl.config.verl_map import translate

SCALARS = {"true": True, "false": False, "null": None, "none": None, "~": None}


def parse_value(raw: str) -> Any:
    """A hydra value: true/false, null, a number, a [list] (YAML flow syntax), or a string (quotes removed)."""
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if text.lower() in SCALARS:
        return SCALARS[text.lower()]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.startswith("["):
        import yaml

        try:
            return [parse_value(str(item)) for item in yaml.safe_load(text)]
        except yaml.YAMLError:
            raise ValueError(f"--verl: {raw!r} is not a list") from None
    return text


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """verl's config tree as dotted keys; hydra's `defaults`, `_target_` and ${...} interpolations left out
    (verl resolves them to its defaults, which the translation applies itself)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if key in ("defaults", "_target_", "hydra"):
            continue
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif not (isinstance(value, str) and value.startswith("${")):
            flat[f"{prefix}{key}"] = value
    return flat


def read_verl_yaml(path: str) -> dict[str, Any]:
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--verl-config {path}: no such file")
    try:
        tree = yaml.safe_load(file.read_text(errors="replace")) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"--verl-config {path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(tree, dict):
        raise ValueError(f"--verl-config {path}: expected verl's config tree (a mapping), got {type(tree).__name__}")
    return flatten(tree)


def parse_words(words: list[str]) -> dict[str, Any]:
    """KEY=VALUE words (hydra's `+KEY` and `++KEY` as KEY); a word without `=` is named."""
    values = {}
    for word in words:
        key, sep, raw = word.partition("=")
        if not sep or not key.strip("+~"):
            raise ValueError(f"--verl {word!r}: expected KEY=VALUE")
        values[key.lstrip("+")] = parse_value(raw)
    return values


def from_verl(words: list[str], config_file: str | None = None) -> Mapped:
    """--verl-config's keys, then the words' (a word wins over the file)."""
    values = read_verl_yaml(config_file) if config_file else {}
    return translate({**values, **parse_words(words)})


def verl_hint(overrides: list[str], rejects: Any) -> str | None:
    """For a plain `flowrl train`: the first override that is a verl key flowrl refuses (`rejects(word)` is
    true), as "KEY: a verl key; with --verl it means TARGET"."""
    for word in overrides:
        key = word.partition("=")[0].lstrip("+")
        verl = key in BY_KEY or ("." in key and key.split(".")[0] in VERL_SECTIONS and key.split(".")[0] != "data")
        if verl and rejects(word):
            entry = BY_KEY.get(key)
            means = (f"{entry.target}" + (f" ({entry.note})" if entry.note else "") if entry and entry.target
                     else "nothing flowrl honours (docs/verl.md)")
            return f"{key}: a verl key; with --verl it means {means}"
    return None
