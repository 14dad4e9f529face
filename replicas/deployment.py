"""The vLLM replica: a Ray Serve deployment that owns one vLLM V1 async engine.

It serves OpenAI completions and chat completions through vLLM's own serving classes, so request
validation, chat templates, sampling parameters, usage accounting and the SSE format are vLLM's. The
reply format and the misroute check are :class:`replicas.base.ReplicaBase`'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import Any

from policies.step_budget import StepBudget
from policies.types import EngineSignals
from replicas.base import Endpoint, ReplicaBase, ReplicaReply
from replicas.cpu_binding import CpuBinding
from replicas.engine_dtype import cpu_flags, engine_dtype
from replicas.engine_signals import vllm_served, vllm_signals, vllm_step_hook
from replicas.engine_settings import EngineSettings
from replicas.engine_wait import SPIN_MS_ENV, plugin_registered
from replicas.engine_warmup import warm_lazy_kernels
from replicas.failed_replies import ERROR_EVENT, as_client_error, explain_error_event, is_engine_failure, stream_opening
from replicas.spec import ReplicaSpec
from replicas.vllm_version import check_vllm_version

logger = logging.getLogger(__name__)

FINISH_NOW_S = 3.0  # how long a cancelled request may take to finish early with its usage
FINISH_RETRY_S = 0.01


class VLLMReplica(ReplicaBase):
    """One vLLM engine behind a Ray Serve replica (chunked prefill, priority scheduling)."""

    async def __init__(self, spec: ReplicaSpec) -> None:
        self._adopt(spec)
        settings = EngineSettings.model_validate(spec.engine)
        _prepare_process_environment(spec.cpu_binding, spec.cache_dir, settings.spin_wait_ms)
        self._step_stats: Any = None
        budget = settings.step_budget(spec.own_prompt_limit())
        self._engine, self._state = await _start_engine(settings, spec.model_path, spec.served_model_name,
                                                        vllm_step_hook(self._on_engine_step), budget)
        await warm_lazy_kernels(self._engine)  # before any grant can reach it
        capacity = await self._join_fleet(settings.max_num_seqs, _kv_capacity_tokens(self._engine, settings),
                                          settings.max_num_batched_tokens, settings.long_prefill_token_threshold,
                                          publish_metrics=True)
        logger.info("vLLM replica %s ready: pool=%s capacity=%s settings=%s", self.replica_id, spec.pool,
                    capacity, settings.model_dump())

    async def serve(self, endpoint: Endpoint, body: dict[str, Any]) -> AsyncIterator[dict[str, Any] | str]:
        """vLLM's reply. When the caller goes away Ray Serve cancels this generator and the engine request is
        aborted, so no engine capacity is spent on a reply nobody reads; a reply that is not streamed is first
        finished early, so that its usage (what the engine did) is known (:meth:`ReplicaBase.cut_short`)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

        started = time.monotonic()
        try:
            if endpoint == "chat":
                request = ChatCompletionRequest.model_validate(body)
                work = self._state.openai_serving_chat.create_chat_completion(request, None)
            else:
                request = CompletionRequest.model_validate(body)
                work = self._state.openai_serving_completion.create_completion(request, None)
            result = await (work if request.stream else self._unless_cut_short(body["request_id"], work))
        except Exception as exc:  # vLLM's own mapping: validation errors are 4xx, the rest 5xx
            result = create_error_response(exc)
        if isinstance(result, ErrorResponse):
            yield self._failed(result.model_dump(), body)
            return
        rendered = time.monotonic()
        if hasattr(result, "model_dump"):  # the whole reply: its render and its run, together
            yield ReplicaReply(status=200, body=result.model_dump(exclude_none=True),
                               timings={"engine": rendered - started}).model_dump()
            return
        async for message in self._stream(result, body, {"render": rendered - started}):
            yield message

    async def _stream(self, lines: AsyncGenerator[str, None], body: dict[str, Any],
                      timings: dict[str, float]) -> AsyncIterator[dict[str, Any] | str]:
        """The reply to a stream: a failure before its first token is answered with its own status, not as a
        200 stream (replicas/failed_replies.py). Its header comes with the first token, and says how long the
        engine took to it."""
        started = time.monotonic()
        opening: list[str] = []
        reading = asyncio.ensure_future(stream_opening(lines, opening))
        try:
            error = await asyncio.shield(reading)  # so that a cancel reaches vLLM only after the count below
        except asyncio.CancelledError:  # the client left before the first token: what the engine holds of it
            self.cut_short(body["request_id"], self.engine_served().get(body["request_id"], 0))
            reading.cancel()
            raise
        if error is not None:
            await lines.aclose()
            yield self._failed(error, body)
            return
        timings["engine"] = time.monotonic() - started
        yield ReplicaReply(status=200, stream=True, timings=timings).model_dump()
        for line in opening:
            yield line
        async for line in lines:
            yield explain_error_event(line, body) if line.startswith(ERROR_EVENT) else line

    def _failed(self, error: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """The reply to a request vLLM failed: the client's status (replicas/failed_replies.py), and what the
        engine served for it (its prompt, when the engine itself ended it)."""
        client_status, client_body = as_client_error(error, body)
        served = self.tracker.prompt_tokens(body["request_id"]) if is_engine_failure(error) else 0
        return ReplicaReply(status=client_status, body=client_body, served=served).model_dump()

    async def _stream_cut(self, key: str) -> None:
        # counted, then aborted with no turn of the event loop between: vLLM's output processor drops (and
        # its counters skip) whatever the engine sends for the request after the count was read
        await super()._stream_cut(key)
        await self._abort_in_engine(key)

    async def _unless_cut_short(self, key: str, work: Awaitable[Any]) -> Any:
        """vLLM's full reply to request ``key``. If the caller is cancelled first, the engine finishes the
        request now (reason "abort", with its output so far), and its usage is recorded before re-raising."""
        running = asyncio.ensure_future(work)
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            self.cut_short(key, await self._finish_now(key, running))
            raise

    async def _finish_now(self, key: str, running: asyncio.Future[Any]) -> int | None:
        """End request ``key`` in the engine now; the tokens it served (None if that is not known in time)."""
        try:
            async with asyncio.timeout(FINISH_NOW_S):
                while not running.done() and not await self._abort_in_engine(key):
                    await asyncio.sleep(FINISH_RETRY_S)  # vLLM's serving layer is still templating or tokenising
                usage = getattr(await running, "usage", None)
                return None if usage is None else int(usage.total_tokens)
        except Exception as exc:  # the time ran out, or the request failed: the gateway charges its estimate
            logger.warning("a cancelled request's usage is unknown: %s", type(exc).__name__)
            running.cancel()
            return None

    async def _abort_in_engine(self, key: str) -> bool:
        """Abort the engine's requests for ``key`` (several for a batch of prompts or ``n`` > 1): vLLM finishes
        each with its output so far. False while the engine holds none of them yet."""
        states = self._engine.output_processor.request_states.values()
        ids = {s.external_req_id for s in states if self.tracker.key_of(s.external_req_id or "") == key}
        if ids:
            await self._engine.abort(sorted(ids))
        return bool(ids)

    def _on_engine_step(self, scheduler_stats: Any) -> None:
        self._step_stats = scheduler_stats
        self.engine_stepped()

    def engine_signals(self) -> EngineSignals:
        """The engine's last step's stats, and which of this replica's requests it has started."""
        return vllm_signals(self.tracker, self._engine, self._step_stats)

    def engine_served(self) -> dict[str, int]:
        """Tokens the engine has served so far for each of this replica's requests."""
        return vllm_served(self.tracker, self._engine)

    async def models(self) -> dict[str, Any]:
        """vLLM's own /v1/models listing for this replica."""
        listing = await self._state.openai_serving_models.show_available_models()
        return listing.model_dump()

    async def check_health(self) -> None:
        """Ray Serve's health probe: raises when the engine is dead, so Serve restarts this replica."""
        await self._engine.check_health()

    async def unfinished_requests(self) -> int:
        """Requests the engine has not finished yet (running or waiting): what an abort must bring to 0."""
        return self._engine.output_processor.get_num_unfinished_requests()

    def __del__(self) -> Awaitable[None] | None:
        """Serve's graceful stop: leave the fleet, then stop the engine, in the coroutine returned (Serve awaits
        it). The deregistration goes first: the engine's shutdown blocks the event loop for seconds, and a
        lease that lapses meanwhile reads to the queue as a crash. Without a running loop: the engine at once.
        Once: the garbage collector's later call finds nothing left to stop."""
        leaving = self._leave_fleet()
        engine, self._engine = getattr(self, "_engine", None), None
        if leaving is None:
            if engine is not None:
                engine.shutdown()
            return None
        return _leave_then_stop(leaving, engine)


async def _leave_then_stop(leaving: Awaitable[None], engine: Any) -> None:
    try:
        await leaving
    finally:
        if engine is not None:
            engine.shutdown()


def _prepare_process_environment(cpu_binding: CpuBinding | None, cache_dir: str | None,
                                 spin_wait_ms: float | None = None) -> None:
    """Set the vLLM process environment before the engine starts (its worker processes inherit it)."""
    if spin_wait_ms is not None:
        os.environ[SPIN_MS_ENV] = str(spin_wait_ms)
        if not plugin_registered():
            logger.warning("spin_wait_ms is set but vLLM will not find its plugin: reinstall the project "
                           "(pip install -e .) so that its vllm.general_plugins entry point is registered")
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
        os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(cache_dir, "vllm"))
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache_dir, "inductor"))
        rpc_dir = os.path.join(cache_dir, "rpc")
        os.makedirs(rpc_dir, exist_ok=True)
        os.environ.setdefault("VLLM_RPC_BASE_PATH", rpc_dir)
    if cpu_binding is not None:
        os.environ.update(cpu_binding.environment(_replica_local_rank()))


def _kv_capacity_tokens(engine: Any, settings: EngineSettings) -> int:
    """Tokens the engine's KV cache holds (blocks x block size); a conservative estimate if unknown."""
    cache = engine.vllm_config.cache_config
    blocks = getattr(cache, "num_gpu_blocks", None)
    if blocks:
        return int(blocks) * int(cache.block_size)
    return settings.max_num_seqs * (settings.max_model_len or 2048)


def _replica_local_rank() -> int:
    from ray import serve

    try:
        return serve.get_replica_context().rank.local_rank
    except Exception:  # outside a Serve replica (local testing mode): behave as rank 0
        return 0


async def _start_engine(settings: EngineSettings, model_path: str, served_model_name: str,
                        step_hook: type, budget: StepBudget | None = None) -> tuple[Any, Any]:
    """Start vLLM's AsyncLLM (with ``step_hook`` among its stat loggers) and its OpenAI serving state from
    vLLM's own argument parser; with a ``budget``, its scheduler steps by the work it holds."""
    from starlette.datastructures import State
    check_vllm_version()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.platforms import current_platform
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    dtype = engine_dtype(settings.dtype, current_platform.is_cpu(), cpu_flags())
    if dtype != settings.dtype:
        logger.info("engine dtype %s: this CPU has no native bf16 (replicas/engine_dtype.py)", dtype)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        settings.model_copy(update={"dtype": dtype}).to_cli_args(model_path, served_model_name, budget)
    )
    engine_args = AsyncEngineArgs.from_cli_args(args)
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    if budget is not None:
        from replicas.step_budget import use_step_budget

        use_step_budget(vllm_config, budget)
    engine = AsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=UsageContext.OPENAI_API_SERVER,
        enable_log_requests=False,
        disable_log_stats=engine_args.disable_log_stats,
        stat_loggers=[step_hook],
    )
    state = State()
    await init_app_state(engine, state, args, await engine.get_supported_tasks())
    return engine, state
