"""The docs site builds with `mkdocs build --strict` (broken links fail it), its Mermaid blocks become diagrams,
and every markdown table in README.md and docs/ renders as a table (a blank line inside one splits it, and the
rows after it show as raw text)."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


def table_lines(text: str) -> list[str]:
    """The lines that start with '|' outside fenced code blocks, header separators left out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|") and not SEPARATOR.match(line.strip()):
            lines.append(line)
    return lines


def rendered_rows(text: str) -> int:
    import markdown

    return markdown.markdown(text, extensions=["tables", "fenced_code"]).count("<tr>")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_table_renders_as_a_table(page):
    text = page.read_text()
    assert rendered_rows(text) == len(table_lines(text)), (
        f"{page.relative_to(ROOT)}: {len(table_lines(text))} table lines but {rendered_rows(text)} rendered rows; "
        "a blank line inside a table, or none before it, leaves rows as raw text")


def test_a_table_split_by_a_blank_line_is_caught():
    table = "| a | b |\n| --- | --- |\n| 1 | 2 |\n"
    assert rendered_rows(table) == len(table_lines(table)) == 2
    split = table + "\n| 3 | 4 |\n"
    assert rendered_rows(split) == 2 and len(table_lines(split)) == 3


def test_every_page_is_in_the_sites_nav():
    nav = re.findall(r"^  - .+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(page.name for page in PAGES[1:]), "mkdocs.yml's nav should list every docs/*.md"


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (it comes with pip install -e '.[test]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    concepts = (tmp_path / "site" / "concepts" / "index.html").read_text()
    assert '<pre class="mermaid"><code>flowchart' in concepts  # a diagram for Mermaid's script, not highlighted code
