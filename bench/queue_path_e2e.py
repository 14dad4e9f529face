"""End-to-end latency the global queue adds: the local deployment with the queue on, then off, same run.

    python -m bench.queue_path_e2e [--requests 200] [--json out.json]

Each phase brings up `serve run deploy/local.yaml` (2 vLLM CPU replicas of the tiny model), sends
sequential one-token completions with fresh prompts (no prefix-cache hits) and records the full response
time. With the queue off, the gateway forwards through Ray Serve's default router. The difference of the
two is what admission through Redis costs a request on an idle fleet.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from gateway.queue.local_redis import running_redis
from tests.e2e.deployment import serve_run

ROOT = Path(__file__).resolve().parents[1]


def _measure(base_url: str, requests: int, tag: str) -> list[float]:
    samples = []
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for index in range(requests + 10):
            body = {"model": "tiny-llama", "prompt": f"{tag} {index} {time.time_ns()}", "max_tokens": 1}
            started = time.perf_counter()
            response = client.post("/v1/completions", json=body)
            elapsed = (time.perf_counter() - started) * 1000
            response.raise_for_status()
            if index >= 10:  # the first few warm connections and caches
                samples.append(elapsed)
    return samples


def _app_running(log_path: Path) -> bool:
    """True once Serve's REST API (on the dashboard the log names) reports the application RUNNING."""
    match = re.search(r"dashboard at \S*?(http://[0-9.:]+)", log_path.read_text(errors="replace"))
    if not match:
        return False
    try:
        apps = httpx.get(f"{match.group(1)}/api/serve/applications/", timeout=5).json()["applications"]
    except (httpx.HTTPError, KeyError, ValueError):
        return False
    return all(app["status"] == "RUNNING" for app in apps.values()) and bool(apps)


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": statistics.median(ordered), "p99_ms": ordered[int(0.99 * (len(ordered) - 1))],
            "n": len(ordered)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        work_dir = Path(work)
        with running_redis(work_dir) as redis_url:
            for enabled in (True, False):
                phase = "with_queue" if enabled else "without_queue"

                def edit(app_args: dict, enabled: bool = enabled) -> None:
                    app_args["queue"]["enabled"] = enabled

                phase_dir = work_dir / phase
                phase_dir.mkdir()
                log_path = phase_dir / "serve-run.log"
                with serve_run(ROOT / "deploy" / "local.yaml", phase_dir, env={"REDIS_URL": redis_url},
                               edit=edit, ready=lambda log_path=log_path: _app_running(log_path)) as url:
                    results[phase] = _summary(_measure(url, args.requests, phase))
                print(phase, results[phase], flush=True)
    results["added_p50_ms"] = results["with_queue"]["p50_ms"] - results["without_queue"]["p50_ms"]
    results["added_p99_ms"] = results["with_queue"]["p99_ms"] - results["without_queue"]["p99_ms"]
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
