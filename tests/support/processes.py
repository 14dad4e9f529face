"""Processes of a running `serve run` deployment: find a deployment's replica actors, kill one the way a
crash of its machine would, or hold its engines still for a moment. The fault and e2e tests and the soak
benchmark use them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator


def replica_pids(deployment: str) -> list[int]:
    """PIDs of the Ray Serve replica actors of ``deployment`` (e.g. "gateway", "vllm-latency")."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    return [int(line.split()[0]) for line in out.splitlines()
            if f"ServeReplica:llm-gateway:{deployment}" in line and "grep" not in line]


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True, check=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines()[1:]:
        child, parent = (int(x) for x in line.split())
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(pid: int) -> None:
    """Kill a process and everything it started, as a crash of its machine would (no clean-up runs).

    A replica's vLLM engine processes outlive a SIGKILL of the replica alone (they are re-parented and keep
    their memory), so the whole tree goes, as when a node or container dies.
    """
    tree = _descendants(pid)
    os.kill(pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


@contextlib.contextmanager
def engines_stalled(deployments: list[str]) -> Iterator[None]:
    """Stop (SIGSTOP) the vLLM engine processes of ``deployments``' replicas, and continue them on exit.

    A stalled engine takes no step, as a busy GPU would for a moment: what a gate lets in waits in the
    engine, and the rest of a flood waits in the global queue, however fast this host serves. The replica
    actors themselves keep running, so their signal heartbeats and Serve's health checks go on.
    """
    engines = [child for deployment in deployments for pid in replica_pids(deployment) for child in _descendants(pid)]
    assert engines, f"no engine processes under {deployments}"
    stopped = []
    try:
        for pid in engines:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        yield
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
