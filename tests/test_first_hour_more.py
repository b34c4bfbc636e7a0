"""Issue 48's first-hour points: `flowrl plan --gpus` honours --format, written model folders follow the umask,
LoRA adapters for vLLM stay inside a folder of their own, the interrupt names the run folder to resume from, a
SIGTERM to a run's whole process group (its scorers too) is said once."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from flowrl import cli
from flowrl.engines.models.folders import atomic_dir
from flowrl.engines.vllm.weight_syncs import AdapterSync


def test_plan_on_gpus_honours_format(capsys):
    assert cli.main(["plan", "grpo", "--gpus", "2", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["gpus"] == 2 and shown["pools"]["global"]["world_size"] == 2
    assert any(line.startswith("plan grpo") for line in shown["plan"])
    assert cli.main(["plan", "grpo", "--gpus", "2", "--format", "text"]) == 0
    assert capsys.readouterr().out.startswith("2 GPUs on 1 node(s)")
    assert cli.main(["plan", "grpo", "--gpus", "2", "--format", "dot"]) == 0
    assert "digraph" in capsys.readouterr().out


def test_a_written_folder_is_readable_as_the_umask_allows(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "final") as tmp:
            (tmp / "config.json").write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "final").stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0o700


class FakeTrain:
    def save_adapter(self, folder: str) -> str:
        open(os.path.join(folder, "adapter_model.safetensors"), "w").close()
        return folder


class FakeRollout:
    def use_adapter(self, folder: str) -> None:
        self.folder = folder


def test_lora_adapters_for_vllm_leave_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sync, rollout = AdapterSync(), FakeRollout()
    sync(FakeTrain(), rollout)
    assert os.path.dirname(rollout.folder) == sync.root.name and os.path.exists(rollout.folder)
    assert os.listdir(tmp_path) == [os.path.basename(sync.root.name)]  # one folder of its own
    sync.root.cleanup()  # what its finalizer does at exit
    assert os.listdir(tmp_path) == []


def test_the_interrupt_names_the_run_folder(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("flowrl.runtime.trainer.train", interrupted)
    assert cli.main(["train", "grpo", "--output-dir", str(tmp_path / "run")]) == 130
    assert f"with train.output_dir={tmp_path / 'run'}" in capsys.readouterr().err
    assert cli.main(["train", "grpo"]) == 130  # the default folder, runs/grpo-<time>
    assert "with train.output_dir=runs/grpo-" in capsys.readouterr().err


def test_sigterm_to_the_process_group_of_a_run_with_scorers_is_said_once(tmp_path):
    """Ctrl-C, `kill -- -PGID`, a scheduler's stop: every process of the group gets the signal, the forked
    scorers too; only the trainer speaks (its two lines once) and stops with a checkpoint."""
    rows = [{"data_source": "exact", "prompt": [{"role": "user", "content": f"{i}+0="}],
             "reward_model": {"ground_truth": str(i)}} for i in range(4)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4", "train.steps=400", "checkpoint.every=0",
            f"data.train_files={tmp_path / 't.jsonl'}", "data.reward=exact_match", "data.reward_workers=2", "algo.group_size=2",
            "roles.rollout.max_new_tokens=3"]
    run = subprocess.Popen([sys.executable, "-m", "flowrl", "train", "grpo", "--no-progress", "--output-dir",
                            str(tmp_path / "run"), *sets], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 300
    while not (tmp_path / "run" / "metrics.jsonl").exists() and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()[1]
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err
    lines = [line for line in err.splitlines() if line.startswith("flowrl")]
    assert len(lines) == 2 and lines[0].startswith("flowrl: SIGTERM: stopping after this step with a checkpoint"), err
    assert lines[1].startswith("flowrl: stopped by SIGTERM after step "), err
