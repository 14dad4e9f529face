"""What the gateway adds at idle: sequential streamed chat requests against one endpoint.

    python -m bench.idle_probe --url http://127.0.0.1:8000 [--requests 30] [--prompt-tokens 100]

For each request: the gateway's ``x-fleetgate-queue-ms`` and its ``Server-Timing`` stages (when it has
them: where the gateway's own milliseconds go before the engine answers), the time to the first content
chunk, the total, and whether the first content chunk came bunched with the last (within 2 ms of it while
the stream took over 20 ms): the symptom of a relay that holds chunks back. Prints medians and counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx


def probe(url: str, requests: int, prompt_words: int, max_tokens: int, key: str | None) -> dict[str, float]:
    """Run the probe; returns its figures."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    queue_ms, ttft_ms, total_ms, bunched = [], [], [], 0
    stages: dict[str, list[float]] = {}
    with httpx.Client(base_url=url, timeout=60) as client:
        model = client.get("/v1/models", headers=headers).json()["data"][0]["id"]
        for index in range(requests + 3):  # the first 3 warm up
            body = {"model": model, "stream": True, "max_tokens": max_tokens,
                    "messages": [{"role": "user", "content": f"{index} " + "word " * prompt_words}]}
            started = time.perf_counter()
            chunks = []
            with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as reply:
                reply.raise_for_status()
                for line in reply.iter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        chunks.append(time.perf_counter())
                queued = reply.headers.get("x-fleetgate-queue-ms")
                timing = server_timing(reply.headers.get("server-timing", ""))
            if index < 3 or not chunks:
                continue
            total = chunks[-1] - started
            queue_ms += [float(queued)] if queued else []
            for stage, ms in timing.items():
                stages.setdefault(stage, []).append(ms)
            ttft_ms.append((chunks[0] - started) * 1000)
            total_ms.append(total * 1000)
            bunched += int(len(chunks) > 1 and chunks[-1] - chunks[0] < 0.002 and total > 0.02)
    result = {"requests": len(ttft_ms), "ttft_p50_ms": statistics.median(ttft_ms),
              "ttft_max_ms": max(ttft_ms), "total_p50_ms": statistics.median(total_ms), "bunched_first_chunks": bunched}
    if queue_ms:
        result["queue_ms_p50"] = statistics.median(queue_ms)
    if stages:
        result["stage_p50_ms"] = {stage: statistics.median(ms) for stage, ms in stages.items()}
    return result


def server_timing(value: str) -> dict[str, float]:
    """A ``Server-Timing`` header's durations by name, in milliseconds (entries without one are left out)."""
    durations = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        name, _, params = entry.partition(";")
        for param in params.split(";"):
            key, _, number = param.strip().partition("=")
            if key == "dur":
                durations[name.strip()] = float(number)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--prompt-tokens", type=int, default=100, help="about this many prompt words")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--key", help="an API key, when the deployment requires one")
    args = parser.parse_args()
    print(json.dumps(probe(args.url, args.requests, args.prompt_tokens, args.max_tokens, args.key), indent=2))


if __name__ == "__main__":
    main()
