"""``python -m bench.gpu_configs --gpus N --out DIR``: the configs bench/gpu.sh runs on a machine with N GPUs.

* ``gateway.yaml``: deploy/gpu.yaml with its pools sized to the GPUs (half latency, half throughput; on one
  GPU both pools share it, each engine with under half its memory), tenants by header (no keys) and an
  open /metrics: a benchmark's settings, on a machine of its own, not production's;
* ``baseline.yaml``: Ray Serve LLM on the same GPUs (one replica per GPU, or one on a single GPU), vLLM's
  defaults plus the same context.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from tests.support.serve_launcher import REPO_ROOT


def gateway_config(gpus: int) -> dict:
    """deploy/gpu.yaml with its two pools sized to ``gpus``."""
    document = yaml.safe_load((REPO_ROOT / "deploy" / "gpu.yaml").read_text())
    args = document["applications"][0]["args"]
    latency, throughput = args["pools"]
    if gpus == 1:
        for pool in (latency, throughput):
            pool.update(num_replicas=1, num_gpus=0.5, num_cpus=2)
            pool["engine"]["gpu_memory_utilization"] = 0.42
    else:
        latency["num_replicas"] = gpus // 2
        throughput["num_replicas"] = gpus - gpus // 2
    # the latency pool's reserve needs a replica beside it to take long prompts at all
    latency["reserve"] = min(latency.get("reserve", 0), latency["num_replicas"] - 1)
    args["gateway"]["num_replicas"] = min(args["gateway"]["num_replicas"], max(1, gpus))
    # a benchmark on a machine of its own: tenants by header, no scrape key (the bench reads loop lag)
    args["access"] = {"allow_anonymous": True, "trust_tenant_header": True}
    args["metrics"] = {**args.get("metrics", {}), "require_scrape_key": False}
    return document


def baseline_config(gpus: int) -> dict:
    """Ray Serve LLM (bench/deploy/ray-serve-llm.yaml) on ``gpus`` GPUs with the gateway's context."""
    document = yaml.safe_load((REPO_ROOT / "bench" / "deploy" / "ray-serve-llm.yaml").read_text())
    args = document["applications"][0]["args"]
    context = yaml.safe_load((REPO_ROOT / "deploy" / "gpu.yaml").read_text())
    engine = context["applications"][0]["args"]["pools"][0]["engine"]
    args.update(replicas=gpus, num_cpus=2, env={},
                placement_group_config={"bundles": [{"GPU": 1, "CPU": 2}]},
                engine_kwargs={"max_model_len": engine["max_model_len"], "enable_prefix_caching": True})
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_configs", description=__doc__)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gateway.yaml").write_text(yaml.safe_dump(gateway_config(args.gpus), sort_keys=False))
    (args.out / "baseline.yaml").write_text(yaml.safe_dump(baseline_config(args.gpus), sort_keys=False))
    print(args.out / "gateway.yaml", args.out / "baseline.yaml")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
