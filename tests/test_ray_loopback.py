"""A local Ray cluster started with ray_cluster.LOOPBACK_ENV registers every node at 127.0.0.1 and listens on
loopback only; without it the same cluster registers under the machine's interface address."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from flowrl.runtime.ray_cluster import LOOPBACK_ENV  # noqa: E402  (needs ray)

CLUSTER = """
import json, os, psutil, ray
ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
ray.get(ray.remote(lambda: 1).remote())  # a worker too
processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
listening = set()
for process in processes:
    try:
        listening |= {c.laddr.ip for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    except psutil.NoSuchProcess:
        pass
print(json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "listening": sorted(listening)}))
ray.shutdown()
"""


def _cluster(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", CLUSTER], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_local_cluster_with_the_loopback_env_registers_every_node_at_127_0_0_1_and_listens_only_there():
    seen = _cluster(LOOPBACK_ENV)
    assert seen["nodes"] == ["127.0.0.1"]
    assert seen["listening"] and set(seen["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, seen
