"""The application's declarative config: the ``args`` block of the Ray Serve YAML, validated.

``serve run deploy/local.yaml`` hands the YAML ``args`` to :func:`gateway.app.build_app`, which validates
them with :class:`AppConfig` before any deployment starts, so a typo fails at once with the field named.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


class BandConfig(BaseModel):
    """One priority band of the global queue (bands are listed highest first)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Band name, as clients name it.")
    aging_s: float = Field(0, ge=0, description="Starvation guard: waiting this long promotes a ticket one band.")
    max_queued: int = Field(10_000, ge=1, description="Most tickets waiting in this band (then 429).")
    max_queued_tokens: int = Field(50_000_000, ge=1, description="Most estimated tokens waiting (then 429).")


def _default_bands() -> list[BandConfig]:
    return [
        BandConfig(name="interactive"),
        BandConfig(name="standard", aging_s=30),
        BandConfig(name="batch", aging_s=60),
    ]


class QueueConfig(BaseModel):
    """The Redis-backed global queue: fleet-wide priority bands and token-weighted fairness."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Off: forward straight to replicas (Serve's default router).")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL (redis://, rediss:// for TLS, user:password@ for AUTH); REDIS_URL overrides.",
    )
    namespace: str = Field("default", description="Queue namespace: one per independent fleet or model.")
    bands: list[BandConfig] = Field(default_factory=_default_bands, description="Bands, highest first.")
    default_band: str = Field("standard", description="Band of a request that names none.")
    lease_s: float = Field(10, gt=0, description="Ticket and replica lease; renewed every third of it.")
    max_wait_s: float = Field(120, gt=0, description="Longest a request waits for a grant (then 429).")
    retry_after_s: int = Field(2, ge=1, description="Retry-After sent with a queue-full or timeout 429.")
    long_prompt_above: int = Field(512, ge=1, description="Prompts above this many tokens are 'long'.")
    default_output_tokens: int = Field(256, ge=1, description="Output estimate when max_tokens is unset.")
    trust_tenant_header: bool = Field(
        False, description="Local/dev only: take the tenant from x-tenant-id (no authentication)."
    )
    tenant_weights: dict[str, float] = Field(default_factory=dict, description="Fair-share weight per tenant.")

    @model_validator(mode="after")
    def _bands_consistent(self) -> "QueueConfig":
        names = [band.name for band in self.bands]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"band names must be unique and non-empty, got {names}")
        if self.default_band not in names:
            raise ValueError(f"default_band {self.default_band!r} is not one of {names}")
        return self

    def resolved_redis_url(self) -> str:
        """REDIS_URL from the environment when set, else the configured URL."""
        return os.environ.get("REDIS_URL") or self.redis_url


class AppConfig(BaseModel):
    """Everything ``build_app`` needs: the model, the replica pools and the gateway."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSource
    pools: list[PoolConfig] = Field(min_length=1, description="Replica pools; the first is the default.")
    gateway: GatewayDeploymentConfig = Field(default_factory=GatewayDeploymentConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig, description="The global queue.")
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
