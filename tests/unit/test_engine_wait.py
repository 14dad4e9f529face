"""How the engine's processes wait between steps (replicas/engine_wait.py): spin briefly, then sleep, then
vLLM's own socket wait; installed by vLLM's plugin hook only where the replica asks for it."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

from replicas import engine_wait
from replicas.deployment import _prepare_process_environment
from replicas.engine_settings import EngineSettings


@pytest.fixture
def vllm_wait() -> Iterator[None]:
    """Put vLLM's own wait back after each test, whatever the test installed."""
    original = SpinCondition.wait
    yield
    SpinCondition.wait = original


def _recorded_wait(spin_s: float, now: float) -> tuple[object, list[tuple[str, object]]]:
    calls: list[tuple[str, object]] = []
    wait = engine_wait.gentle_wait(lambda self, timeout_ms: calls.append(("socket", timeout_ms)), spin_s,
                                   sleep_s=0.0002, clock=lambda: now,
                                   sleep=lambda s: calls.append(("sleep", s)),
                                   yield_core=lambda: calls.append(("yield", None)))
    return wait, calls


@pytest.mark.parametrize(("since_read_s", "expected"), [
    (0.0005, ("yield", None)),     # within the spin: the next step is about to come
    (0.05, ("sleep", 0.0002)),     # after it, still in vLLM's busy second: check again shortly
    (1.5, ("socket", 250)),        # past vLLM's busy second: its own wait on the socket
])
def test_a_reader_spins_briefly_then_sleeps_then_waits_as_vllm_does(since_read_s: float, expected) -> None:
    wait, calls = _recorded_wait(spin_s=0.002, now=100.0)
    wait(SimpleNamespace(last_read=100.0 - since_read_s, busy_loop_s=1.0), 250)
    assert calls == [expected]


def test_installing_twice_keeps_vllms_own_wait_underneath(vllm_wait: None) -> None:
    original = SpinCondition.wait
    assert engine_wait.install(2)
    assert engine_wait.install(5)
    assert SpinCondition.wait.fleetgate_spin_s == 0.005
    assert SpinCondition.wait.fleetgate_original is original


def test_a_real_reader_still_wakes_on_a_write_after_its_busy_window(vllm_wait: None) -> None:
    assert engine_wait.install(2)
    context = zmq.Context()
    address = f"ipc:///tmp/fleetgate-engine-wait-{os.getpid()}"
    writer = SpinCondition(is_reader=False, context=context, notify_address=address)
    reader = SpinCondition(is_reader=True, context=context, notify_address=address, busy_loop_s=0.01)
    try:
        reader.record_read()
        reader.wait(timeout_ms=10)  # inside the spin: returns at once
        reader.last_read -= 1  # long idle: the socket wait
        for _ in range(50):  # a SUB socket drops what is sent before it has connected
            writer.notify()
            if reader.poller.poll(timeout=20):
                break
        reader.wait(timeout_ms=5000)  # the notification is there: returns without waiting the timeout
        assert not reader.poller.poll(timeout=0)  # and it consumed it, as vLLM's own wait does
    finally:
        context.destroy(linger=0)


def test_only_a_replica_that_asks_for_it_changes_vllms_wait(vllm_wait: None, monkeypatch) -> None:
    original = SpinCondition.wait
    monkeypatch.delenv(engine_wait.SPIN_MS_ENV, raising=False)
    engine_wait.install_from_env()
    assert SpinCondition.wait is original
    monkeypatch.setenv(engine_wait.SPIN_MS_ENV, "two")
    engine_wait.install_from_env()
    assert SpinCondition.wait is original
    monkeypatch.setenv(engine_wait.SPIN_MS_ENV, "2")
    engine_wait.install_from_env()
    assert SpinCondition.wait.fleetgate_spin_s == 0.002


def test_the_replica_passes_its_setting_to_the_engine_processes_and_not_to_vllms_arguments(monkeypatch) -> None:
    monkeypatch.delenv(engine_wait.SPIN_MS_ENV, raising=False)
    settings = EngineSettings(spin_wait_ms=2)
    assert not any("spin" in arg for arg in settings.to_cli_args("/m", "m"))
    _prepare_process_environment(None, None, settings.spin_wait_ms)
    assert os.environ[engine_wait.SPIN_MS_ENV] == "2.0"


def test_vllm_finds_the_plugin_in_every_engine_process() -> None:
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert [p.value for p in plugins if p.name == "fleetgate_engine_wait"] == ["replicas.engine_wait:install_from_env"]
    assert engine_wait.plugin_registered()
