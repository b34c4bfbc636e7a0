"""The quick-start notebook's code runs as written (with fewer steps)."""

import json
import os
import re
import tempfile
from pathlib import Path

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "quickstart.ipynb"


def test_quickstart_notebook_runs(tmp_path, capsys):
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "train.steps=30" in code
    temp = Path(tempfile.gettempdir())
    before = set(temp.glob("flowrl-quickstart-*"))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code.replace("train.steps=30", "train.steps=2"), str(NOTEBOOK), "exec"), {})
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert "plan reinforce_pp:" in out and "reinforce_pp_advantage @driver" in out
    assert re.search(r"^2 steps in \d+ s$", out, re.M)  # the time it states
    assert list(tmp_path.iterdir()) == []  # the run went to a temporary folder, not beside the notebook
    assert set(temp.glob("flowrl-quickstart-*")) == before  # which its last cell removed
