"""Runs the queue's Lua calls by name: as Redis 7 functions where the server allows them, else as scripts.

Functions cost less per call (the library is defined once, and the config is decoded only when it
changes). The library is loaded on the first call; a server without functions (Redis 6, a proxy that does
not pass them), or an account that may not load or call them (ACL), gets scripts instead (EVALSHA,
reloaded by redis-py after a restart). Any other error of the load (out of memory, loading, a cluster
shard down) fails that call alone, and the next call tries again. A server that lost the library (a
restart without persistence, a new cluster shard) answers "Function not found": the library is loaded
again, once for all the calls that saw it, and the call is repeated.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis
import redis.asyncio as aioredis

from fleet.lua_sources import SCRIPT_NAMES, function_library, script_source

logger = logging.getLogger(__name__)


def _library_missing(exc: redis.ResponseError) -> bool:
    return "function not found" in str(exc).lower()


def _unsupported(exc: redis.ResponseError) -> bool:
    """The server cannot run functions for us at all (as against a passing trouble)."""
    text = str(exc).lower()
    return isinstance(exc, redis.exceptions.NoPermissionError) or "unknown command" in text or \
        "unknown subcommand" in text or "not supported" in text


class LuaCalls:
    """The queue's Lua on one client. ``use_functions`` False: scripts only (queue.redis_functions)."""

    def __init__(self, client: aioredis.Redis, use_functions: bool = True) -> None:
        self._client = client
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}
        self._functions: bool | None = None if use_functions else False  # None: not tried yet
        self._loads = 0  # libraries loaded so far: a call that saw "not found" reloads only if none since
        self._loading: asyncio.Lock | None = None

    @property
    def form(self) -> str:
        """"functions", "scripts", or "undecided" before the first call."""
        return {None: "undecided", True: "functions", False: "scripts"}[self._functions]

    async def __call__(self, name: str, keys: list[str], args: list[str]) -> Any:
        """Run call ``name`` (one of SCRIPT_NAMES) with ``keys`` and ``args``; returns Redis's reply."""
        if self._functions is None:
            await self._load(self._loads)
        if not self._functions:
            return await self._scripts[name](keys=keys, args=args)
        function = function_library().functions[name]
        seen = self._loads
        try:
            return await self._client.fcall(function, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            if isinstance(exc, redis.exceptions.NoPermissionError):  # may load but not call: scripts, from now on
                self._use_scripts(exc)
                return await self._scripts[name](keys=keys, args=args)
            if not _library_missing(exc):
                raise
        await self._load(seen)
        return await self._client.fcall(function, len(keys), *keys, *args)

    def _use_scripts(self, exc: redis.ResponseError) -> None:
        if self._functions is not False:
            logger.info("queue: Redis functions unavailable (%s); using scripts", str(exc).split("\n")[0])
        self._functions = False

    async def _load(self, seen: int) -> None:
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if self._loads != seen or self._functions is False:  # another call loaded it, or found none
                return
            try:
                await self._client.function_load(function_library().source, replace=True)
            except redis.ResponseError as exc:
                if not _unsupported(exc):
                    raise
                self._use_scripts(exc)
                return
            if self._functions is None:
                logger.info("queue: using Redis functions (%s)", function_library().name)
            self._functions = True
            self._loads += 1
