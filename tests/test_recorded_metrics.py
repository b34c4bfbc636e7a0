"""The default GRPO run reproduces metrics recorded before the runtime was reorganised (same seed).

tests/data/grpo_default_20_steps.json was written by `flowrl train grpo --steps 20` on the code before the
layered packages, open roles and engine configs (timings left out). Any change to sampling, seeding, the
loss or the schedule shows here.
"""

import json
from pathlib import Path

import pytest

from flowrl.config import load_run_config
from flowrl.runtime.trainer import train

RECORDED = Path(__file__).parent / "data" / "grpo_default_20_steps.json"


def test_default_grpo_metrics_equal_the_recorded_run(tmp_path):
    recorded = json.loads(RECORDED.read_text())
    rows = train(load_run_config(None, [f"train.output_dir={tmp_path}", "train.steps=20"]), progress=False)
    assert len(rows) == len(recorded) == 20
    for step, (want, got) in enumerate(zip(recorded, rows), start=1):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
