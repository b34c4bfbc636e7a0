"""docs/algorithms.md's table of every prebuilt algorithm agrees with the code: each registered algorithm has
one row, with its graph's line count (as tests/test_algorithm_size.py counts) and its config's fields."""

import inspect
import re
from pathlib import Path

from flowrl.algorithms import REGISTRY

DOC = Path(__file__).parent.parent / "docs" / "algorithms.md"
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
