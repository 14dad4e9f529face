"""The soak's load: workers sending a mix of requests until told to stop, each answer recorded with its
status and reason. Some clients misbehave on purpose: they time out, or drop a stream half-way."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from dataclasses import dataclass, field

import httpx

MODEL = "tiny-llama"
TENANTS = ("chat-a", "chat-b", "docs", "nightly")
BANDS = ("interactive", "standard", "batch")


@dataclass
class Answer:
    """One request's outcome as its client saw it."""

    kind: str
    at_s: float
    status: int  # 0: no HTTP status (the client gave up, or the connection broke)
    reason: str = ""


@dataclass
class LoadLog:
    answers: list[Answer] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    stalls: list[dict] = field(default_factory=list)  # {"at_s", "lag_s"}: the host froze this long

    def add(self, kind: str, status: int, reason: str = "") -> None:
        self.answers.append(Answer(kind, time.monotonic() - self.started, status, reason))


def _reason(response: httpx.Response) -> str:
    rejected = response.headers.get("x-fleetgate-rejected-reason")
    if rejected:
        return rejected
    try:
        return str(response.json()["error"].get("code") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


async def _one(client: httpx.AsyncClient, rng: random.Random, log: LoadLog) -> None:
    headers = {"x-tenant-id": rng.choice(TENANTS), "x-priority": rng.choice(BANDS)}
    roll = rng.random()
    words = " ".join(rng.choice(("fleet", "queue", "grant", "token", "replica")) for _ in range(rng.randint(5, 60)))
    if roll < 0.40:
        kind, body = "short", {"model": MODEL, "prompt": words, "max_tokens": 8, "ignore_eos": True}
    elif roll < 0.50:
        kind, body = "long", {"model": MODEL, "prompt": words * 12, "max_tokens": 4, "ignore_eos": True}
    elif roll < 0.75:
        kind, body = "stream", {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 16,
                                "stream": True}
    elif roll < 0.85:
        kind, body = "timeout", {"model": MODEL, "prompt": words, "max_tokens": 2000, "ignore_eos": True}
    elif roll < 0.95:
        kind, body = "dropped", {"model": MODEL, "prompt": words, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    else:
        kind, body = "bad", {"model": MODEL, "messages": []}
    endpoint = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    try:
        if kind == "timeout":  # the client gives up: the gateway must still end the request and charge it
            await client.post(endpoint, json=body, headers=headers, timeout=rng.uniform(0.3, 2.0))
            log.add(kind, 200)
        elif body.get("stream"):
            async with client.stream("POST", endpoint, json=body, headers=headers) as response:
                chunks, error = 0, ""
                async for line in response.aiter_lines():
                    if line.startswith("data: {") and '"error"' in line:
                        error = str(json.loads(line[6:])["error"].get("code"))
                    chunks += 1
                    if kind == "dropped" and chunks >= 3:
                        break  # the client goes away mid-stream
                log.add(kind, response.status_code, error or ("" if response.status_code == 200 else "stream"))
        else:
            response = await client.post(endpoint, json=body, headers=headers)
            log.add(kind, response.status_code, "" if response.status_code == 200 else _reason(response))
    except httpx.TimeoutException:
        log.add(kind, 0, "client_timeout")
    except httpx.HTTPError as exc:  # the proxy or a gateway went away under it
        log.add(kind, 0, type(exc).__name__)


def watch_host(log: LoadLog, stop: threading.Event, min_stall_s: float = 1.0, period_s: float = 0.1) -> None:
    """Record every time a thread that sleeps ``period_s`` wakes ``min_stall_s`` late: the whole host froze
    (CPU starvation, memory pressure) for that long. Run it in a thread of its own until ``stop``."""
    while True:
        asked = time.monotonic()
        if stop.wait(period_s):
            return
        lag = time.monotonic() - asked - period_s
        if lag >= min_stall_s:
            log.stalls.append({"at_s": round(asked - log.started, 1), "lag_s": round(lag, 2)})


async def run_load(url: str, stop: asyncio.Event, log: LoadLog, workers: int, seed: int) -> None:
    """``workers`` clients, each sending one request after another (a short pause between) until ``stop``."""
    async def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        async with httpx.AsyncClient(base_url=url, timeout=90) as client:
            while not stop.is_set():
                await _one(client, rng, log)
                await asyncio.sleep(rng.uniform(0.0, 0.3))

    await asyncio.gather(*(worker(i) for i in range(workers)))
