"""The graph drawn: Mermaid and DOT source of plans, and the Jupyter rendering of algorithms and plans."""

from flowrl.algorithms import dapo, grpo
from flowrl.config import load_run_config
from flowrl.data.builtin.arithmetic import ArithmeticTask
from flowrl.runtime.trainer import make_plan
import cli_process


def test_a_plan_renders_every_node_and_edge_as_mermaid_and_dot():
    plan = make_plan(load_run_config(None, []), dapo, ArithmeticTask(4))
    ids = {node.name: f"n{i}" for i, node in enumerate(plan.nodes)}
    chart, dot = plan.mermaid(), plan.dot()
    assert chart.startswith("flowchart TB")
    assert '[/"rollout.generate @global"/]' in chart and '{{"_fill @driver"}}' in chart  # rows and fill shapes
    assert '("group_advantage @driver (stage)")' in chart
    edges = [(a, b) for a, b in plan.graph.edges if a in ids and b in ids]
    assert len(edges) > 5
    for a, b in edges:
        assert f"{ids[a]} --> {ids[b]}" in chart and f"{ids[a]} -> {ids[b]};" in dot
    assert dot.startswith('digraph "plan dapo" {') and dot.rstrip().endswith("}")


def test_algorithms_and_plans_show_as_charts_in_jupyter():
    bundle = grpo._repr_mimebundle_()
    assert bundle["text/markdown"].startswith("```mermaid\nflowchart TB") and "actor.update" in bundle["text/markdown"]
    plan = make_plan(load_run_config(None, []), grpo, ArithmeticTask(4))
    assert plan._repr_mimebundle_()["text/plain"] == plan.describe()


def test_flowrl_plan_prints_the_format_asked_for(tmp_path):
    for fmt, start in (("mermaid", "flowchart TB"), ("dot", 'digraph "plan grpo" {')):
        done = cli_process.run("plan", "grpo", "--format", fmt, cwd=tmp_path, timeout=300)
        assert done.returncode == 0 and done.stdout.startswith(start), done.stderr
