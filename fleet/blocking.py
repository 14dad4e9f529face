"""The blocking form of an asyncio client, derived rather than written twice.

``blocking(factory)`` builds the async object (a :class:`fleet.queue.GlobalQueue`, say) on a private event
loop in a daemon thread and runs each of its coroutine methods there to completion, so blocking code (the
status CLI, tests, tools) calls the very methods the gateway calls, with the same results.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Blocking(Generic[T]):
    """A proxy whose coroutine methods block until done; other attributes are the async object's own."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="fleet-blocking", daemon=True).start()
        self.target: T = self.run(self._build(factory))

    @staticmethod
    async def _build(factory: Callable[[], T]) -> T:
        return factory()  # on the private loop, so whatever the object binds to that loop is its own

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run one awaitable on the private loop and return its result."""
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._loop).result()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.target, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(attribute(*args, **kwargs))

        return call


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def blocking(factory: Callable[[], T]) -> Any:
    """A blocking proxy of the object ``factory`` builds (typed as Any: its methods return plain results)."""
    return Blocking(factory)
