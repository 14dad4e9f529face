"""The systems every scenario compares, described once for the simulator and the live runs.

* ``baseline``: what users run today: Ray Serve's default router (power of two choices on queue length)
  over one pool of vLLM replicas with vLLM's server defaults (FCFS, the default step budget);
* ``baseline-priority``: the same with vLLM's priority scheduling and interactive requests at priority 0;
* ``baseline-prefix``: the same with Ray Serve LLM's prefix-aware router (``PrefixCacheAffinityRouter``), on
  live engines and only where a scenario's tenants share prompt prefixes (the simulator models no prefix
  cache);
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

from fleet.config import QueueConfig
from policies.types import BandPolicy
from policies.step_budget import own_prompt_limit
from replicas.sim_engine import SimEngineSettings

SYSTEMS = ("baseline", "baseline-priority", "baseline-prefix", "no-queue", "gateway")
PREFIX_AWARE = "baseline-prefix"
BAND_PRIORITY = {"interactive": 0, "standard": 1, "batch": 2}


def systems_for(shares_prefixes: bool, systems: list[str], real_engines: bool) -> list[str]:
    """Which of ``systems`` a scenario runs on: the prefix-aware baseline only where its tenants share
    prefixes, and none at all where they do but the engines are simulated (no prefix cache is modelled, so
    every system would pay every prefill)."""
    if shares_prefixes:
        return list(systems) if real_engines else []
    return [system for system in systems if system != PREFIX_AWARE]


class PoolSpec(BaseModel):
    """A pool of identical replicas."""

    model_config = ConfigDict(extra="forbid")

    name: str
    replicas: int = Field(ge=1)
    engine: SimEngineSettings
    accepts: list[str] = Field(default_factory=lambda: ["short", "long"])
    prefers: list[str] = Field(default_factory=list)
    reserve: int = Field(0, ge=0,
                         description="Replicas kept empty while others hold guarded work (the pool's `reserve`).")
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
    gates: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Global queue: each band's gate (max_unstarted_steps, kv_ceiling).")
    signal_interval_s: float = Field(0.05, gt=0, description="Global queue: least time between engine reports.")

    def band_policies(self) -> list[BandPolicy]:
        """The global queue's bands, highest first, with their aging and gates."""
        return [BandPolicy(name=band, aging_ms=int(self.aging_s.get(band, 0) * 1000), max_queued=10 ** 9,
                           max_queued_tokens=10 ** 15, **dict(zip(("max_unstarted_steps", "kv_ceiling"),
                                                                  self.gates.get(band, (3.0, 1.0)))))
                for band in sorted(BAND_PRIORITY, key=BAND_PRIORITY.get)]

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
    latency_accepts: list[str]
    throughput_accepts: list[str]
    latency_reserve: int = 0
    short_prompt_tokens: int
    kv_tokens: int
    queue_overhead_s: float
    queue: QueueConfig


DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
# per grant: what the queue adds before a request reaches its replica, measured on an idle deployment here
# (`python -m bench.idle_probe`: x-fleetgate-queue-ms p50, docs/development.md); was 6.5 ms before the hot path
QUEUE_OVERHEAD_S = 0.0015


def profile_from_deploy(config_file: str, cost_model: str, default_engine: SimEngineSettings,
                        kv_tokens: int) -> Profile:
    """A profile whose latency and throughput pools, length threshold and queue (bands, gates, signal timing)
    are those of deploy/<config_file>, so the simulator runs what `serve run` deploys; ``default_engine`` is
    vLLM's server default there."""
    args = yaml.safe_load((DEPLOY / config_file).read_text())["applications"][0]["args"]
    pools = {pool["name"]: pool for pool in args["pools"]}
    queue = QueueConfig.model_validate(args["queue"])
    classes = [(c.name, c.max_prompt_tokens) for c in queue.length_classes]
    engines = {name: SimEngineSettings.model_validate({**pool["engine"], "own_prompt_limit": own_prompt_limit(
        pool.get("accepts", []), pool.get("prefers", []), classes)}) for name, pool in pools.items()}
    return Profile(cost_model=cost_model, default_engine=default_engine, latency_engine=engines["latency"],
                   throughput_engine=engines["throughput"], latency_accepts=pools["latency"]["accepts"],
                   throughput_accepts=pools["throughput"]["accepts"],
                   latency_reserve=pools["latency"].get("reserve", 0),
                   short_prompt_tokens=queue.length_classes[0].max_prompt_tokens,
                   kv_tokens=kv_tokens, queue_overhead_s=QUEUE_OVERHEAD_S, queue=queue)


PROFILES = {
    # vLLM's CPU server defaults: 2048 tokens, 128 sequences per step
    "cpu-tiny": profile_from_deploy("local.yaml", "cpu-tiny",
                                    SimEngineSettings(max_num_batched_tokens=2048, max_num_seqs=128), 524_288),
    # the bench model on the same pools: 8 layers x 4 KV heads x 64 dims x K,V x 2 bytes = 8 KiB a token, 1 GiB
    "cpu-bench": profile_from_deploy("local.yaml", "cpu-bench",
                                     SimEngineSettings(max_num_batched_tokens=2048, max_num_seqs=128), 131_072),
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
    split = [PoolSpec(name="latency", replicas=latency, engine=profile.latency_engine,
                      accepts=profile.latency_accepts, prefers=["short"],
                      reserve=min(profile.latency_reserve, latency - 1),  # it needs a replica beside it
                      kv_tokens=profile.kv_tokens)]
    if replicas > 1:
        split.append(PoolSpec(name="throughput", replicas=replicas - latency, engine=profile.throughput_engine,
                              accepts=profile.throughput_accepts, prefers=["long"], kv_tokens=profile.kv_tokens))
    else:  # one replica: it must take both classes
        split = [split[0].model_copy(update={"accepts": ["short", "long"]})]
    common = {"short_prompt_tokens": profile.short_prompt_tokens}
    return {
        "baseline": SystemSpec(name="baseline", routing="power-of-two", priorities=False, pools=one_pool, **common),
        "baseline-priority": SystemSpec(name="baseline-priority", routing="power-of-two", priorities=True,
                                        pools=priority_pool, **common),
        "no-queue": SystemSpec(name="no-queue", routing="power-of-two", priorities=True, pools=split, **common),
        "gateway": SystemSpec(name="gateway", routing="global-queue", priorities=True, pools=split,
                              queue_overhead_s=profile.queue_overhead_s, signal_interval_s=profile.queue.signal_interval_s,
                              gates={b.name: (b.max_unstarted_steps, b.kv_ceiling) for b in profile.queue.bands},
                              aging_s={b.name: b.aging_s for b in profile.queue.bands}, **common),
    }
