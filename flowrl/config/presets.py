"""Named presets: option values a setting picks where the run sets none.

`cuda` is what `train.device=cuda` changes from the CPU defaults: the configuration of docs/benchmarks.md's H200
runs (the static-cache rollout with its captured decode loop, compiled train passes, 128-row no-grad forward
passes). `flowrl config` prints it; flowrl.config.load_run_config applies it to the raw values (`apply_cuda`),
leaving every key the run set.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "cuda": {"roles.rollout.engine": "hf_static", "roles.actor.compile": True,
             "roles.actor.forward_micro_batch_size": 128, "roles.critic.forward_micro_batch_size": 128},
}
"""Each preset's values by dotted key; `cuda` is applied when train.device is cuda."""


def preset_lines() -> list[str]:
    """`flowrl config`'s lines of the presets: `preset.<name>  <key> = <value>`."""
    return [f"{'preset.' + name:32s} {key} = {value!r}" for name, values in PRESETS.items()
            for key, value in values.items()]


def apply_cuda(values: dict[str, Any], rollout_options: frozenset[str] = frozenset()) -> None:
    """The `cuda` preset filled into a run's raw config values when train.device is cuda, leaving every key the
    run set, and leaving a section alone whose engine, or one of whose keys, is not the preset's (an actor on
    another engine; a rollout section naming an engine, or a key the static-cache engine lacks: that of another
    engine). `rollout_options`: the rollout section's keys that are the role's own, not its engine's."""
    if values.get("train", {}).get("device") != "cuda":
        return
    from flowrl.engines.configs import ROLLOUT_ENGINES  # torch: imported when needed

    preset = PRESETS["cuda"]
    roles = values.setdefault("roles", {})
    rollout, actor = roles.get("rollout", {}), roles.get("actor", {})
    engine = preset["roles.rollout.engine"]
    static_keys = set(ROLLOUT_ENGINES.get(engine).model_fields) | rollout_options
    if isinstance(rollout, dict) and "engine" not in rollout and set(rollout) <= static_keys:  # (not a binding)
        roles["rollout"] = {**rollout, "engine": engine}  # micro_batch_size: hf's own
    if isinstance(actor, dict) and actor.get("engine", "hf") == "hf":
        roles["actor"] = {"compile": preset["roles.actor.compile"], **actor}
    for key, value in preset.items():  # the no-grad passes' sizes: each role's own (others start from the actor's)
        name, _, field = key.removeprefix("roles.").partition(".")
        if field == "forward_micro_batch_size" and isinstance(roles.get(name, {}), dict):
            roles[name] = {field: value, **roles.get(name, {})}
