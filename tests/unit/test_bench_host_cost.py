"""bench.host_cost's arithmetic: CPU per request per process name, from two /proc readings."""

from __future__ import annotations

import os

from bench.host_cost import cost_per_request, cpu_seconds_by_process


def test_cost_sums_processes_of_one_name_counts_new_ones_whole_and_leaves_out_the_idle() -> None:
    before = {1: ("ray::ProxyActor", 10.0), 2: ("VLLM::Worker", 5.0), 3: ("VLLM::Worker", 1.0), 4: ("raylet", 2.0)}
    after = {1: ("ray::ProxyActor", 12.0), 2: ("VLLM::Worker", 6.0), 3: ("VLLM::Worker", 2.5), 4: ("raylet", 2.005),
             5: ("ray::ServeReplica:app:gateway", 0.4)}
    assert cost_per_request(before, after, requests=100) == {
        "VLLM::Worker": 25.0, "ray::ProxyActor": 20.0, "ray::ServeReplica:app:gateway": 4.0}


def test_this_process_is_read_with_its_cpu_time() -> None:
    sum(i * i for i in range(200_000))  # some CPU of its own
    name, seconds = cpu_seconds_by_process()[os.getpid()]
    assert name and seconds > 0
