"""A two-node Ray cluster on this machine (ray.cluster_utils.Cluster, both nodes at 127.0.0.1): a pool spread over
both nodes trains like the local executor from model folders shipped to them, and the remote-cluster notebook
drives the cluster through Ray Client from a separate process."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from flowrl.config import load_run_config
from flowrl.engines.models.tiny_model import build_tiny_model
from flowrl.errors import PlanError
from flowrl.runtime.trainer import train
from fakes import ParityTask

ray = pytest.importorskip("ray")
pytest.importorskip("grpc")  # Ray Client: the `ray` extra's ray[client]
from flowrl.runtime.ray import cluster as ray_cluster  # noqa: E402  (needs ray)
from ray.cluster_utils import Cluster  # noqa: E402

NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "remote_cluster.ipynb"
TESTS = str(Path(__file__).parent)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A head (resource node_a) and a second node (node_b) of one ray.cluster_utils.Cluster, both registered at
    127.0.0.1 (conftest's loopback env, under which `ray start --address` refuses a second node), with Ray
    Client; this process connects through it."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths have a length limit
    path = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": path}  # the notebook's driver
    ray.shutdown()  # the session's local cluster (conftest.ray_local), if a module before started it
    client = _free_port()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        patch.setenv("PYTHONPATH", path)  # inherited by the nodes' workers: they find `fakes`
        nodes = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {"node_a": 1}, "object_store_memory": 100_000_000,
            "ray_client_server_port": client, "include_dashboard": False, "temp_dir": str(temp)})
        try:
            nodes.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=100_000_000)
            _wait(lambda: socket.create_connection(("127.0.0.1", client), timeout=1).close() or True, "Ray Client")
            address = f"ray://127.0.0.1:{client}"
            ray_cluster.connect(address)  # (tries a Ray Client server that dies at start again)
            _wait(lambda: sum(n["Alive"] for n in ray.nodes()) == 2, "the second node")
            assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1", "127.0.0.1"], ray.nodes()
            yield {"address": address, "gcs": nodes.address, "env": env}
        finally:
            ray.shutdown()
            nodes.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def _wait(ready, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {timeout_s:g} s")
        time.sleep(1)


def test_a_pool_over_two_nodes_trains_as_locally_from_model_folders_shipped_to_them(cluster, tmp_path, monkeypatch):
    """The ref pool's two ranks sit on different nodes (STRICT_SPREAD) and meet at rank 0's node, and the
    rollout's weights cross from the actor's node each step; the model folder is moved away once it is in the
    object store, so the workers cannot read the driver's path."""
    model = build_tiny_model(tmp_path / "model", chars=ParityTask.chars, hidden_size=64, num_layers=2, seed=0)
    common = ["task.name=fakes:ParityTask", "train.steps=2", "train.batch_size=4", "algo.group_size=4",
              "eval.every=0", "checkpoint.export=false", f"model.path={model}"]
    local = train(load_run_config(None, [f"train.output_dir={tmp_path / 'local'}", *common]), progress=False)

    shipped = ray_cluster.ship

    def ship_then_hide(folders):
        out = shipped(folders)
        model.rename(tmp_path / "elsewhere")  # no node can read model.path from here on
        return out

    monkeypatch.setattr(ray_cluster, "ship", ship_then_hide)
    # the rollout on the other node: its weights come over the weight-sync group across nodes (sync.transport)
    spread = {"pools": [{"name": "main", "roles": ["actor"], "resources": {"node_a": 1}},
                        {"name": "gen", "roles": ["rollout"], "resources": {"node_b": 1}},
                        {"name": "ref", "roles": ["ref"], "world_size": 2, "strategy": "STRICT_SPREAD"}]}
    nodes_of = {}

    def record_nodes(step, logged):
        for row in ray.util.placement_group_table().values():
            pool = row["name"].rsplit("-", 1)[0]
            if pool in ("flowrl-main", "flowrl-gen", "flowrl-ref") and row["state"] == "CREATED":
                nodes_of[pool] = list(row["bundles_to_node_id"].values())

    remote = train(load_run_config(None, [f"train.output_dir={tmp_path / 'ray'}", *common, "executor.name=ray",
                                          f"placement={json.dumps(spread)}"]), progress=False, on_step=record_nodes)
    assert not model.exists()
    assert len(set(nodes_of["flowrl-ref"])) == 2, nodes_of
    assert nodes_of["flowrl-main"] != nodes_of["flowrl-gen"], nodes_of  # actor and rollout on different nodes
    for key in ("reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
        assert [row[key] for row in remote] == pytest.approx([row[key] for row in local], abs=1e-6), key
    saved = tmp_path / "ray" / "checkpoints" / "step_000002" / "actor"  # on the driver's disk
    assert saved.is_dir() and any(saved.iterdir())


def test_a_pool_the_cluster_cannot_host_is_refused_naming_it(cluster, tmp_path):
    common = ["task.name=fakes:ParityTask", "train.steps=1", "train.batch_size=4", "executor.name=ray",
              "eval.every=0", f"train.output_dir={tmp_path}"]
    three = {"pools": [{"name": "wide", "roles": ["actor", "rollout", "ref"], "world_size": 3,
                        "strategy": "STRICT_SPREAD"}]}
    with pytest.raises(PlanError, match=r"pool 'wide' spreads 3 ranks over as many nodes \(STRICT_SPREAD\), but "
                                        r"only 2 of the cluster's 2 nodes"):
        train(load_run_config(None, [*common, f"placement={json.dumps(three)}"]), progress=False)
    missing = {"pools": [{"name": "g", "roles": ["actor", "rollout", "ref"], "resources": {"node_c": 1}}]}
    with pytest.raises(PlanError, match=r"pool 'g' needs 1 node_c .* but the Ray cluster has 0"):
        train(load_run_config(None, [*common, f"placement={json.dumps(missing)}"]), progress=False)
    apart = {"pools": [{"name": "g", "roles": ["actor", "rollout", "ref"],
                        "resources": {"node_a": 0.5, "node_b": 0.5}}]}  # enough in total, on no one node
    with pytest.raises(PlanError, match=r"Ray did not place pool 'g' .* within executor.placement_timeout_s=2 s"):
        train(load_run_config(None, [*common, "executor.placement_timeout_s=2", f"placement={json.dumps(apart)}"]),
              progress=False)


def test_placement_auto_on_cuda_needs_gpus_in_the_cluster(cluster, tmp_path):
    cfg = load_run_config(None, ["task.name=fakes:ParityTask", "executor.name=ray", "train.device=cuda",
                                 f"train.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="placement 'auto': train.device is 'cuda', but the Ray cluster has no GPU"):
        train(cfg, progress=False)


def test_the_remote_cluster_notebook_runs_through_ray_client(cluster, tmp_path):
    """Its task, reward, stage and algorithm are defined in the driver's __main__, as in a notebook's cells."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    for old, new in (('"ray://127.0.0.1:10001"', repr(cluster["address"])), ("train.steps=4", "train.steps=2"),
                     ('{"trainer": 1}, {"generator": 1}', '{"node_a": 1}, {"node_b": 1}')):
        assert old in code
        code = code.replace(old, new)
    done = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, cwd=tmp_path,
                          env=cluster["env"], timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "step 1:" in done.stdout and "step 2:" in done.stdout  # the step lines came back to the driver
    assert "equal to the local executor" in done.stdout
    assert "built-in grpo, equal to the local executor" in done.stdout  # a prebuilt graph through ray:// too


def test_connect_takes_the_gcs_address_too(cluster):
    """From a machine of the cluster, host:port joins as a driver (closing this process's Ray Client session)."""
    ray_cluster.connect(cluster["gcs"])
    assert not ray.util.client.ray.is_connected() and ray.cluster_resources().get("node_b") == 1
    with pytest.raises(ValueError, match="expected 'ray://host:port' or 'host:port'"):
        ray_cluster.connect(" ")


def test_connect_tries_a_client_server_that_died_at_start_again(monkeypatch):
    """Ray Client's "Initialization failure from server" is tried again (CLIENT_ATTEMPTS in all); any other
    failure, or that one every time, is one line naming the address."""
    calls, outcomes = [], []

    def init(address, **kwargs):
        calls.append(address)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(ray_cluster.ray, "init", init)
    monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_cluster.time, "sleep", lambda s: None)
    died = ConnectionError("Initialization failure from server: RuntimeError: Starting Ray client server failed.")
    outcomes[:] = [died, died, "connected"]
    assert ray_cluster.connect("ray://127.0.0.1:1") == "connected" and len(calls) == 3
    calls.clear()
    outcomes[:] = [died] * ray_cluster.CLIENT_ATTEMPTS
    with pytest.raises(ValueError, match="connect ray://127.0.0.1:1: Initialization failure from server"):
        ray_cluster.connect("ray://127.0.0.1:1")
    assert len(calls) == ray_cluster.CLIENT_ATTEMPTS == 3
    calls.clear()
    outcomes[:] = [ConnectionError("refused")]
    with pytest.raises(ValueError, match="connect ray://127.0.0.1:1: refused; is the head running"):
        ray_cluster.connect("ray://127.0.0.1:1")
    assert len(calls) == 1  # not tried again
