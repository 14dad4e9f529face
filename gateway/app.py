"""Ray Serve application builder: ``import_path: gateway.app:build_app`` in the deploy/ YAML files."""

from __future__ import annotations

import logging
import os
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from gateway.config import AppConfig, PoolConfig
from gateway.ingress import Gateway
from replicas.deployment import VLLMReplica
from replicas.spec import ReplicaSpec

logger = logging.getLogger(__name__)


def build_app(args: dict[str, Any]) -> Application:
    """Validate the YAML ``args`` and bind the gateway in front of one deployment per replica pool."""
    config = AppConfig.model_validate(args).with_absolute_paths(os.getcwd())
    _ensure_model(config)
    pools = {pool.name: _bind_pool(pool, config) for pool in config.pools}
    gateway = Gateway.options(
        name="gateway",
        num_replicas=config.gateway.num_replicas,
        max_ongoing_requests=config.gateway.max_ongoing_requests,
        graceful_shutdown_timeout_s=config.gateway.graceful_shutdown_timeout_s,
        ray_actor_options={"num_cpus": config.gateway.num_cpus, "resources": config.gateway.resources},
    )
    return gateway.bind(pools, config.model_dump())


def _bind_pool(pool: PoolConfig, config: AppConfig) -> Application:
    routing = {}
    if config.queue.enabled:  # placement is the global queue's; the router only honours its grants
        routing["request_router_config"] = RequestRouterConfig(request_router_class="gateway.routing:GrantRouter")
    replica_class: type = VLLMReplica
    if config.model.simulated:
        from replicas.sim_replica import SimReplica

        replica_class = SimReplica
    deployment = serve.deployment(replica_class).options(
        name=f"vllm-{pool.name}",
        num_replicas=pool.num_replicas,
        max_ongoing_requests=pool.max_ongoing_requests,
        graceful_shutdown_timeout_s=pool.graceful_shutdown_timeout_s,
        ray_actor_options={"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus, "resources": pool.resources},
        health_check_period_s=10,
        health_check_timeout_s=60,
        **routing,
    )
    spec = ReplicaSpec(
        model_path=config.model.path, served_model_name=config.model.name, engine=pool.engine.model_dump(),
        cpu_binding=pool.cpu_binding, cache_dir=config.cache_dir,
        queue=config.queue if config.queue.enabled else None, pool=pool.name, accepts=config.pool_accepts(pool),
        prefers=pool.prefers, reserve=pool.reserve, metrics_interval_s=config.metrics.publish_interval_s,
        simulated=config.model.simulated,
        time_scale=config.model.simulated_time_scale, stream_batching_interval_ms=pool.stream_batching_interval_ms,
    )
    return deployment.bind(spec)


def _ensure_model(config: AppConfig) -> None:
    if not config.model.build_tiny_model:
        return
    from replicas.tiny_model.build import build_tiny_model, is_built

    if not is_built(config.model.path):
        logger.info("building the tiny local model at %s", config.model.path)
        build_tiny_model(config.model.path)
