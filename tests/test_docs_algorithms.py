"""docs/algorithms.md's table of every prebuilt algorithm agrees with the code: each registered algorithm has
one row, with its graph's line count (as tests/test_algorithm_size.py counts) and its config's fields; the two
algorithms of "Writing your own" are as short as the page says and train from their file."""

import inspect
import math
import re
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from fakes import ROLE_CLASSES
from flowrl.algorithms import REGISTRY
from flowrl.config import load_run_config
from flowrl.graph.role import ROLES
from flowrl.runtime.trainer import resolve_algorithm, train

DOC = Path(__file__).parent.parent / "docs" / "algorithms.md"
INPUTS = {"prompt_ids", "prompt_mask", "uid", "answer"}
CLASSES = {**ROLE_CLASSES, "kl_ctrl": ROLES.get("kl_ctrl").cls}
ROW = re.compile(r"^\| `(\w+)` \| (.+?) \| (\d+) \| (.+?) \|$")


def graph_lines(name: str) -> int:
    source = inspect.getsource(REGISTRY[name].fn)
    return len([line for line in source.splitlines() if line.strip() and not line.strip().startswith(("#", "@"))])


def config_fields(name: str) -> str:
    return ", ".join(f"`{field}`" for field in REGISTRY[name].config_cls.model_fields)


def table() -> dict[str, tuple[str, int, str]]:
    text = DOC.read_text().split("## Every algorithm", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line.strip())
        if match:
            assert match[1] not in rows, f"{match[1]} has two rows"
            rows[match[1]] = (match[2], int(match[3]), match[4])
    return rows


def test_every_algorithm_has_a_row_with_its_line_count_and_config_fields():
    rows = table()
    for name in sorted(REGISTRY):
        expected = f"| `{name}` | PAPER | {graph_lines(name)} | {config_fields(name)} |"
        assert name in rows, f"docs/algorithms.md, ## Every algorithm: no row for {name}; add {expected}"
        paper, lines, fields = rows[name]
        assert lines == graph_lines(name) and fields == config_fields(name), f"{name}: the row should be {expected}"
        assert paper.strip(), name
    assert set(rows) <= set(REGISTRY), f"rows for unknown algorithms: {set(rows) - set(REGISTRY)}"


def own_algorithms() -> list[str]:
    """The Python blocks of docs/algorithms.md's "## Writing your own" that define an algorithm."""
    text = DOC.read_text().split("## Writing your own", 1)[1].split("\n## ", 1)[0]
    return [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "@fl.algorithm" in block]


def write_block(tmp_path, name: str) -> str:
    block = next(block for block in own_algorithms() if f"def {name}(" in block)
    (tmp_path / "my_algos.py").write_text(block)
    return block


@pytest.mark.parametrize("name, most_lines", [("grpo_rank", 12), ("ppo_pull", 15)])
def test_the_two_new_algorithms_of_the_docs_are_short(name, most_lines):
    block = next(block for block in own_algorithms() if f"def {name}(" in block)
    assert len([line for line in block.splitlines() if line.strip()]) <= most_lines, block


def test_the_docs_grpo_with_a_rank_advantage_runs_from_its_file(tmp_path, monkeypatch):
    write_block(tmp_path, "grpo_rank")
    monkeypatch.chdir(tmp_path)
    algo = resolve_algorithm("./my_algos.py:grpo_rank")
    rank = algo.fn.__globals__["rank_advantage"]
    batch = TensorDict({"scores": torch.tensor([1.0, 0.0, 0.5, 2.0, 2.0]), "group": torch.tensor([0, 0, 0, 1, 1]),
                        "response_mask": torch.ones(5, 2)}, batch_size=[5])
    # group 0 ranks 1, 0, .5 -> 2r - 1 = 1, -1, 0; group 1 ties: no row below the other, rank 0 -> -1
    assert rank(batch)["advantages"][:, 0].tolist() == [1.0, -1.0, 0.0, -1.0, -1.0]
    graph, _ = algo.trace(INPUTS, CLASSES)
    expected, _ = REGISTRY["grpo"].trace(INPUTS, CLASSES)
    assert repr(graph.nodes["actor.update"]["node"].kwargs["loss"]) == repr(
        expected.nodes["actor.update"]["node"].kwargs["loss"])  # GRPO's loss, its 0.001 k3 KL included
    history = train(load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", "algorithm=./my_algos.py:grpo_rank",
                                           "train.steps=2", "checkpoint.every=0"]), progress=False)
    assert len(history) == 2 and math.isfinite(history[-1]["actor/kl_loss"])


def test_the_docs_ppo_with_an_extra_term_runs_and_logs_the_term(tmp_path, monkeypatch):
    write_block(tmp_path, "ppo_pull")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    algo = resolve_algorithm("my_algos:ppo_pull")  # a module of the working folder
    graph, _ = algo.trace(INPUTS, CLASSES)
    loss = graph.nodes["actor.update"]["node"].kwargs["loss"]
    expected, _ = REGISTRY["ppo"].trace(INPUTS, CLASSES)
    ppo_loss = expected.nodes["actor.update"]["node"].kwargs["loss"]
    assert repr(loss.terms[:-1]) == repr(ppo_loss.terms) and loss.loss_agg_mode == ppo_loss.loss_agg_mode
    assert [term.metric for term in loss.terms] == ["pg_loss", "pull_loss"]
    history = train(load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", "algorithm=my_algos:ppo_pull",
                                           "train.steps=2", "checkpoint.every=0"]), progress=False)
    assert len(history) == 2
    assert all(math.isfinite(row["actor/pull_loss"]) and math.isfinite(row["critic/vf_loss"]) for row in history)
