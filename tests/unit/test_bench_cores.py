"""A live run's core split: engine processes (every thread) to the engine cores, the rest to the others."""

import os
import subprocess
import sys

from bench.cores import confine_processes, confine_threads, host_cores

SPIN = "import threading, time; [threading.Thread(target=time.sleep, args=(60,)).start() for _ in range(3)]; time.sleep(60)"


def test_an_engine_process_and_all_its_threads_move_and_nothing_else_does() -> None:
    cores = sorted(os.sched_getaffinity(0))
    engine_core = [cores[-1]]
    marker = "fleetgate-test-engine-%d" % os.getpid()
    engine = subprocess.Popen([sys.executable, "-c", SPIN, marker])
    bystander = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        while len(os.listdir(f"/proc/{engine.pid}/task")) < 4:  # its three threads have started
            pass
        moved = confine_processes(lambda comm, cmdline: marker in cmdline, engine_core)
        assert moved == [engine.pid]
        for tid in os.listdir(f"/proc/{engine.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == set(engine_core)
        assert os.sched_getaffinity(bystander.pid) == set(cores)
    finally:
        engine.kill()
        bystander.kill()


def test_the_host_keeps_the_other_cores() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert host_cores([cores[-1]]) == cores[:-1]
    assert host_cores(cores) == []  # the runner refuses a split that leaves the host nothing


def test_the_load_client_runs_ahead_of_the_host_while_it_drives_and_not_after() -> None:
    from bench.cores import ahead_of_the_host

    before = os.getpriority(os.PRIO_PROCESS, 0)
    with ahead_of_the_host(-5) as allowed:
        if allowed:
            assert os.getpriority(os.PRIO_PROCESS, 0) == -5
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_the_session_runs_ahead_too_where_the_kernel_groups_sessions() -> None:
    from pathlib import Path

    from bench.cores import _autogroup_nice, ahead_of_the_host

    autogroup = Path("/proc/self/autogroup")
    before = _autogroup_nice(autogroup)
    with ahead_of_the_host(-5) as allowed:
        if allowed and before is not None:
            assert _autogroup_nice(autogroup) == -5
    assert _autogroup_nice(autogroup) == before


def test_autogroups_are_off_while_the_client_drives_and_back_after(tmp_path) -> None:
    from bench.cores import autogroups_off

    sysctl = tmp_path / "sched_autogroup_enabled"
    sysctl.write_text("1\n")
    with autogroups_off(sysctl) as off:
        assert off and sysctl.read_text() == "0"
    assert sysctl.read_text().strip() == "1"
    sysctl.write_text("0")
    with autogroups_off(sysctl) as off:  # already off: left off
        assert off
    assert sysctl.read_text() == "0"
    with autogroups_off(tmp_path / "missing") as off:  # no such setting (or not permitted): a plain run
        assert not off
