"""The live benchmark's deployments are valid app configs: every system, real and simulated replicas."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from bench.live import _shaper, _simulated_fleet, without_tool_calling
from bench.systems import PREFIX_AWARE, SYSTEMS
from bench.workload import PlannedRequest
from gateway.config import AppConfig

LOCAL = Path(__file__).parents[2] / "deploy" / "local.yaml"


@pytest.mark.parametrize("system", [s for s in SYSTEMS if s != PREFIX_AWARE])  # real engines only
@pytest.mark.parametrize("replicas", [2, 16])
def test_simulated_fleet_config_is_valid(system: str, replicas: int) -> None:
    args = copy.deepcopy(yaml.safe_load(LOCAL.read_text())["applications"][0]["args"])
    _simulated_fleet(args, system, "gpu-h100-llama3-8b", replicas)
    config = AppConfig.model_validate(args)
    assert config.model.simulated == "gpu-h100-llama3-8b"
    assert sum(pool.num_replicas for pool in config.pools) == replicas
    one_pool = system.startswith("baseline")
    assert len(config.pools) == (1 if one_pool else 2)
    if not one_pool:  # deploy/gpu.yaml's reserve of one, where the latency pool has a replica beside it
        assert config.pools[0].reserve == (1 if replicas == 16 else 0)
    if one_pool:
        policy = config.pools[0].engine.scheduling_policy
        assert policy == ("priority" if system == "baseline-priority" else "fcfs")


def test_each_system_is_told_what_it_understands() -> None:
    request = PlannedRequest(request_id="r", tenant="t", weight=1, band="interactive", send_s=0, prompt_tokens=3,
                             output_tokens=2)
    assert _shaper("baseline")(request) == ({}, {})
    assert _shaper(PREFIX_AWARE)(request) == ({}, {})
    assert _shaper("baseline-priority")(request) == ({"priority": 0}, {})
    assert _shaper("gateway")(request) == ({}, {"x-tenant-id": "t", "x-priority": "interactive"})


def test_a_live_run_says_where_its_engines_run(tmp_path, tiny_model_path) -> None:
    from bench.live import LiveRunner

    cores = os.sched_getaffinity(0)
    runner = LiveRunner(Path("deploy/local.yaml"), 8, tmp_path, model="tiny", engine_cores=[1])
    assert "model tiny-llama" in runner.where and "confined to core(s) 1, everything else" in runner.where
    assert "confined" not in LiveRunner(Path("deploy/local.yaml"), 8, tmp_path, model="tiny").where
    assert os.sched_getaffinity(0) == cores  # nothing confined until a deployment starts


def test_a_time_scaled_fleet_waits_and_ages_on_its_own_clock() -> None:
    from bench.live import _dilate_queue

    queue = {"max_wait_s": 60, "bands": [{"name": "interactive"}, {"name": "batch", "aging_s": 30}]}
    _dilate_queue(queue, 16)
    assert queue["max_wait_s"] == 960 and queue["bands"][1]["aging_s"] == 480 and "aging_s" not in queue["bands"][0]


def test_the_engine_cores_option_reads_one_way_for_the_runner_and_the_capacity_model() -> None:
    from bench.live import default_engine_cores, engine_cores_option

    assert engine_cores_option("auto") == default_engine_cores()
    assert engine_cores_option("config") is None
    assert engine_cores_option("2,3") == [2, 3]


@pytest.mark.parametrize("config_file", ["local.yaml", "gpu.yaml"])
def test_the_benchmarked_gateway_runs_no_tool_call_parser(config_file: str) -> None:
    """The shipped configs parse tool calls; the benchmark sends no tools and its baselines run no parser."""
    (application,) = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / config_file).read_text())[
        "applications"]
    for pool in application["args"]["pools"]:
        kept = without_tool_calling(pool["engine"]["extra_args"])
        assert kept == [] and pool["engine"]["extra_args"]
    assert without_tool_calling(["--tool-call-parser=hermes", "--enable-auto-tool-choice", "--seed", "3",
                                 "--tool-call-parser", "x", "--chat-template", "t.jinja"]) == [
        "--seed", "3", "--chat-template", "t.jinja"]
