"""A local Ray cluster started with ray_loopback.LOOPBACK_ENV registers every node at 127.0.0.1 and listens on
loopback only, a second node on the same machine (ray.cluster_utils.Cluster) too; without it the same
cluster registers under the machine's interface address and listens on all interfaces. The session's local
cluster (conftest sets the variable) and one flowrl starts for a user (ray_executor.init_ray) are at 127.0.0.1;
a process that joins a cluster by RAY_ADDRESS is left as it was."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from flowrl.runtime.ray.loopback import LOOPBACK_ENV  # noqa: E402

CLUSTER = """
import json, psutil, ray
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1},
                                                        "include_dashboard": False})
cluster.add_node(num_cpus=1, resources={"node_b": 1})
ray.init(address=cluster.address)
where = ray.get(ray.remote(resources={"node_b": 1})(ray.util.get_node_ip_address).remote())  # a worker there
listening = set()
for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
    try:
        listening |= {c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    except psutil.NoSuchProcess:
        pass
print(json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "worker": where,
                  "listening": sorted(listening)}))
ray.shutdown()
cluster.shutdown()
"""


def _cluster(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", CLUSTER], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_two_node_local_cluster_with_the_loopback_env_registers_every_node_at_127_0_0_1_and_listens_only_there():
    seen = _cluster(LOOPBACK_ENV)
    assert seen["nodes"] == ["127.0.0.1", "127.0.0.1"] and seen["worker"] == "127.0.0.1"
    assert seen["listening"] and set(seen["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, seen


def test_every_node_of_the_sessions_local_cluster_is_at_127_0_0_1(ray_local):
    assert [n["NodeManagerAddress"] for n in ray_local.nodes()] == ["127.0.0.1"]


USER = """
import json, os
from flowrl.runtime.ray.executor import init_ray
import ray
init_ray(num_cpus=1)
print(json.dumps({"set": os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
                  "nodes": [n["NodeManagerAddress"] for n in ray.nodes()]}))
ray.shutdown()
"""

JOIN = """
import os
os.environ["RAY_ADDRESS"] = "10.0.0.1:6379"
from flowrl.runtime.ray import loopback as ray_loopback
print(ray_loopback.use_for_a_local_cluster(), os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"))
"""


def test_flowrl_starts_a_users_local_cluster_at_127_0_0_1_and_leaves_a_joining_process_alone():
    """A user's process without the variable (the session's is removed), as the trainer does it: importing
    ray_executor sets it before Ray is imported, and init_ray with no address starts the cluster; with
    RAY_ADDRESS set (a cluster to join) it stays unset."""
    env = {k: v for k, v in os.environ.items() if k not in LOOPBACK_ENV}
    done = subprocess.run([sys.executable, "-c", USER], capture_output=True, text=True, timeout=300,
                          env={**env, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"set": "0", "nodes": ["127.0.0.1"]}
    joined = subprocess.run([sys.executable, "-c", JOIN], capture_output=True, text=True, timeout=120, env=env)
    assert joined.returncode == 0 and joined.stdout.split() == ["False", "None"], joined.stderr[-2000:]
