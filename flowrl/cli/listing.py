"""What `flowrl algorithms` and `flowrl config [ALGO]` print: the registered algorithms, one line each; every
config field with its default and description, each registered engine's own options and an algorithm's algo.*
options. Their imports happen when called, so the command line starts at once."""

from __future__ import annotations

import sys


def algorithm_lines() -> list[str]:
    """Each registered algorithm's name and the first sentence of its module's docstring."""
    import flowrl.algorithms  # noqa: F401 (registers the prebuilt ones)
    from flowrl.graph.algorithm import ALGORITHMS

    lines = []
    for name in ALGORITHMS:
        fn = ALGORITHMS.get(name).fn
        doc = (sys.modules[fn.__module__].__doc__ or fn.__doc__ or "").split("\n\n")[0]
        lines.append(f"{name:24s} {' '.join(doc.split()).split('. ')[0].rstrip('.')}")
    return lines


def engine_lines() -> list[str]:
    """The options each registered engine adds to (or sets apart from) its section's default engine."""
    from flowrl.config import RunConfig, config_lines
    from flowrl.engines import ROLLOUT_ENGINES, TRAIN_ENGINES

    defaults, lines = RunConfig(), []
    for role, registry in (("rollout", ROLLOUT_ENGINES), ("actor", TRAIN_ENGINES)):
        default, section = getattr(defaults, role), f"roles.{role}"
        shown = set(config_lines(type(default), f"{section}.", default))
        for name in registry:
            if name == default.engine:
                continue
            where, others = section, " (and the other train engines)" * (role == "actor")
            try:
                chosen = registry.get(name)
                if chosen.SECTION is not None:  # an engine of one role (the vLLM teacher)
                    where, others = f"roles.{chosen.SECTION}", ""
                options = [line for line in config_lines(chosen, f"{where}.")
                           if line not in shown and not line.startswith(f"{where}.engine ")]
            except ValueError as err:  # an engine whose package is missing
                options = [f"  ({err})"]
            lines += [f"# {where}.engine={name}{others}: its options beside the ones above", *options]
    return lines


def print_config(algorithm: str | None) -> None:
    from flowrl.config import RunConfig, config_lines, preset_lines, section_lines
    from flowrl.runtime.trainer import resolve_algorithm

    algo = resolve_algorithm(algorithm) if algorithm else None
    roles = algo.roles if algo else ("actor", "critic", "rollout")  # an algorithm's: only the roles it has
    for line in [*config_lines(RunConfig), *section_lines(RunConfig(), roles), *engine_lines(), *preset_lines()]:
        print(line)
    if algo:
        for line in config_lines(algo.config_cls, "algo."):
            print(line)
