"""Issue 48's first-hour points: `flowrl plan --gpus` honours --format, written model folders follow the umask,
LoRA adapters for vLLM stay inside a folder of their own, the interrupt names the run folder to resume from."""

import json
import os
import tempfile

from flowrl import cli
from flowrl.engines.models.folders import atomic_dir
from flowrl.engines.vllm.rollout import AdapterSync


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
