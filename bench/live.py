"""``python -m bench live``: the four systems as real `serve run` deployments on this machine, driven by an
open-loop streaming client.

* baseline / baseline-priority / baseline-prefix: Ray Serve LLM (bench/deploy/ray-serve-llm.yaml); the second
  with vLLM's priority scheduling and each request's band sent as its body ``priority``, the third with Ray
  Serve LLM's prefix-aware router (scenarios whose tenants share prefixes);
* no-queue / gateway: deploy/local.yaml (the gateway's two pools), without and with the global queue;
  tenants and bands travel as ``x-tenant-id`` and ``x-priority`` (local anonymous mode, no tenants file).

The client (bench/client.py) sends every request at its planned time whatever the server's state, streams
it and records the arrival time of every chunk. Prompts are the planned length (bench/prompts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from bench.client import drive
from bench.cores import ahead_of_the_host, autogroups_off, confine_processes, confine_threads, host_cores
from bench.engine_queue import QueueSampler
from bench.headroom import (
    CpuSampler, histogram_p99, real_engine, scrape_lag_histogram, scrape_serve_lags, serve_lag_env, serve_lag_p99s,
    serve_starved, simulated_engine, verdict,
)
from bench.metrics import RequestRecord, percentile
from bench.models import resolve
from bench.prompts import Prompts
from gateway.http_guard import GUARD_ENV
from tests.support.serve_launcher import REPO_ROOT, serve_run
from bench.systems import BAND_PRIORITY, PREFIX_AWARE
from bench.workload import PlannedRequest, Scenario
from replicas.engine_settings import flag_groups


SERVE_METRICS_SETTLE_S = 2.5  # a scenario's last Serve loop samples reach Ray's metrics export in this time


class LiveRunner:
    """Keeps one system's deployment up while its scenarios run; switches when the system changes."""

    note = "client: bench/client.py (aiohttp, open loop, one process)"

    def __init__(self, config: Path, max_in_flight: int, out_dir: Path, simulated: str | None = None,
                 replicas: int = 16, model: str = "bench", time_scale: float = 1.0,
                 baseline_config: Path = REPO_ROOT / "bench" / "deploy" / "ray-serve-llm.yaml",
                 engine_cores: list[int] | None = None) -> None:
        self._simulated = simulated
        self._replicas = replicas
        self._time_scale = time_scale
        self.model_name, self.model_path = resolve(model)
        self._baseline_config = baseline_config
        # every system's engines share these cores, everything else the others (None: the configs' own binding)
        self._engine_cores = engine_cores if simulated is None else None
        self.where = (f"this machine ({os.cpu_count()} cores): real vLLM, model {self.model_name}, `serve run` of "
                      f"{config} (baselines: {baseline_config})")
        self._host_cores = host_cores(self._engine_cores) if self._engine_cores else None
        if self._engine_cores:
            if not self._host_cores:
                raise SystemExit(f"--engine-cores {_bind(self._engine_cores)} leaves no core for the rest of the host")
            self.where += (f"; every system's engine processes confined to core(s) {_bind(self._engine_cores)}, "
                           f"everything else (Ray, proxy, gateways, Redis, load client) to {_bind(self._host_cores)}")
        if simulated is not None:
            self.where = (f"this machine: the gateway under `serve run` in front of {replicas} simulated replicas "
                          f"(replicas/sim_replica.py, profile {simulated}, every engine step {time_scale:g}x its "
                          f"modelled time: times here are {time_scale:g}x the GPU's, rates 1/{time_scale:g})")
        self._config = config
        self._out_dir = out_dir
        self._max_in_flight = max_in_flight
        self._system: str | None = None
        self._stack = contextlib.ExitStack()
        self._base_url = ""
        self.last_headroom: dict | None = None  # the last run's host headroom (bench/headroom.py)
        self.last_queues: dict | None = None  # where its backlog waited (bench/engine_queue.py; gateway systems)
        self._ungrouped = False  # the kernel's autogroups are off while a deployment runs (bench/cores.py)
        self._prompts = Prompts.for_model(self.model_path)

    def run(self, system: str, scenario: Scenario, workload: list[PlannedRequest],
            progress: Callable[[int], None]) -> list[RequestRecord]:
        """Run ``workload`` against ``system`` (bringing its deployment up if another one runs)."""
        if system != self._system:
            self.start(system)
        client_lags: list[float] = []
        behind_gateway = self._simulated is not None or not system.startswith("baseline")
        gateway_before = _gateway_lags(self._base_url, behind_gateway)
        serve_before = scrape_serve_lags()
        queues = QueueSampler(self._base_url) if behind_gateway else contextlib.nullcontext()
        with CpuSampler(simulated_engine if self._simulated else real_engine) as cpu, ahead_of_the_host() as ahead, \
                queues:
            records = asyncio.run(drive(self._base_url, self.model_name, workload, self._prompts, _shaper(system),
                                        progress, self._max_in_flight, loop_lags=client_lags))
        client_p99 = percentile(client_lags, 99)
        gateway_p99 = histogram_p99(gateway_before, _gateway_lags(self._base_url, behind_gateway))
        time.sleep(SERVE_METRICS_SETTLE_S)  # Ray's workers report their metrics every second (serve_lag_env)
        serve_p99s = serve_lag_p99s(serve_before, scrape_serve_lags())
        self.last_headroom = {**cpu.summary(), "client_loop_lag_p99_ms": _ms(client_p99),
                              "gateway_loop_lag_p99_ms": _ms(gateway_p99),
                              "serve_loop_lag_p99_ms": {group: _ms(p99) for group, p99 in serve_p99s.items()},
                              "host_starved": verdict(client_p99, gateway_p99) or serve_starved(serve_p99s),
                              "client_niced": ahead, "autogroups_off": self._ungrouped}
        # after the settle: the replicas' last vLLM metrics have reached the gateway's board by then
        self.last_queues = queues.summary() if isinstance(queues, QueueSampler) else None
        return records

    def start(self, system: str) -> None:
        """Bring ``system`` up (stopping the one running), warmed and ready."""
        self.close()
        # off before Ray starts: a process stays in the group it was started in when the setting changes
        self._ungrouped = self._stack.enter_context(autogroups_off())
        if self._host_cores:  # what this process starts (serve run, Ray, Redis) inherits its cores
            confine_threads(os.getpid(), self._host_cores)
        engines_before = _vllm_orphans()
        self._stack.callback(lambda: _kill_new_orphans(engines_before))
        work = self._out_dir / "deployments" / system  # its config copy and `serve run` log stay for reading
        work.mkdir(parents=True, exist_ok=True)
        if system.startswith("baseline") and self._simulated is None:
            def edit(args: dict) -> None:
                args.update(model_name=self.model_name, model_path=str(self.model_path))
                if self._engine_cores:
                    args["env"] = {**args.get("env", {}), "VLLM_CPU_OMP_THREADS_BIND": _bind(self._engine_cores)}
                if system == "baseline-priority":
                    args["engine_kwargs"]["scheduling_policy"] = "priority"
                if system == PREFIX_AWARE:
                    args["request_router"] = "prefix-aware"
            # Ray Serve LLM as shipped: without the gateway's header guard in its proxy (empty: Ray reads none)
            config, env = self._baseline_config, {**serve_lag_env(), **dict.fromkeys(GUARD_ENV, "")}
        else:
            from tests.support.local_redis import running_redis

            redis_url = self._stack.enter_context(running_redis(work / "redis"))

            def edit(args: dict) -> None:
                args["model"].update(name=self.model_name, path=str(self.model_path), build_tiny_model=False)
                args["access"] = {"allow_anonymous": True, "trust_tenant_header": True}
                args.setdefault("metrics", {})["require_scrape_key"] = False  # the bench scrapes loop lag
                if self._engine_cores and self._simulated is None:
                    for pool in args["pools"]:
                        pool["cpu_binding"] = {"cores": self._engine_cores, "cores_per_replica": len(self._engine_cores)}
                for pool in args["pools"]:
                    engine = pool.get("engine", {})
                    engine["extra_args"] = without_tool_calling(engine.get("extra_args", []))
                args["queue"]["enabled"] = system == "gateway"
                args["queue"]["redis_url"] = redis_url
                if self._simulated is not None:
                    _simulated_fleet(args, system, self._simulated, self._replicas)
                    args["model"]["simulated_time_scale"] = self._time_scale
                    _dilate_queue(args["queue"], self._time_scale)
            config, env = self._config, {"REDIS_URL": redis_url, **serve_lag_env()}
        self._base_url = self._stack.enter_context(serve_run(config, work, env=env, edit=edit))
        _warm_up(self._base_url, self.model_name)  # every engine is up once completions succeed
        if self._engine_cores and not confine_processes(real_engine, self._engine_cores):
            raise RuntimeError(f"{system}: no vLLM engine process found to confine to the engine cores")
        self._system = system

    @property
    def base_url(self) -> str:
        """The running system's URL."""
        return self._base_url

    @property
    def prompts(self) -> Prompts:
        """Prompts in the model's tokens."""
        return self._prompts

    def close(self) -> None:
        """Stop the running deployment (and any vLLM engine process it left orphaned)."""
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._system = None


TOOL_CALLING_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser")


def without_tool_calling(extra_args: list[str]) -> list[str]:
    """``extra_args`` without vLLM's tool-call parser: the scenarios send no tools and the Ray Serve LLM
    baselines run none, so every system streams through the same path; and a model folder of another family
    than the config's parser serves (vLLM refuses to start a parser its tokenizer cannot serve)."""
    return [token for flag, tokens in flag_groups(extra_args) if flag not in TOOL_CALLING_FLAGS for token in tokens]


def engine_cores_option(value: str) -> list[int] | None:
    """``--engine-cores``: 'auto' (:func:`default_engine_cores`), 'config' (None: the configs' own binding),
    or the cores, e.g. '1' or '2,3'."""
    if value == "auto":
        return default_engine_cores()
    return None if value == "config" else [int(core) for core in value.split(",")]


def default_engine_cores() -> list[int] | None:
    """On a small host (4 cores or fewer), every engine shares the last core and the rest of the host (Serve's
    proxy, the gateways, Redis, the load client) keeps the others; otherwise the configs' own binding."""
    cores = sorted(os.sched_getaffinity(0))
    return [cores[-1]] if 1 < len(cores) <= 4 else None


def _bind(cores: list[int]) -> str:
    return ",".join(str(core) for core in cores)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _gateway_lags(base_url: str, behind_gateway: bool) -> dict[float, float]:
    """The gateways' loop-lag histogram now (empty for a system without the gateway: Ray Serve LLM's
    baselines; the simulated fleet's baselines run on the gateway's no-queue path)."""
    return scrape_lag_histogram(base_url) if behind_gateway else {}


def _vllm_orphans() -> set[int]:
    """vLLM engine processes whose parent is gone (a stopped `serve run` can leave them; see README)."""
    import subprocess

    listing = subprocess.run(["ps", "-eo", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
    return {int(pid) for pid, ppid, comm in (line.split(None, 2) for line in listing.splitlines())
            if ppid == "1" and comm.startswith("VLLM::")}


def _kill_new_orphans(before: set[int]) -> None:
    import os
    import signal
    import time

    time.sleep(2)
    for pid in _vllm_orphans() - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _simulated_fleet(args: dict, system: str, profile_name: str, replicas: int) -> None:
    """Edit the gateway's app args into ``system`` on simulated replicas: the baselines become one pool
    with vLLM's defaults behind the gateway's no-queue path (Ray Serve LLM cannot run a simulated engine)."""
    from bench.systems import build_systems

    spec = build_systems(profile_name, replicas)[system]
    args["model"]["simulated"] = profile_name
    args["gateway"].update({"num_replicas": 2, "num_cpus": 0.1})
    args["pools"] = [{
        "name": pool.name, "num_replicas": pool.replicas, "num_cpus": 0.02, "max_ongoing_requests": 4096,
        "accepts": pool.accepts, "prefers": pool.prefers, "reserve": pool.reserve,
        "engine": pool.engine.model_dump(),
    } for pool in spec.pools]
    args["queue"]["length_classes"] = [{"name": "short", "max_prompt_tokens": spec.short_prompt_tokens},
                                       {"name": "long"}]


def _dilate_queue(queue: dict, time_scale: float) -> None:
    """The queue's own time limits on engines ``time_scale`` times slower: the longest wait and each band's
    aging stretch with them (heartbeats and leases do not: they pace the host, not the engines)."""
    queue["max_wait_s"] = queue.get("max_wait_s", 60) * time_scale
    for band in queue.get("bands", []):
        if "aging_s" in band:
            band["aging_s"] *= time_scale


def _warm_up(base_url: str, model_name: str, timeout_s: float = 600) -> None:
    """Wait until completions succeed (a /v1/models answer can come before every engine is up), then warm
    every replica with a few concurrent requests, so no scenario measures a start-up."""
    import concurrent.futures
    import time

    import httpx

    # text, not token ids: Ray Serve LLM's prefix-aware router matches text, and a prompt of ids never
    # returns from it (ray 2.60: ZeroDivisionError on an empty text, the request left pending)
    body = {"model": model_name, "prompt": "the tenant work", "max_tokens": 2}
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url, timeout=60) as client:
        while client.post("/v1/completions", json=body).status_code != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{base_url} never answered a completion")
            time.sleep(2)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: client.post("/v1/completions", json=body).status_code, range(16)))
    if set(codes) != {200}:
        raise RuntimeError(f"warm-up answers {codes}")


def _shaper(system: str) -> Callable[[PlannedRequest], tuple[dict, dict]]:
    """What each system is told about a request: (extra body fields, headers)."""
    if system in ("baseline", PREFIX_AWARE):
        return lambda request: ({}, {})
    if system == "baseline-priority":
        return lambda request: ({"priority": BAND_PRIORITY.get(request.band, 1)}, {})
    return lambda request: ({}, {"x-tenant-id": request.tenant, "x-priority": request.band})
