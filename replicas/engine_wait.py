"""How a vLLM engine's processes wait for each other between steps, on hosts with few cores.

vLLM's engine core and its worker process pass every step through shared-memory queues. A reader that has
just read keeps checking for the next message with ``sched_yield`` for a whole second
(``SpinCondition.busy_loop_s`` in ``vllm/distributed/device_communicators/shm_broadcast.py``, fixed in
0.32) before it sleeps on a socket. Under steady load that second never ends, so each engine keeps its
readers spinning: measured on a 2-core host, a local deployment's engine processes took 240 + 54 ms of CPU
per streamed request, most of it spinning, while the Serve proxy and the gateway starved.

With ``spin_ms`` set, a reader spins (yielding the core) only that long after its last read, which covers
the gap between two steps of a busy engine; for the rest of vLLM's busy second it checks every
:data:`SLEEP_S` and sleeps in between, and after that it waits on the socket as vLLM does. Installed in
every engine process by vLLM's ``vllm.general_plugins`` entry point (pyproject.toml), when the replica sets
:data:`SPIN_MS_ENV` before it starts its engine; without it vLLM is left as it is.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
import os
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(f"vllm.{__name__}")  # under vLLM's logger: it prints in the engine processes

SPIN_MS_ENV = "FLEETGATE_ENGINE_SPIN_MS"
SLEEP_S = 0.0002  # between checks once the spin is over: about a tenth of a small model's CPU step


def gentle_wait(original: Callable[..., None], spin_s: float, sleep_s: float = SLEEP_S,
                clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                yield_core: Callable[[], None] = os.sched_yield) -> Callable[..., None]:
    """``SpinCondition.wait`` that spins ``spin_s`` after the last read, then sleeps ``sleep_s`` per check
    until vLLM's busy window ends, then waits as ``original`` does."""

    def wait(self: Any, timeout_ms: int | None = None) -> None:
        since_read = clock() - self.last_read
        if since_read > self.busy_loop_s:
            original(self, timeout_ms)
        elif since_read <= spin_s:
            yield_core()
        else:
            sleep(sleep_s)

    wait.fleetgate_spin_s = spin_s  # type: ignore[attr-defined]
    return wait


def install(spin_ms: float) -> bool:
    """Make this process's vLLM shared-memory readers spin at most ``spin_ms``; False where this vLLM has
    no such reader (another version): it is then left as it is."""
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        return False
    wait = getattr(SpinCondition, "wait", None)
    if wait is None or "busy_loop_s" not in inspect.signature(SpinCondition.__init__).parameters:
        logger.warning("this vLLM's shared-memory reader is not the one engine_wait knows; left as it is")
        return False
    original = getattr(wait, "fleetgate_original", wait)
    patched = gentle_wait(original, spin_ms / 1000)
    patched.fleetgate_original = original  # type: ignore[attr-defined]
    SpinCondition.wait = patched
    if wait is original:  # the first time in this process (vLLM loads its plugins more than once)
        logger.info("engine process %d: shared-memory readers spin %.1f ms, then sleep between checks",
                    os.getpid(), spin_ms)
    return True


def plugin_registered() -> bool:
    """True when vLLM will find :func:`install_from_env` (the project is installed with its entry points)."""
    return any(plugin.value == f"{__name__}:install_from_env"
               for plugin in importlib.metadata.entry_points(group="vllm.general_plugins"))


def install_from_env() -> None:
    """vLLM's general-plugin hook, run in every engine process: install when :data:`SPIN_MS_ENV` is set."""
    value = os.environ.get(SPIN_MS_ENV, "")
    if not value:
        return
    try:
        spin_ms = float(value)
    except ValueError:
        logger.warning("%s=%r is not a number of milliseconds; vLLM's own wait is kept", SPIN_MS_ENV, value)
        return
    install(spin_ms)
