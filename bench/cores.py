"""Cores for a live run on a small host: the engines get theirs (this host's stand-in for the accelerators),
and the rest of the host (Ray, the Serve proxy, the gateways, Redis, the load client) keeps the others.

The bench confines itself to the host cores before it starts anything, so every process it starts inherits
them. Once a deployment is up, every thread of every engine process (vLLM's ``VLLM::`` processes) is moved
to the engine cores. vLLM's own OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND``) places only its compute
threads: measured here, the engine-core process's other threads ran on both cores and starved the host side.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path


def host_cores(engine_cores: list[int]) -> list[int]:
    """The cores this process may use that are not the engines'."""
    return sorted(set(os.sched_getaffinity(0)) - set(engine_cores))


def confine_threads(pid: int, cores: list[int]) -> int:
    """Move every thread of process ``pid`` to ``cores``; the threads moved (0 if it is gone)."""
    moved = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            os.sched_setaffinity(int(task.name), cores)
            moved += 1
        except OSError:  # the thread ended meanwhile
            continue
    return moved


def confine_processes(is_engine: Callable[[str, str], bool], cores: list[int]) -> list[int]:
    """Move every thread of every process ``is_engine(comm, cmdline)`` picks to ``cores``; their pids."""
    moved = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if is_engine(comm, cmdline) and confine_threads(int(entry.name), cores):
            moved.append(int(entry.name))
    return moved


@contextlib.contextmanager
def ahead_of_the_host(niceness: int = -10) -> Iterator[bool]:
    """Run this process ahead of the rest of the host meanwhile: the load client is the instrument, not the
    system under test (on a real bench it has a machine of its own). With the kernel's autogroups on, a
    thread's nice value only orders it within its session, and `serve run` starts Ray in a session of its
    own, so the session's autogroup gets ``niceness`` as well as every thread. Yields False where that is not
    permitted; everything is put back afterwards."""
    tids = [int(task.name) for task in Path("/proc/self/task").iterdir()]
    before = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in tids}
    autogroup = Path("/proc/self/autogroup")
    group_before = _autogroup_nice(autogroup)
    try:
        for tid in tids:
            os.setpriority(os.PRIO_PROCESS, tid, niceness)
        if group_before is not None:
            autogroup.write_text(str(niceness))
        allowed = True
    except PermissionError:
        allowed = False
    try:
        yield allowed
    finally:
        for tid, value in before.items():
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, value)
        if group_before is not None:
            with contextlib.suppress(OSError):
                autogroup.write_text(str(group_before))


AUTOGROUP_SYSCTL = Path("/proc/sys/kernel/sched_autogroup_enabled")


@contextlib.contextmanager
def autogroups_off(sysctl: Path = AUTOGROUP_SYSCTL) -> Iterator[bool]:
    """Turn the kernel's autogroup scheduling off meanwhile, so that nice values order threads across
    sessions; yields whether it is off (False where it cannot be changed), and puts it back afterwards. A
    process stays in the group it was started in, so this must come before the deployment starts.

    Renicing this session's autogroup (:func:`ahead_of_the_host`) was not enough on a 6.18 kernel (EEVDF): in
    the burst scenario the client's main thread, at nice -10 in a group at nice -10, still waited 100-290 ms
    at a time on its core's run queue behind Ray's session while that core was a third idle, and its loop
    lagged 103-150 ms at P99. With autogroups off from before Ray started, 2.2 ms (same scenario and system,
    one run each); turned off only while the client drove, 132 ms.
    """
    try:
        before = sysctl.read_text().strip()
        if before != "0":
            sysctl.write_text("0")
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        if before != "0":
            with contextlib.suppress(OSError):
                sysctl.write_text(before)


def _autogroup_nice(autogroup: Path) -> int | None:
    """The nice value of this session's autogroup ("/autogroup-25 nice 0"), None without autogroups."""
    try:
        return int(autogroup.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None
