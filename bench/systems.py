"""The four systems every scenario compares, described once for the simulator and the live runs.

* ``baseline``: what users run today: Ray Serve's default router (power of two choices on queue length)
  over one pool of vLLM replicas with vLLM's server defaults (FCFS, the default step budget);
* ``baseline-priority``: the same with vLLM's priority scheduling and interactive requests at priority 0;
* ``no-queue``: this gateway's length-aware pools (small chunked-prefill budget for short prompts, large
  for long ones) and band priorities, but no global queue (Serve's router inside each pool);
* ``gateway``: the full gateway: the Redis global queue (strict bands, token-weighted fairness across
  tenants, fleet-wide placement) in front of the same pools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml

from pydantic import BaseModel, ConfigDict, Field

from replicas.sim_engine import SimEngineSettings

SYSTEMS = ("baseline", "baseline-priority", "no-queue", "gateway")
BAND_PRIORITY = {"interactive": 0, "standard": 1, "batch": 2}


class PoolSpec(BaseModel):
    """A pool of identical replicas."""

    model_config = ConfigDict(extra="forbid")

    name: str
    replicas: int = Field(ge=1)
    engine: SimEngineSettings
    accepts: list[str] = Field(default_factory=lambda: ["short", "long"])
    prefers: list[str] = Field(default_factory=list)
    kv_tokens: int = Field(500_000, ge=1, description="KV cache size in tokens (the queue's token capacity).")
    queue_slots: int | None = Field(None, ge=1, description="Grants at once per replica (None: max_num_seqs).")


class SystemSpec(BaseModel):
    """One system under test."""

    model_config = ConfigDict(extra="forbid")

    name: str
    routing: Literal["power-of-two", "global-queue"]
    priorities: bool = Field(description="Bands become vLLM priorities (priority scheduling).")
    pools: list[PoolSpec]
    short_prompt_tokens: int = Field(description="Longest prompt of the 'short' length class.")
    max_ongoing_requests: int = Field(256, description="Serve's per-replica cap (power-of-two routing).")
    queue_overhead_s: float = Field(0.0, ge=0, description="Added per grant (Redis round trips).")
    max_wait_s: float = Field(120.0, gt=0, description="Global queue: longest wait before a 429.")
    aging_s: dict[str, float] = Field(default_factory=lambda: {"standard": 30.0, "batch": 60.0})

    def pool_for(self, length_class: str) -> PoolSpec:
        """Power-of-two routing: the first pool preferring the class, else the first accepting it."""
        for pool in self.pools:
            if length_class in pool.prefers:
                return pool
        return next(pool for pool in self.pools if length_class in pool.accepts)


class Profile(BaseModel):
    """Engine settings per hardware: vLLM's server defaults, and this project's two pool configs."""

    model_config = ConfigDict(extra="forbid")

    cost_model: str
    default_engine: SimEngineSettings
    latency_engine: SimEngineSettings
    throughput_engine: SimEngineSettings
    short_prompt_tokens: int
    kv_tokens: int
    queue_overhead_s: float


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
QUEUE_OVERHEAD_S = 0.0065  # per grant: `python -m bench.queue_overhead`, 16 concurrent requests, p50


def profile_from_deploy(config_file: str, cost_model: str, default_engine: SimEngineSettings,
                        kv_tokens: int) -> Profile:
    """A profile whose latency and throughput pools and length threshold are those of deploy/<config_file>,
    so the simulator runs what `serve run` deploys; ``default_engine`` is vLLM's server default there."""
    args = yaml.safe_load((DEPLOY / config_file).read_text())["applications"][0]["args"]
    engines = {pool["name"]: SimEngineSettings.model_validate(pool["engine"]) for pool in args["pools"]}
    return Profile(cost_model=cost_model, default_engine=default_engine, latency_engine=engines["latency"],
                   throughput_engine=engines["throughput"],
                   short_prompt_tokens=args["queue"]["length_classes"][0]["max_prompt_tokens"],
                   kv_tokens=kv_tokens, queue_overhead_s=QUEUE_OVERHEAD_S)


PROFILES = {
    # vLLM's CPU server defaults: 2048 tokens, 128 sequences per step
    "cpu-tiny": profile_from_deploy("local.yaml", "cpu-tiny",
                                    SimEngineSettings(max_num_batched_tokens=2048, max_num_seqs=128), 524_288),
    # vLLM's server defaults on an H100/H200: 8192 tokens, 1024 sequences
    "gpu-h100-llama3-8b": profile_from_deploy("gpu.yaml", "gpu-h100-llama3-8b",
                                              SimEngineSettings(max_num_batched_tokens=8192, max_num_seqs=1024),
                                              430_000),
}


def build_systems(profile_name: str, replicas: int, latency_share: float = 0.5) -> dict[str, SystemSpec]:
    """The four systems on ``replicas`` replicas (the gateway's split latency_share : rest)."""
    profile = PROFILES[profile_name]
    latency = max(1, min(replicas - 1, round(replicas * latency_share))) if replicas > 1 else 1
    one_pool = [PoolSpec(name="default", replicas=replicas, engine=profile.default_engine,
                         kv_tokens=profile.kv_tokens)]
    priority_pool = [one_pool[0].model_copy(update={
        "engine": profile.default_engine.model_copy(update={"scheduling_policy": "priority"})})]
    split = [PoolSpec(name="latency", replicas=latency, engine=profile.latency_engine, accepts=["short"],
                      prefers=["short"], kv_tokens=profile.kv_tokens)]
    if replicas > 1:
        split.append(PoolSpec(name="throughput", replicas=replicas - latency, engine=profile.throughput_engine,
                              accepts=["short", "long"], prefers=["long"], kv_tokens=profile.kv_tokens))
    else:  # one replica: it must take both classes
        split = [split[0].model_copy(update={"accepts": ["short", "long"]})]
    common = {"short_prompt_tokens": profile.short_prompt_tokens}
    return {
        "baseline": SystemSpec(name="baseline", routing="power-of-two", priorities=False, pools=one_pool, **common),
        "baseline-priority": SystemSpec(name="baseline-priority", routing="power-of-two", priorities=True,
                                        pools=priority_pool, **common),
        "no-queue": SystemSpec(name="no-queue", routing="power-of-two", priorities=True, pools=split, **common),
        "gateway": SystemSpec(name="gateway", routing="global-queue", priorities=True, pools=split,
                              queue_overhead_s=profile.queue_overhead_s, **common),
    }
