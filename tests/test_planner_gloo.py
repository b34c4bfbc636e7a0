"""The planner's choice run for real: `flowrl plan ALGO --cluster NxH100-80G --write` then torchrun with N CPU
ranks over gloo (the tiny model) on the written config; the run completes and records predicted against
measured (plan/* metrics, plan.json). The cases of one rank count train in one torchrun launch, one after the
other (cli_runs.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cli_process

CASES = [("grpo", 2), ("rloo", 2), ("grpo", 4)]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """launch(ranks): each case of that rank count planned (chosen.json) and trained, in folder ALGO-RANKS."""
    done = {}

    def launch(ranks):
        if ranks not in done:
            folders = {algo: tmp_path_factory.mktemp(f"{algo}-{ranks}") for algo, n in CASES if n == ranks}
            for algo, folder in folders.items():
                plan = cli_process.run("plan", algo, "--cluster", f"{ranks}xH100-80G", "--write",
                                       str(folder / "chosen.json"), "--set", "train.batch_size=8", cwd=folder,
                                       timeout=300)
                assert plan.returncode == 0, plan.stderr[-3000:]
            runs = [["train", algo, "--config", str(folder / "chosen.json"), "--set", "train.device=cpu", "--steps",
                     "2", "--no-progress", "--output-dir", str(folder / "run")] for algo, folder in folders.items()]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                   str(HERE / "cli_runs.py"), json.dumps(runs)]
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=next(iter(folders.values())), timeout=600)
            assert run.returncode == 0, run.stderr[-3000:]
            done[ranks] = folders
        return done[ranks]

    return launch


@pytest.mark.parametrize("algo,ranks", CASES)
def test_the_chosen_layout_runs_over_gloo_and_records_its_prediction(launched, algo, ranks):
    folder = launched(ranks)[algo]
    written = json.loads((folder / "chosen.json").read_text())
    assert sum(p["world_size"] for p in written["placement"]["pools"]) == ranks
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
    predicted = written["plan"]["predicted"]
    for row in rows[-2:]:
        assert row["plan/predicted_step_s"] == predicted["step_s"]
        assert row["plan/step_ratio"] == pytest.approx(row["timing_s/step"] / predicted["step_s"])
        assert row["memory/peak_gib"] > 0
    saved = json.loads((folder / "run" / "plan.json").read_text())
    assert saved["predicted"] == predicted and saved["measured"]["step_s"] > 0 and saved["refined"]["scale"]
