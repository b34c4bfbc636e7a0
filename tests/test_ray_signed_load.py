"""Issue 40.3 on Ray: a signed checkpoint's pickle swapped in after the signature check never runs in a worker,
whether the workers read the run folder themselves (executor.ship_files=false) or the driver ships its files."""

import pickle
from pathlib import Path

import pytest

from flowrl.config import load_run_config
from flowrl.runtime.store import checkpoint
from flowrl.runtime.trainer import train

pytest.importorskip("ray")
FAST = ["eval.every=0", "checkpoint.export=false", "train.batch_size=4", "executor.gc_freeze=false"]


class Payload:
    """A pickle that touches `path` when loaded (builtins only: a Ray worker unpickles it without this module)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_local):
    """The session's local Ray cluster (conftest.ray_local)."""


@pytest.mark.parametrize("ship_files", ["true", "false"])
def test_a_pickle_swapped_in_after_the_check_never_runs_in_a_ray_worker(tmp_path, monkeypatch, ship_files):
    def config(*overrides):
        return load_run_config(None, [f"train.output_dir={tmp_path / 'run'}", *FAST, *overrides])

    train(config("train.steps=1"), progress=False)  # the checkpoint, on the local executor (a worker fewer to start)
    ran, check = tmp_path / "payload_ran", checkpoint.damage

    def check_then_swap(path):  # the attacker wins the race: the file changes right after the folder was checked
        problem = check(path)
        (path / "actor" / ".metadata").write_bytes(pickle.dumps(Payload(ran)))
        return problem

    monkeypatch.setattr(checkpoint, "damage", check_then_swap)
    with pytest.raises(ValueError, match=r"actor/.metadata changed after its signature was checked; refused"):
        train(config("train.steps=2", "executor.name=ray", f"executor.ship_files={ship_files}"), progress=False)
    assert not ran.exists()
