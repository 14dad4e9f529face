"""Where one request's time goes in the gateway, stage by stage: each lap feeds the
``fleetgate_request_stage_seconds`` histogram, and the laps so far make the reply's ``Server-Timing`` header
(W3C Server Timing: browsers' developer tools and HTTP clients read it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.metrics import GatewayMetrics


class Stages:
    """Each lap is the time since the previous one, by stage."""

    def __init__(self, metrics: GatewayMetrics, clock: Callable[[], float], start: float) -> None:
        self._metrics, self._clock, self._last = metrics, clock, start
        self.seconds: dict[str, float] = {}

    def lap(self, stage: str, at: float | None = None) -> None:
        """Record ``stage`` as ending now (or ``at``)."""
        now = self._clock() if at is None else at
        self._record(stage, max(0.0, now - self._last))
        self._last = now

    def laps(self, durations: dict[str, float]) -> None:
        """Stages measured elsewhere (admission's enqueue and wait), ending now."""
        for stage, seconds in durations.items():
            self._record(stage, seconds)
        self._last = self._clock()

    def parts(self, durations: dict[str, float]) -> None:
        """The parts of the wait for the engine's first token (:func:`first_token_parts`): in the
        ``Server-Timing`` header after the laps so far, and in their own histogram (not laps: they overlap
        ``first_token``)."""
        for part, seconds in durations.items():
            self._metrics.first_token_part.labels(part).observe(seconds)
            self.seconds[part] = seconds

    def server_timing(self) -> str:
        """The stages so far as a ``Server-Timing`` value, in milliseconds: ``parse;dur=0.4, enqueue;dur=0.9``.
        ``enqueue`` is the queue's round trip, ``wait_grant`` the wait for a grant after it (0 when granted at
        once), so a slow Redis round trip and a real wait in the queue read apart."""
        return ", ".join(f"{stage};dur={seconds * 1000:.1f}" for stage, seconds in self.seconds.items())

    def _record(self, stage: str, seconds: float) -> None:
        self._metrics.stage.labels(stage).observe(seconds)
        self.seconds[stage] = seconds


REPLICA_PARTS = ("grant_check", "render", "engine")  # what a vLLM replica times of its own part (replicas/base.py)


def first_token_parts(timings: Mapping[str, float] | None, call_s: float) -> dict[str, float]:
    """Where the wait from the replica call to its reply's header went: ``serve_hops`` (Ray Serve's hops
    there and back: the call's time less the replica's own, ``timings["replica"]``), then the replica's parts
    (its grant check, vLLM's serving layer rendering the request, and the engine to the first token). A
    vLLM replica answers a stream with its first token, so for a stream these add up to ``first_token``.
    Empty when the replica times nothing (the simulated engine, an older release)."""
    if not timings or "replica" not in timings:
        return {}
    parts = {"serve_hops": max(0.0, call_s - timings["replica"])}
    parts.update({part: max(0.0, timings[part]) for part in REPLICA_PARTS if part in timings})
    return parts
