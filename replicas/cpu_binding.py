"""Which CPU cores a vLLM CPU replica's worker threads bind to.

vLLM's CPU build binds its OpenMP threads with ``VLLM_CPU_OMP_THREADS_BIND``; the default ``auto`` pinned
every replica on one machine to the same core. Each replica here takes its own slice of the core list,
chosen by its Ray Serve replica rank on the node.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field


class CpuBinding(BaseModel):
    """Core slices for the replicas of one pool on one node (CPU builds of vLLM only)."""

    model_config = ConfigDict(extra="forbid")

    cores_per_replica: int = Field(1, ge=1, description="Cores each replica's worker threads bind to.")
    cores: list[int] | None = Field(
        None, description="Cores to share out, in order; None takes the cores this process may run on."
    )

    def cores_for(self, local_rank: int) -> list[int]:
        """The slice of cores for the replica of this node-local rank (wrapping round when short)."""
        available = self.cores if self.cores else sorted(os.sched_getaffinity(0))
        start = (local_rank * self.cores_per_replica) % len(available)
        return [available[(start + i) % len(available)] for i in range(self.cores_per_replica)]

    def environment(self, local_rank: int) -> dict[str, str]:
        """Environment variables that apply this binding to a vLLM CPU engine started afterwards."""
        cores = self.cores_for(local_rank)
        return {
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(core) for core in cores),
            "OMP_NUM_THREADS": str(len(cores)),
        }
