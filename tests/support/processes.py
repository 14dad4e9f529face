"""Processes of a running `serve run` deployment: find a deployment's replica actors, and kill one the way
a crash of its machine would. The fault tests and the soak benchmark use them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


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
