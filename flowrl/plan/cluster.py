"""The cluster a plan is made for: nodes of GPUs of one kind (`--cluster 2x8xH100-80G`), or the devices found.

A spec reads NODESxGPUSxKIND, GPUSxKIND (one node) or KIND (one GPU); KIND names a row of the device table
(flowrl.plan.costs.DEVICES), which gives the memory of one card and its cost constants. `detect` reads the
GPUs a Ray cluster has (executor.name=ray) or torch sees, and the device table's row nearest their memory.
Pools respect nodes: a pool either fits in one node or takes whole nodes (`pool_sizes`), and a tensor-parallel
group never spans two (`tensor_parallel_span`: the pools take consecutive ranks in placement order, the train
pool's first, node by node, as torchrun and flowrl's Ray pools number them, and a rollout engine of
tensor_parallel_size k takes k consecutive ranks of its pool).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flowrl.errors import PlanError
from flowrl.plan.costs import DEVICES, DeviceKind

SPEC = re.compile(r"^(?:(\d+)x)?(?:(\d+)x)?([A-Za-z][\w.-]*)$")


class ClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: int = Field(1, ge=1, description="Nodes of the cluster.")
    gpus_per_node: int = Field(1, ge=1, description="GPUs of each node.")
    device: str = Field("H100-80G", description="The GPUs' kind, a row of flowrl.plan.costs.DEVICES.")
    memory_gib: float | None = Field(None, gt=0, description="One card's memory where it was measured (a run's "
                                                             "own GPUs); None: the device row's.")

    @model_validator(mode="after")
    def _known(self) -> "ClusterConfig":
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} is not in the device table; known: {', '.join(DEVICES)}")
        return self

    @classmethod
    def parse(cls, spec: str) -> "ClusterConfig":
        """'1xH100-80G', '8xH100-80G' (one node of 8), '2x8xH200-141G' (2 nodes of 8); one line if malformed."""
        match = SPEC.match(spec.strip())
        if not match:
            raise PlanError(f"--cluster {spec!r}: expected NODESxGPUSxKIND, GPUSxKIND or KIND, e.g. 2x8xH100-80G")
        first, second, kind = match.groups()
        nodes, per_node = (int(first), int(second)) if second else (1, int(first or 1))
        if kind not in DEVICES:
            raise PlanError(f"--cluster {spec!r}: unknown device {kind!r}; known: {', '.join(DEVICES)}")
        if nodes < 1 or per_node < 1:
            raise PlanError(f"--cluster {spec!r}: nodes and GPUs per node must be at least 1")
        return cls(nodes=nodes, gpus_per_node=per_node, device=kind)

    @classmethod
    def from_counts(cls, gpus: int, nodes: int, device: str, gpus_per_node: int | None = None) -> "ClusterConfig":
        """--gpus N --nodes M: N must split evenly over the nodes and, where the nodes' size is known, fill them."""
        if gpus < 1 or nodes < 1 or gpus % nodes:
            raise PlanError(f"placement: --gpus {gpus} must be a positive multiple of --nodes {nodes}")
        if gpus_per_node is not None and gpus // nodes > gpus_per_node:
            raise PlanError(f"placement: --gpus {gpus} on --nodes {nodes} is {gpus // nodes} GPUs a node, but a "
                            f"node of {device} has {gpus_per_node}; use --nodes {-(-gpus // gpus_per_node)}")
        return cls(nodes=nodes, gpus_per_node=gpus // nodes, device=device)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def kind(self) -> DeviceKind:
        return DEVICES[self.device]

    @property
    def gpu_bytes(self) -> int:
        return self.kind.memory_bytes if self.memory_gib is None else int(self.memory_gib * 2**30)

    def pool_sizes(self) -> list[int]:
        """Sizes a pool of this cluster may have: any within one node, else whole nodes."""
        return [n for n in range(1, self.gpus + 1) if n <= self.gpus_per_node or n % self.gpus_per_node == 0]

    def max_tensor_parallel(self) -> int:
        return self.gpus_per_node

    def spans_nodes(self, size: int) -> bool:
        return size > self.gpus_per_node

    def tensor_parallel_span(self, first: int, pool: int, k: int) -> str | None:
        """One line where a tensor-parallel group of `k` ranks of the pool of `pool` GPUs starting at GPU `first`
        would span two nodes (vLLM's tensor parallel needs NVLink, one node); else None."""
        per = self.gpus_per_node
        if k > per:
            return (f"roles.rollout.tensor_parallel_size={k} spans nodes: a node has {per} GPUs "
                    f"({self.describe()}); a tensor-parallel group stays within one node")
        for start in range(first, first + pool - k + 1, k):
            if start // per != (start + k - 1) // per:
                return (f"roles.rollout.tensor_parallel_size={k} spans nodes: its group of GPUs "
                        f"{start}-{start + k - 1} crosses a node boundary at {per} GPUs per node "
                        f"({self.describe()}); a tensor-parallel group stays within one node")
        return None

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.gpus_per_node} {self.device} ({self.kind.memory_gib:g} GiB each)"

    def build(self) -> "ClusterConfig":
        return self


def detect(ray_cluster: bool = False) -> ClusterConfig:
    """The GPUs this process sees (torch.cuda), or a Ray cluster's (nodes, GPUs per node); a PlanError if none."""
    if ray_cluster:
        import ray

        counts = [int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]
        counts = [c for c in counts if c]
        if not counts:
            raise PlanError("placement: the Ray cluster has no GPU; give --cluster, e.g. 1xH100-80G")
        per_node, memory = max(counts), _cuda_memory()
        return ClusterConfig(nodes=len(counts), gpus_per_node=per_node, device=nearest_device(memory))
    import torch

    if not torch.cuda.is_available():
        raise PlanError("placement: torch sees no CUDA device; give --cluster, e.g. 1xH100-80G or 2x8xH100-80G")
    return ClusterConfig(nodes=1, gpus_per_node=torch.cuda.device_count(), device=nearest_device(_cuda_memory()))


def _cuda_memory() -> int:
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else DEVICES[
        "H100-80G"].memory_bytes


def nearest_device(memory_bytes: int) -> str:
    """The device table's GPU row whose memory is nearest `memory_bytes`."""
    gpus = [name for name, kind in DEVICES.items() if kind.cuda]
    return min(gpus, key=lambda name: abs(DEVICES[name].memory_bytes - memory_bytes))
