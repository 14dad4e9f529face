"""A clock the test moves by hand: inject it where code takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class ManualClock:
    """Returns ``now``; the test advances it by assigning or adding to ``now``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
