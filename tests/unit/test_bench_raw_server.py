"""The idle-overhead baseline is started with the engine a pool's replicas run, wait between its processes
included (without it the raw server is measured in vLLM's spinning mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.raw_server import REPO_ROOT, raw_server_command

LOCAL = REPO_ROOT / "deploy" / "local.yaml"


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_raw_server_runs_the_pools_engine_with_its_wait_and_core() -> None:
    argv, env = raw_server_command(LOCAL, "latency", 8123, frozenset({"avx512_bf16"}))
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _option(argv, "--max-num-batched-tokens") == "128"
    assert _option(argv, "--long-prefill-token-threshold") == "64"
    assert _option(argv, "--scheduling-policy") == "priority" and _option(argv, "--port") == "8123"
    assert Path(_option(argv, "--model")).is_absolute() and _option(argv, "--served-model-name") == "tiny-llama"
    assert _option(argv, "--dtype") == "auto" and "--tool-call-parser" in argv
    assert env == {"FLEETGATE_ENGINE_SPIN_MS": "2.0", "VLLM_CPU_OMP_THREADS_BIND": "0", "OMP_NUM_THREADS": "1"}
    throughput, env = raw_server_command(LOCAL, "throughput", 8123, frozenset())
    assert _option(throughput, "--max-num-batched-tokens") == "2048" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert _option(throughput, "--dtype") == "float32"  # as the replicas take it on a CPU without native bf16


def test_an_unknown_pool_is_named() -> None:
    with pytest.raises(SystemExit, match="no pool 'fast'.*latency, throughput"):
        raw_server_command(LOCAL, "fast", 8100)
