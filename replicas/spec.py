"""What a replica deployment is given: one typed spec, built by the app from its config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.config import QueueConfig
from policies.step_budget import own_prompt_limit
from replicas.cpu_binding import CpuBinding


class ReplicaSpec(BaseModel):
    """Everything one replica of a pool needs to start and join the fleet."""

    model_config = ConfigDict(extra="forbid")

    model_path: str = Field(description="The model folder the engine loads.")
    served_model_name: str = Field(description="The name clients use in the request's `model` field.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Engine settings (validated by the engine).")
    cpu_binding: CpuBinding | None = Field(None, description="CPU builds: cores each replica binds to.")
    cache_dir: str | None = Field(None, description="Where vLLM keeps compile caches and IPC sockets.")
    queue: QueueConfig | None = Field(None, description="The global queue to register with; None: no queue.")
    pool: str = Field("default", description="The pool this replica belongs to.")
    accepts: list[str] = Field(default_factory=lambda: ["short", "long"], description="Length classes it runs.")
    prefers: list[str] = Field(default_factory=list, description="Length classes its pool is built for.")
    reserve: int = Field(0, ge=0, description="Replicas of its pool kept free of guarded work (PoolConfig.reserve).")
    metrics_interval_s: float = Field(2.0, gt=0, description="How often it publishes its metrics to the fleet.")
    stream_batching_interval_ms: float = Field(
        0, ge=0, description="A stream's lines go at most once per this interval, joined (replicas/stream_batching.py); "
        "the gateway passes its pool's setting (50 by default), 0 sends each line as its own message."
    )
    simulated: str | None = Field(None, description="Cost model of the simulated engine; None: real vLLM.")
    time_scale: float = Field(1.0, ge=1.0, description="Simulated engine: each step takes this many times its model.")

    def own_prompt_limit(self) -> int | None:
        """The longest prompt of the work this replica's pool is built for, when the queue may place longer
        (guarded) classes here; None without a queue (each class goes to its own pool) or when it guards none."""
        if self.queue is None:
            return None
        classes = [(c.name, c.max_prompt_tokens) for c in self.queue.length_classes]
        return own_prompt_limit(self.accepts, self.prefers, classes)
