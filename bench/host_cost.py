"""What each process on the host spends per streamed request: CPU seconds over a closed-loop load.

    python -m bench.host_cost --url http://127.0.0.1:8000 [--requests 200] [--concurrency 8] [--max-tokens 64]

Sends ``--requests`` streamed chat requests, ``--concurrency`` at a time, each generating exactly
``--max-tokens`` tokens (``ignore_eos``), and reads every process's CPU time from /proc before and after.
Prints the rate reached and, per process name (Ray's actor titles: the proxy, the gateway, each pool's
replicas; vLLM's engine core and worker), the CPU milliseconds per request. On a host where everything
shares a few cores this is where a deployment's capacity goes (docs/development.md, "Host cost").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import httpx

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds_by_process() -> dict[int, tuple[str, float]]:
    """Per live process: (its name, as Ray and vLLM set it, else its command), CPU seconds so far."""
    seen: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        name = stat.split("(", 1)[1].rsplit(")", 1)[0]
        fields = stat.rsplit(")", 1)[1].split()
        title = command if command.startswith(("ray::", "VLLM::")) else name
        seen[int(entry.name)] = (title, (int(fields[11]) + int(fields[12])) / _TICK)
    return seen


def cost_per_request(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                     requests: int) -> dict[str, float]:
    """CPU milliseconds per request, summed per process name (processes that used under 10 ms left out)."""
    cost: dict[str, float] = {}
    for pid, (title, seconds) in after.items():
        used = seconds - before.get(pid, (title, 0.0))[1]
        if used > 0.01:
            cost[title] = cost.get(title, 0.0) + used * 1000 / requests
    return dict(sorted(cost.items(), key=lambda item: -item[1]))


async def _load(url: str, model: str, requests: int, concurrency: int, max_tokens: int) -> None:
    slots = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        async def one(index: int) -> None:
            body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
                    "messages": [{"role": "user", "content": f"{index} tell me a story about " + "a cat " * 30}]}
            async with slots, client.stream("POST", "/v1/chat/completions", json=body) as reply:
                reply.raise_for_status()
                async for _ in reply.aiter_lines():
                    pass

        await asyncio.gather(*(one(index) for index in range(requests)))


def measure(url: str, requests: int, concurrency: int, max_tokens: int) -> dict[str, object]:
    """Warm up, then run the load and return its rate and CPU per request per process name."""
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    asyncio.run(_load(url, model, concurrency, concurrency, max_tokens))
    before, started = cpu_seconds_by_process(), time.perf_counter()
    asyncio.run(_load(url, model, requests, concurrency, max_tokens))
    elapsed, after = time.perf_counter() - started, cpu_seconds_by_process()
    costs = cost_per_request(before, after, requests)
    return {"requests": requests, "concurrency": concurrency, "max_tokens": max_tokens,
            "seconds": round(elapsed, 2), "requests_per_s": round(requests / elapsed, 2),
            "cpu_ms_per_request": {title: round(ms, 1) for title, ms in costs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.host_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(measure(args.url, args.requests, args.concurrency, args.max_tokens), indent=1))


if __name__ == "__main__":
    main()
