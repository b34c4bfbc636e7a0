"""Nothing lost, nothing run (issue 40): export never deletes what it did not write, a killed run's scorer
processes do not keep its folder locked, a checkpoint's files are verified as they are loaded. Real processes
and real folders."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cli_process
from flowrl.config import load_run_config
from flowrl.runtime import checkpoint
from flowrl.runtime.export import export
from flowrl.runtime.trainer import train

TESTS = str(Path(__file__).parent)
FAST = ["train.eval_every=0", "train.export=false", "train.batch_size=4"]


def config(path, *overrides):
    return load_run_config(None, [f"train.output_dir={path}", *FAST, *overrides])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished one-step run (signed checkpoint, final/)."""
    folder = tmp_path_factory.mktemp("run")
    train(config(folder, "train.steps=1", "train.export=true"), progress=False)
    return folder


def tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_export_refuses_the_run_folder_a_folder_inside_or_above_it_and_a_folder_it_did_not_write(run, tmp_path):
    before = tree(run)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    for output, says in ((run, "is the run folder"), (run / "final", "is inside the run folder"),
                         (run / "checkpoints", "is inside the run folder"), (run.parent, "is above the run"),
                         (mine, "is a non-empty folder that flowrl did not export")):
        done = cli_process.run("export", str(run), "--output", str(output), cwd=tmp_path, timeout=300)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "exported" not in done.stdout
    assert tree(run) == before and (mine / "thesis.txt").read_text() == "years of work"
    first = cli_process.run("export", str(run), "--output", str(tmp_path / "out"), cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    again = cli_process.run("export", str(run), "--output", str(tmp_path / "out"), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr  # a previous export (it has the marker) is replaced
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / ".flowrl_export").is_file()
