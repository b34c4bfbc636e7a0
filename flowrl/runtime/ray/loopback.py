"""A local Ray cluster at 127.0.0.1 (imports no Ray: it has to act before Ray does).

Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is imported (ray._private.ray_constants), so the
process that starts a local cluster has to set it before `import ray`: flowrl.runtime.ray.executor calls
`use_for_a_local_cluster` first thing, and tests/conftest.py sets it for the test session.
"""

from __future__ import annotations

import os
import sys

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""In the environment before `import ray`, in the process that starts a local cluster (ray.init() with no
address): Ray then registers the node at 127.0.0.1 and its servers (GCS, raylet, object manager, workers)
listen on 127.0.0.1 only. Without it Ray turns 127.0.0.1, wherever it is given (ray.init(_node_ip_address=),
`ray start --node-ip-address`, `--address=127.0.0.1:port`: services.resolve_ip_for_localhost), into the
machine's interface address and listens on all interfaces. It also makes `ray start --address` refuse to
start a second node (ray.cluster_utils.Cluster's add_node still starts one, at 127.0.0.1); and a driver
started with it reports 127.0.0.1 to a cluster it joins by GCS address, so set it only for local clusters."""


def use_for_a_local_cluster() -> bool:
    """Set LOOPBACK_ENV (where the user has not set the variable) when this process is about to import Ray
    and start a local cluster: Ray is not imported yet and RAY_ADDRESS names no cluster to join. Whether
    LOOPBACK_ENV is now in effect; a process that imported Ray before keeps what Ray read then."""
    if "ray" in sys.modules:
        return all(os.environ.get(key) == value for key, value in LOOPBACK_ENV.items())
    if os.environ.get("RAY_ADDRESS", "") not in ("", "local"):
        return False
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    return all(os.environ[key] == value for key in LOOPBACK_ENV)
