"""What a replica tells the global queue about its engine: which of its requests have not started yet.

A request is *unstarted* from the moment it reaches the replica until its engine produces its first
token: in transit inside the replica (parsing, chat template, tokenising), waiting in the engine's queue, or
still prefilling. Inside the engine each of its engine requests counts on its own (each prompt of a batch,
each of ``n`` sequences): one grant of ``n`` = 8 whose first sequence started still has seven waiting. That
is the work the gate counts: a replica busy starting requests cannot start another promptly, and a long
prompt's prefill occupies the step budget for many steps.

:class:`RequestTracker` follows the replica's own requests by a key the replica gives each one (it becomes
the engine's request id, so no client chooses engine ids); :func:`vllm_step_hook` is a vLLM stat logger
that hands each engine step's scheduler stats over; :func:`vllm_signals` reads the signals from them.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from policies.types import EngineSignals

_KEY = re.compile(r"fgr[0-9a-f]{32}")


class RequestTracker:
    """The replica's requests in progress, their prompt tokens, which have started (produced a first token),
    and, for granted ones, what their tenants have been charged so far."""

    def __init__(self) -> None:
        self.received = 0
        self.prefill_chunk = 0  # the engine's most prompt tokens per request and step (0: no cap)
        self._started: dict[str, bool] = {}
        self._tokens: dict[str, int] = {}
        self._charges: dict[str, list] = {}  # key -> [ticket id, tokens charged for it so far]

    def enter(self, prompt_tokens: int = 0, ticket_id: str | None = None, charged: int = 0) -> str:
        """A request arrived (with its prompt tokens, when the caller counted them; with the grant's ticket and
        what it charged, when the queue granted it): its key, the engine request id it must run under."""
        key = f"fgr{uuid.uuid4().hex}"
        self._started[key] = False
        self._tokens[key] = max(0, prompt_tokens)
        if ticket_id is not None and charged > 0:
            self._charges[key] = [ticket_id, charged]
        self.received += 1
        return key

    def progress(self, served: Mapping[str, int]) -> list[tuple[str, int]]:
        """(ticket, tokens served so far) for the granted requests whose engine has served more than their
        tenants were charged (``served``: key -> the engine's count); from now on they count as charged that
        much."""
        past = []
        for key, tokens in served.items():
            charge = self._charges.get(key)
            if charge is not None and tokens > charge[1]:
                charge[1] = tokens
                past.append((charge[0], tokens))
        return past

    def started(self, key: str) -> None:
        """The request produced its first output."""
        if key in self._started:
            self._started[key] = True

    def prompt_tokens(self, key: str) -> int:
        """The prompt tokens request ``key`` arrived with (0 when not given, or when it is not in progress)."""
        return self._tokens.get(key, 0)

    def leave(self, key: str) -> None:
        """The request is over, however it ended."""
        self._started.pop(key, None)
        self._tokens.pop(key, None)
        self._charges.pop(key, None)

    def key_of(self, engine_id: str) -> str | None:
        """The key inside an engine request id (vLLM adds prefixes and suffixes), if it is one of ours."""
        match = _KEY.search(engine_id)
        return match.group(0) if match and match.group(0) in self._started else None

    def mark_started(self, engine_ids: Iterable[str]) -> None:
        """Engine requests past their prefill."""
        for engine_id in engine_ids:
            key = self.key_of(engine_id)
            if key is not None:
                self.started(key)

    def unstarted(self, outside: Iterable[str] = ()) -> tuple[int, int]:
        """The requests in progress that have produced nothing yet, and their prompt tokens (each up to the
        engine's prefill chunk, what it can take of one step); those among ``outside`` left out (the ones the
        engine holds: counted there, one engine request at a time)."""
        chunk = self.prefill_chunk or float("inf")
        held = set(outside)
        waiting = [key for key, begun in self._started.items() if not begun and key not in held]
        return len(waiting), int(sum(min(self._tokens[key], chunk) for key in waiting))


def vllm_step_hook(on_step: Callable[[Any], None]) -> type:
    """A vLLM stat logger class (for ``AsyncLLM(stat_loggers=[...])``) that calls ``on_step`` with each engine
    step's scheduler stats. vLLM calls it on the replica's event loop after the step's outputs are processed,
    so it must stay cheap: ``on_step`` only records and flags."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class EngineStepHook(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                on_step(scheduler_stats)

        def log_engine_initialized(self) -> None:
            pass

    return EngineStepHook


def _own_states(tracker: RequestTracker, engine: Any) -> Iterator[tuple[str, Any]]:
    """(key, request state) for each of the engine's requests that is one of the replica's own."""
    for state in engine.output_processor.request_states.values():
        key = tracker.key_of(getattr(state, "external_req_id", None) or state.request_id)
        if key is not None:
            yield key, state


def vllm_served(tracker: RequestTracker, engine: Any) -> dict[str, int]:
    """Tokens the engine has served so far for each of the replica's requests in it (key -> prompt and output
    tokens, as vLLM's usage will count them: ``n`` > 1 shares one prompt; a batch of prompts has one each)."""
    prompts: dict[str, dict[str, int]] = {}
    outputs: dict[str, int] = {}
    for key, state in _own_states(tracker, engine):
        parent = getattr(state, "parent_req", None)
        prompt_of = getattr(parent, "request_id", None) or state.request_id
        prompts.setdefault(key, {})[prompt_of] = state.prompt_len or 0
        outputs[key] = outputs.get(key, 0) + _output_tokens(state)
    return {key: sum(prompts[key].values()) + outputs[key] for key in prompts}


def _output_tokens(state: Any) -> int:
    if state.detokenizer is not None:
        return state.detokenizer.num_output_tokens()
    return state.stats.num_generation_tokens if state.stats is not None else 0


def vllm_signals(tracker: RequestTracker, engine: Any, stats: Any | None) -> EngineSignals:
    """The signals of a vLLM engine: its last step's scheduler stats, and the replica's own requests checked
    against the engine's request states (``is_prefilling`` until the first token), each engine request on its
    own; a request the engine does not hold yet counts once, by the gateway's count.

    An engine with no request left steps no more, so its last stats can still count a request aborted after
    that step (a client gone): with nothing unfinished, it holds nothing."""
    states = engine.output_processor.request_states
    chunk = tracker.prefill_chunk or 1 << 62
    in_engine: dict[str, list[int]] = {}  # key -> its engine requests not started, and their prompt tokens
    for key, state in _own_states(tracker, engine):
        held = in_engine.setdefault(key, [0, 0])
        if state.is_prefilling:  # waiting in the engine, or still prefilling
            held[0] += 1
            held[1] += min(state.prompt_len or 0, chunk)
        else:
            tracker.started(key)
    in_transit, in_transit_tokens = tracker.unstarted(outside=in_engine)
    mine = {"unstarted": in_transit + sum(held[0] for held in in_engine.values()),
            "unstarted_tokens": in_transit_tokens + sum(held[1] for held in in_engine.values()),
            "received": tracker.received}
    if stats is None or not states:
        return EngineSignals(**mine)
    return EngineSignals(running=stats.num_running_reqs, waiting=stats.num_waiting_reqs + stats.num_skipped_waiting_reqs,
                         kv_usage=float(stats.kv_cache_usage), **mine)
