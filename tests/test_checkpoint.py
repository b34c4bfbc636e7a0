import json

import pytest

from flowrl.runtime.store import checkpoint
from fakes import FakeTrainEngine


class CrashingEngine(FakeTrainEngine):
    def save(self, path):
        super().save(path)
        raise RuntimeError("disk full")


def test_save_load_latest_and_prune(tmp_path):
    engines = {"actor": FakeTrainEngine()}
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, engines, {"stream": {"next_index": step}}, keep=2)
    assert checkpoint.latest(tmp_path).name == "step_000003"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000002", "step_000003"]
    state = checkpoint.load(checkpoint.latest(tmp_path), engines)
    assert state == {"step": 3, "stream": {"next_index": 3}}


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path):
    checkpoint.save(tmp_path, 1, {"actor": FakeTrainEngine()}, {"x": 1})
    with pytest.raises(RuntimeError, match="disk full"):
        checkpoint.save(tmp_path, 2, {"actor": CrashingEngine()}, {"x": 2})
    found = checkpoint.latest(tmp_path)
    assert found.name == "step_000001"
    assert json.loads((found / "state.json").read_text())["x"] == 1
    assert not (tmp_path / "step_000002").exists()


def test_load_names_a_missing_role(tmp_path):
    path = checkpoint.save(tmp_path, 1, {"actor": FakeTrainEngine()}, {})
    with pytest.raises(ValueError, match="no state for role 'critic'"):
        checkpoint.load(path, {"critic": FakeTrainEngine()})
