"""The simulated replica: the same Ray Serve face as :class:`replicas.deployment.VLLMReplica`, backed by
:class:`replicas.sim_engine.SimEngine` stepping in real time (``asyncio.sleep`` for each step's modelled
duration, times ``spec.time_scale``). The gateway, the global queue, placement and the metrics all run for real in front of it, so a
fleet of 16-64 replicas and thousands of requests per second can be exercised on a machine with no GPU.

It answers completions and chat completions in vLLM's OpenAI format (streamed or not) with placeholder
text; prompt lengths are the token ids' count, or a rough 4 characters per token for text.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from policies.types import EngineSignals
from replicas.base import Endpoint, ReplicaBase, ReplicaReply
from replicas.sim_engine import COST_MODELS, SimEngine, SimEngineSettings, SimRequest
from replicas.spec import ReplicaSpec

DEFAULT_OUTPUT_TOKENS = 16
KV_TOKENS = 500_000


class SimReplica(ReplicaBase):
    """A simulated engine behind a Ray Serve replica (``model.simulated`` in the app config)."""

    async def __init__(self, spec: ReplicaSpec) -> None:
        self._adopt(spec)
        self._model = spec.served_model_name
        settings = SimEngineSettings.model_validate({**spec.engine, "own_prompt_limit": spec.own_prompt_limit()})
        self._engine = SimEngine(settings, COST_MODELS[spec.simulated or "gpu-h100-llama3-8b"], KV_TOKENS)
        self._tokens: dict[str, asyncio.Queue[bool]] = {}
        self._wake = asyncio.Event()
        self._loop_task = asyncio.create_task(self._run_engine())
        await self._join_fleet(settings.max_num_seqs, KV_TOKENS, settings.max_num_batched_tokens,
                               settings.long_prefill_token_threshold, publish_metrics=False)

    async def _run_engine(self) -> None:
        while True:
            if not self._engine.has_work():
                self._wake.clear()
                await self._wake.wait()
            plan = self._engine.plan_step()
            if not plan.work:
                continue
            await asyncio.sleep(plan.duration_s * self.spec.time_scale)
            outcome = self._engine.finish_step(plan)
            for request in outcome.emitted:
                queue = self._tokens.get(request.request_id)
                if queue is not None:
                    queue.put_nowait(request.finished)
            self.engine_stepped()

    def engine_signals(self) -> EngineSignals:
        """The simulated engine's state, as vLLM's scheduler stats would report it."""
        return EngineSignals(unstarted=self._engine.unstarted, unstarted_tokens=self._engine.unstarted_tokens,
                             running=len(self._engine.running),
                             waiting=self._engine.waiting, kv_usage=self._engine.kv_usage,
                             received=self.tracker.received)

    def engine_served(self) -> dict[str, int]:
        """Tokens the simulated engine has served so far for each running request."""
        return {request.request_id: request.prompt_tokens + request.generated for request in self._engine.running}

    async def serve(self, endpoint: Endpoint, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | str]:
        """Run one request on the simulated engine; the same messages as vLLM's replica."""
        request_id = str(body.get("request_id") or uuid.uuid4().hex)
        output = int(body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_OUTPUT_TOKENS)
        request = SimRequest(request_id, _prompt_tokens(endpoint, body), output,
                             priority=int(body.get("priority") or 0), arrival_s=time.monotonic())
        tokens: asyncio.Queue[bool] = asyncio.Queue()
        self._tokens[request_id] = tokens
        self._engine.add(request)
        self._wake.set()
        try:
            if not body.get("stream"):
                try:
                    while not await tokens.get():
                        pass
                except asyncio.CancelledError:
                    self.cut_short(request_id, _usage(request)["total_tokens"])
                    raise
                yield ReplicaReply(status=200, body=self._completion(endpoint, request)).model_dump()
                return
            yield ReplicaReply(status=200, stream=True).model_dump()
            finished = False
            while not finished:
                finished = await tokens.get()
                yield _sse(self._chunk(endpoint, request_id, finished))
            if (body.get("stream_options") or {}).get("include_usage"):
                yield _sse({"id": request_id, "object": "text_completion", "model": self._model, "choices": [],
                            "usage": _usage(request)})
            yield "data: [DONE]\n\n"
        finally:
            self._tokens.pop(request_id, None)
            self._engine.abort(request_id)  # no-op when it finished; frees its slot when the client left

    def _chunk(self, endpoint: Endpoint, request_id: str, finished: bool) -> dict[str, Any]:
        reason = "length" if finished else None
        if endpoint == "chat":
            return {"id": request_id, "object": "chat.completion.chunk", "model": self._model,
                    "choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": reason}]}
        return {"id": request_id, "object": "text_completion", "model": self._model,
                "choices": [{"index": 0, "text": " tok", "finish_reason": reason}]}

    def _completion(self, endpoint: Endpoint, request: SimRequest) -> dict[str, Any]:
        text = " tok" * request.generated
        if endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            kind = "chat.completion"
        else:
            choice, kind = {"index": 0, "text": text, "finish_reason": "length"}, "text_completion"
        return {"id": request.request_id, "object": kind, "model": self._model, "choices": [choice],
                "usage": _usage(request)}

    async def models(self) -> dict[str, Any]:
        """The served model, as vLLM lists it."""
        return {"object": "list", "data": [{"id": self._model, "object": "model", "owned_by": "fleetgate-sim"}]}

    def __del__(self) -> Awaitable[None] | None:
        """Serve's graceful stop: stop the engine loop and leave the fleet (Serve awaits the deregistration)."""
        task = getattr(self, "_loop_task", None)
        if task is not None:
            task.cancel()
        return self._leave_fleet()

    async def check_health(self) -> None:
        """Healthy while the engine loop runs."""
        if self._loop_task.done():
            raise RuntimeError("simulated engine loop stopped")


def _prompt_tokens(endpoint: Endpoint, body: dict[str, Any]) -> int:
    if endpoint == "chat":
        return max(1, sum(len(str(m.get("content", ""))) for m in body.get("messages", [])) // 4)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return max(1, len(prompt))
    return max(1, len(str(prompt)) // 4)


def _usage(request: SimRequest) -> dict[str, int]:
    return {"prompt_tokens": request.prompt_tokens, "completion_tokens": request.generated,
            "total_tokens": request.prompt_tokens + request.generated}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"
