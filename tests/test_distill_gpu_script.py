"""benchmarks/distill_gpu.py on CPU with its tiny teacher (the HF teacher: the vLLM teacher's run is
tests/test_distill_vllm.py's): one JSON line per step with the student's KL to the teacher, the summary line, and
the plot whose KL panel draws exactly those values (flowrl plot's sidecar)."""

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import distill_gpu  # noqa: E402


def test_the_script_prints_each_steps_kl_and_plots_it(tmp_path, monkeypatch, capsys):
    output = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["distill_gpu.py", "--teacher", "tiny", "--teacher-engine", "hf",
                                      "--device", "cpu", "--steps", "3", "--batch-size", "4", "--max-new-tokens",
                                      "3", "--topk", "4", "--lr", "1e-2", "--output", str(output)])
    distill_gpu.main()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    steps, summary = lines[:-1], lines[-1]
    assert [row["step"] for row in steps] == [1, 2, 3]
    kl = [row["distill_kl"] for row in steps]
    assert all(math.isfinite(v) and v >= 0 for v in kl)
    assert summary["first3"] == sum(kl) / 3 == summary["last3"]
    assert (output / "student_init" / "config.json").is_file()
    assert json.loads((output / "student_init" / "config.json").read_text())["num_hidden_layers"] == 1
    panels = json.loads((output / "distill_kl.json").read_text())["panels"]
    drawn = next(panel for panel in panels if panel["title"] == "KL")["series"]
    assert [s["key"] for s in drawn] == ["actor/distill_kl"]
    assert drawn[0]["points"] == [[step, value] for step, value in zip([1, 2, 3], kl)]
    assert (output / "distill_kl.png").stat().st_size > 10_000
