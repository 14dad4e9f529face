"""The application's declarative config: the ``args`` block of the Ray Serve YAML, validated.

``serve run deploy/local.yaml`` hands the YAML ``args`` to :func:`gateway.app.build_app`, which validates
them with :class:`AppConfig` before any deployment starts, so a typo fails at once with the field named.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, field_validator

from replicas.cpu_binding import CpuBinding
from replicas.engine_settings import EngineSettings


class ModelSource(BaseModel):
    """The model every pool serves."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Served model name: what clients put in the request's `model` field.")
    path: str = Field(description="Hugging Face model folder (or hub id where a hub is reachable).")
    build_tiny_model: bool = Field(
        False, description="Build the tiny random-weight local model at `path` if it is not there yet."
    )


class PoolConfig(BaseModel):
    """One pool of identical vLLM replicas (one Ray Serve deployment)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="Pool name; deployment is vllm-<name>.")
    num_replicas: int = Field(1, ge=1, description="vLLM replicas in this pool.")
    num_cpus: float = Field(1.0, gt=0, description="Ray CPUs reserved per replica actor.")
    num_gpus: float = Field(0.0, ge=0, description="Ray GPUs per replica (set tensor_parallel_size to match).")
    max_ongoing_requests: int = Field(256, ge=1, description="Requests one replica accepts at once.")
    engine: EngineSettings = Field(default_factory=EngineSettings, description="vLLM engine settings.")
    cpu_binding: CpuBinding | None = Field(None, description="CPU builds: cores each replica binds to.")


class GatewayDeploymentConfig(BaseModel):
    """The ingress deployment's size."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(1, ge=1, description="Gateway (ingress) replicas.")
    num_cpus: float = Field(0.25, gt=0, description="Ray CPUs reserved per gateway replica.")
    max_ongoing_requests: int = Field(2000, ge=1, description="Requests one gateway replica holds at once.")


class AppConfig(BaseModel):
    """Everything ``build_app`` needs: the model, the replica pools and the gateway."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSource
    pools: list[PoolConfig] = Field(min_length=1, description="Replica pools; the first is the default.")
    gateway: GatewayDeploymentConfig = Field(default_factory=GatewayDeploymentConfig)
    cache_dir: str = Field(".cache/runtime", description="Where vLLM keeps compile caches and IPC sockets.")

    @field_validator("pools")
    @classmethod
    def _unique_pool_names(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [pool.name for pool in pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        return pools

    def with_absolute_paths(self, base_dir: str) -> "AppConfig":
        """Resolve relative local paths against ``base_dir`` (the directory `serve run` started in).

        A model path that is not a local folder and has no path separator is left alone: a hub id.
        """
        model_path = self.model.path
        if self.model.build_tiny_model or os.path.exists(os.path.join(base_dir, model_path)):
            model_path = os.path.abspath(os.path.join(base_dir, model_path))
        return self.model_copy(
            update={
                "model": self.model.model_copy(update={"path": model_path}),
                "cache_dir": os.path.abspath(os.path.join(base_dir, self.cache_dir)),
            }
        )
