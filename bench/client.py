"""The benchmark's load client: open loop, streaming, one aiohttp session.

Each planned request is sent at its planned time (not when an earlier one returns), streamed with
``stream: true``, and the arrival time of every SSE chunk that carries output is recorded; the first is the
TTFT, the gaps between them the inter-token latency. Prompts are exactly the planned length (bench/prompts.py:
fresh random token ids, or text where tenants share prefixes), ``max_tokens`` the planned output with
``ignore_eos``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable

import aiohttp

from bench.metrics import RequestRecord
from bench.prompts import Prompts
from bench.workload import PlannedRequest
from fleet.loop_lag import LoopLagMonitor

Shaper = Callable[[PlannedRequest], tuple[dict, dict]]


async def drive(base_url: str, model: str, workload: list[PlannedRequest], prompts: Prompts, shape: Shaper,
                progress: Callable[[int], None], max_in_flight: int = 512,
                timeout_s: float = 900, loop_lags: list[float] | None = None) -> list[RequestRecord]:
    """Send ``workload`` to ``base_url``/v1/completions; one record per request, in workload order. With
    ``loop_lags``, this client's own event-loop lag is sampled into it meanwhile (a late client measures
    itself, not the server)."""
    rng = random.Random(hash((base_url, len(workload))))
    texts = prompts.for_workload(workload, rng)
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(request: PlannedRequest) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + request.send_s - loop.time()))
            record = RequestRecord.planned(request)
            record.send_s = loop.time() - start
            extra_body, headers = shape(request)
            body = {"model": model, "prompt": texts.pop(request.request_id), "max_tokens": request.output_tokens,
                    "ignore_eos": True, "stream": True, "temperature": 0, **extra_body}
            try:
                await _stream(session, body, headers, record, lambda: loop.time() - start)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                record.status, record.error = record.status or 0, type(exc).__name__
                record.end_s = loop.time() - start
            progress(1)
            return record

        monitor = LoopLagMonitor(loop_lags.append) if loop_lags is not None else None
        if monitor is not None:
            monitor.start()
        try:
            return list(await asyncio.gather(*(one(r) for r in workload)))
        finally:
            if monitor is not None:
                await monitor.stop()


async def _stream(session: aiohttp.ClientSession, body: dict, headers: dict, record: RequestRecord,
                  clock: Callable[[], float]) -> None:
    async with session.post("/v1/completions", json=body, headers=headers) as response:
        record.status = response.status
        queue_ms = response.headers.get("x-fleetgate-queue-ms")
        if queue_ms is not None:  # the gateway's time in its global queue: then it went to its replica
            record.dispatched_s = record.send_s + float(queue_ms) / 1000
        record.pool = response.headers.get("x-fleetgate-pool", "")
        if response.status != 200:
            record.error = (await response.text())[:300]
            record.end_s = clock()
            return
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = clock()
            chunk = json.loads(line[6:])
            if "error" in chunk:
                record.status, record.error = 500, str(chunk["error"])[:300]
                break
            if chunk.get("choices"):
                if record.first_token_s is None:
                    record.first_token_s = now
                record.token_s.append(now)
        record.end_s = clock()
