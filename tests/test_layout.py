"""The package layout shows the architecture: layers as packages, imports only going down, no cycles."""

import ast
import functools
import re
from pathlib import Path

import networkx as nx
import pytest

from flowrl.data.batch import MODEL_INPUT
from flowrl.graph.role import ROLES
from flowrl.roles.rollout import GENERATED

ROOT = Path(__file__).parent.parent / "flowrl"
PACKAGES = {"flowrl": ROOT, "algorithms": ROOT.parent / "algorithms"}
LAYERS = [("errors", "metrics"), ("data",), ("graph",), ("engines",), ("rl",), ("roles",), ("algorithms",), ("plan",),
          ("config",), ("runtime",), ("cli", "__main__", "__init__")]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
FIELDS = {*MODEL_INPUT, *GENERATED, "uid", "old_logprobs", "ref_logprobs", "values", "scores", "advantages",
          "returns", "token_rewards"}


@functools.cache
def modules() -> dict[str, Path]:
    """flowrl's modules by dotted name (walked once: imports() asks for each `from flowrl... import` it reads)."""
    return {".".join(("flowrl", *p.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__"): p
            for p in ROOT.rglob("*.py")}


MODULE_STRING = re.compile(r"flowrl(\.\w+)+\.?(:\w+)?")  # "flowrl.roles.actor:Actor"; "flowrl.roles." heads an f-string


def imports(path: Path, module: str, top_level_only: bool = False) -> set[str]:
    """The flowrl modules `path` imports (`from flowrl import x` resolved to flowrl.x where x is a module),
    function-local imports and those under `if TYPE_CHECKING:` included unless `top_level_only`."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("flowrl")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flowrl"):
            known = modules()
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                      for a in node.names}
    return found


def named_modules(path: Path) -> set[str]:
    """The flowrl modules that string constants of `path` name for a lazy import: "flowrl.x.y:attr",
    "flowrl.x.y", or the head of an f-string such as f"flowrl.roles.{name}" (prose that mentions one is not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.fullmatch(node.value):
            found.add(node.value.partition(":")[0].rstrip("."))
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_at_most_six_modules_at_the_top_and_each_in_a_layer():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 6, top
    assert {layer(m) for m in modules()} <= set(RANK), {layer(m) for m in modules()} - set(RANK)


MAX_MODULES = 15
LARGER_PACKAGES = {"algorithms": "the catalogue of prebuilt algorithms: one small preset file each, a list, not a "
                                 "corridor of split files"}


@pytest.mark.parametrize("folder", sorted({str(p.parent.relative_to(ROOT.parent)) for top in PACKAGES.values()
                                           for p in top.rglob("*.py")} - set(LARGER_PACKAGES)))
def test_no_package_holds_more_than_fifteen_modules(folder):
    """A package past ~15 modules is a flat corridor: group it into wings by concern (issue 42 point 3)."""
    own = sorted(p.name for p in (ROOT.parent / folder).glob("*.py") if p.name != "__init__.py")
    assert len(own) <= MAX_MODULES, f"{folder}: {len(own)} modules {own}"


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_only_go_down_the_layers(module):
    """Top-level and function-local imports, and "module:attribute" strings for a lazy import, alike."""
    path = modules()[module]
    for target in sorted(imports(path, module) | named_modules(path)):
        assert RANK[layer(target)] <= RANK[layer(module)], f"{module} ({layer(module)}) imports {target}"


def test_no_import_cycles():
    """Function-local imports count: one that breaks a cycle at import time still ties the modules together;
    so do imports for type annotations only, under `if TYPE_CHECKING:` (a type two modules share goes to a
    protocol or to the lower module)."""
    graph = nx.DiGraph()
    for module, path in modules().items():
        for target in imports(path, module):
            if target in modules() and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)
    assert list(nx.simple_cycles(graph)) == []


def private_uses(path: Path, module: str, known: set[str]) -> set[tuple[int, str]]:
    """(line, `module.name`) of each private name of another flowrl or algorithms module that `path` uses:
    `from X import _name`, or `X._name` where X is a module bound by an import."""
    tree, found, bound = ast.parse(path.read_text()), set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
                elif _private(a.name) and node.module != module:
                    found.add((node.lineno, f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            bound |= {a.asname or a.name: a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = bound.get(ast.unparse(node.value))
            if owner is not None and owner != module:
                found.add((node.lineno, f"{owner}.{node.attr}"))
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_across_modules():
    """A name another module needs is public (in a neutral module where two wings share it), never `_name`."""
    paths = {".".join((top, *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__"): p
             for top, root in PACKAGES.items() for p in root.rglob("*.py")}
    found = [f"{path.relative_to(ROOT.parent)}:{line} uses {name}" for module, path in sorted(paths.items())
             for line, name in sorted(private_uses(path, module, set(paths)))]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("path", [*sorted((ROOT / "plan").glob("*.py")),
                                  *(ROOT / "runtime" / f for f in ("executor.py", "ray/executor.py",
                                                                    "ray/pools.py", "ray/nodes.py",
                                                                    "ray/worker.py", "scheduling.py",
                                                                    "offpolicy/buffering.py"))])
def test_the_planner_and_executors_name_no_role_and_no_field(path):
    """(runtime/ and config/ as a whole: test_runtime_and_config_name_no_role below.)"""
    strings = {node.value for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & set(ROLES.names()), strings & set(ROLES.names())
    assert not strings & FIELDS, strings & FIELDS


ROLE_LITERALS_ALLOWED = {  # (module, role name): why the literal stays
    **{("config/run_config.py", name): "the named accessors of the built-in roles' sections (cfg.actor, cfg.critic, "
       "cfg.rollout), the deprecated sections' and judge options' alias tables (LEGACY_SECTIONS, LEGACY_JUDGE) and "
       "model.reward_path's binding of `reward` to `reward_model`"
       for name in ("actor", "critic", "rollout", "reward", "reward_model", "llm_judge")},
    **{(module, name): "verl's own key and section names (the verl translation), not flowrl's roles"
       for module, name in (("config/verl_algo.py", "kl_ctrl"), ("config/verl_keys.py", "critic"),
                            ("config/verl_keys.py", "reward_model"), ("config/verl_map.py", "rollout"),
                            ("config/verl_map.py", "ref"))},
    ("config/presets.py", "actor"): "the `cuda` preset is data naming the sections it fills, as a config file does",
    ("config/presets.py", "rollout"): "the `cuda` preset is data naming the sections it fills, as a config file does",
    ("config/loading.py", "rollout"): "the `cuda` preset's rollout section: its role's own keys",
    ("runtime/data_tasks.py", "reward"): "data.reward, the data section's field, as a task's keyword",
    ("runtime/store/export.py", "reward"): "data.reward, the data section's field",
    ("runtime/observe/plotting.py", "reward"): "a panel's title (the reward/mean metric)",
    ("runtime/trainer.py", "reward"): "the step line's label of the reward/mean metric",
}


@pytest.mark.parametrize("path", [*sorted((ROOT / "runtime").rglob("*.py")), *sorted((ROOT / "config").rglob("*.py"))])
def test_runtime_and_config_name_no_role(path):
    """No string literal equal to a registered role's name in runtime/ or config/ (issue 42 point 4): the roles'
    declared traits (trainable, exported, their config class) say what a literal would; the few that stay are
    allow-listed above with their reason."""
    module = str(path.relative_to(ROOT))
    found = {node.value for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in set(ROLES.names())}
    assert {name for name in found if (module, name) not in ROLE_LITERALS_ALLOWED} == set()


def test_the_role_literal_allow_list_holds_only_literals_still_there():
    found = {(str(path.relative_to(ROOT)), node.value) for folder in ("runtime", "config")
             for path in (ROOT / folder).rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in set(ROLES.names())}
    assert set(ROLE_LITERALS_ALLOWED) - found == set(), "gone: remove them from ROLE_LITERALS_ALLOWED"
