"""One log line per outage of a dependency, not one per failed call.

During a Redis outage every request, heartbeat, report and inbox read fails, each on its own schedule: an
11 s outage of the local deployment's Redis logged about 110 warnings across one gateway and two replicas,
and none said when Redis answered again. An :class:`OutageLog` logs the first failure, then at most one
summary per ``every_s`` (how many failed since, and the last error), and one line when a call succeeds again
(how long it was down, how many calls failed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class OutageLog:
    """The failures and recovery of one kind of call (``what``), logged once per outage."""

    def __init__(self, logger: logging.Logger, what: str, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger, self._what, self._every_s, self._clock = logger, what, every_s, clock
        self._down_since: float | None = None
        self._failures = 0  # in this outage
        self._unreported = 0  # since the last line
        self._last_line = 0.0

    @property
    def down(self) -> bool:
        """Whether the last call failed."""
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        """A call failed with ``exc``."""
        now = self._clock()
        self._failures += 1
        if self._down_since is None:
            self._down_since, self._last_line, self._unreported = now, now, 0
            self._logger.warning("%s failed (%s); further failures are summarised every %g s until it works",
                                 self._what, _describe(exc), self._every_s)
            return
        self._unreported += 1
        if now - self._last_line >= self._every_s:
            self._logger.warning("%s still failing: %d more failures in %.0f s (last: %s)", self._what,
                                 self._unreported, now - self._last_line, _describe(exc))
            self._last_line, self._unreported = now, 0

    def succeeded(self) -> None:
        """A call succeeded: ends the outage, if there was one."""
        if self._down_since is None:
            return
        self._logger.warning("%s works again after %.1f s (%d failed calls)", self._what,
                             self._clock() - self._down_since, self._failures)
        self._down_since, self._failures, self._unreported = None, 0, 0


def _describe(exc: BaseException) -> str:
    """The error's type, and its message where it has one (redis-py's say what it could not reach, never a
    request's contents)."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
