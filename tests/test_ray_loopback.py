"""A local Ray cluster started with ray_cluster.LOOPBACK_ENV registers every node at 127.0.0.1 and listens on
loopback only, a second node on the same machine (ray.cluster_utils.Cluster) too; without it the same
cluster registers under the machine's interface address and listens on all interfaces."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from flowrl.runtime.ray_cluster import LOOPBACK_ENV  # noqa: E402  (needs ray)

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
