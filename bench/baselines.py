"""The baselines: Ray Serve LLM (``ray.serve.llm.build_openai_app``) with its default router and vLLM's
defaults, as a user would deploy it, or with its prefix-aware router;
``import_path: bench.baselines:ray_serve_llm_app`` in
bench/deploy/ray-serve-llm.yaml. Needs ``ray[serve]`` plus pyarrow, pandas, jsonref and hf_transfer (the
``bench`` extra), never the ``ray[llm]`` extra (it pins the CUDA vLLM).
"""

from __future__ import annotations

import os
from typing import Any

from ray.serve import Application

from replicas.engine_dtype import cpu_flags, engine_dtype


def ray_serve_llm_app(args: dict[str, Any]) -> Application:
    """An OpenAI app of ``args['replicas']`` LLMServer replicas of the model at ``args['model_path']``.

    ``engine_kwargs`` go to vLLM unchanged (the baseline passes only what the CPU needs: a KV cache size,
    eager mode for start-up time, the context; the priority baseline adds ``scheduling_policy: priority``).
    ``request_router: prefix-aware`` replaces Serve's default router with Ray Serve LLM's
    ``PrefixCacheAffinityRouter`` (its defaults), which sends a prompt where its text's prefix was sent before
    while the replicas' queues are balanced.
    On a machine without GPUs the replicas get CPU placement bundles, and the dtype the gateway's own CPU
    replicas take (replicas/engine_dtype.py: float32 where the CPU has no native bf16).
    """
    from ray.serve.llm import LLMConfig, build_openai_app

    model_path = os.path.abspath(args["model_path"])
    cpus = float(args.get("num_cpus", 0.5))
    placement = args.get("placement_group_config") or {"bundles": [{"CPU": cpus}]}
    engine_kwargs = dict(args.get("engine_kwargs") or {})
    on_cpu = not any(bundle.get("GPU") for bundle in placement["bundles"])
    engine_kwargs["dtype"] = engine_dtype(engine_kwargs.get("dtype", "auto"), on_cpu, cpu_flags())
    deployment: dict[str, Any] = {"num_replicas": int(args.get("replicas", 2))}
    router = args.get("request_router", "default")
    if router == "prefix-aware":
        from ray.serve.llm.request_router import PrefixCacheAffinityRouter

        deployment["request_router_config"] = {"request_router_class": PrefixCacheAffinityRouter}
    elif router != "default":
        raise ValueError(f"request_router: {router!r} is neither 'default' nor 'prefix-aware'")
    config = LLMConfig(
        model_loading_config={"model_id": args["model_name"], "model_source": model_path},
        deployment_config=deployment,
        engine_kwargs=engine_kwargs,
        placement_group_config=placement,
        runtime_env={"env_vars": {k: str(v) for k, v in (args.get("env") or {}).items()}},
    )
    ingress = {"ray_actor_options": {"num_cpus": float(args.get("ingress_num_cpus", 0.1))}}
    return build_openai_app({"llm_configs": [config], "ingress_deployment_config": ingress})
