"""How much load bench/client.py can drive on this machine: against a stub SSE server that answers at once.

    python -m bench.client_capacity [--rate 400] [--seconds 10] [--tokens 32]

The stub (aiohttp, another process) streams ``--tokens`` chunks per request with no delay, so what limits
the run is the client (and the loopback). It prints requests/s and chunks/s completed, and how late the
client sent requests against their planned open-loop times (P50/P99 lag): while the lag stays small the
client is not the bottleneck at that rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time

from bench.client import drive
from bench.metrics import percentile
from bench.prompts import Prompts
from bench.workload import PlannedRequest


def _serve(port: int, tokens: int) -> None:
    from aiohttp import web

    chunk = ("data: " + json.dumps({"choices": [{"index": 0, "text": " x", "finish_reason": None}]}) + "\n\n").encode()

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(tokens):
            await response.write(chunk)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def main(argv: list[str] | None = None) -> int:
    """Drive the stub at the given rate and report what the client achieved."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=400)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = multiprocessing.Process(target=_serve, args=(port, args.tokens), daemon=True)
    server.start()
    time.sleep(1.5)
    count = int(args.rate * args.seconds)
    workload = [PlannedRequest(request_id=str(i), tenant="t", weight=1, band="standard", send_s=i / args.rate,
                               prompt_tokens=args.prompt_tokens, output_tokens=args.tokens) for i in range(count)]
    started = time.perf_counter()
    records = asyncio.run(drive(f"http://127.0.0.1:{port}", "stub", workload, Prompts(1000), lambda r: ({}, {}),
                                lambda _: None, max_in_flight=4096))
    elapsed = time.perf_counter() - started
    server.terminate()
    ok = [r for r in records if r.ok]
    lag = [r.send_s - p.send_s for r, p in zip(records, workload)]
    print(json.dumps({"offered_rps": args.rate, "completed": len(ok), "of": count, "elapsed_s": round(elapsed, 2),
                      "completed_rps": round(len(ok) / elapsed, 1),
                      "chunks_per_s": round(sum(len(r.token_s) for r in ok) / elapsed),
                      "send_lag_p50_ms": round(percentile(lag, 50) * 1000, 2),
                      "send_lag_p99_ms": round(percentile(lag, 99) * 1000, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
