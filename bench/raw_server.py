"""The idle-overhead baseline: a raw vLLM OpenAI server with one pool's engine, no gateway, no Ray.

    python -m bench.raw_server [--config deploy/local.yaml] [--pool latency] [--port 8100]

Runs in the foreground (Ctrl-C stops it); stop the deployment first, then probe it as the deployment is
probed (``python -m bench.idle_probe --url http://127.0.0.1:8100``). The engine is the pool's: the same vLLM
arguments (replicas/engine_settings.py), dtype and core binding, and the same wait between the engine's
processes (``spin_wait_ms``, replicas/engine_wait.py). Without that wait vLLM's readers spin for a second
after every message, and on a 2-core host the server's own process then waits for a core: its streams
arrive whole at their end in most runs (the raw server's "bad mode" in docs/development.md). Its step is
the pool's own budget; the replica's engine is started for its guarded step and steps at that budget
whenever it holds a short request, as every idle probe's request is.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from gateway.config import AppConfig
from replicas.engine_dtype import cpu_flags, engine_dtype
from replicas.engine_wait import SPIN_MS_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent


def raw_server_command(config_file: Path, pool: str, port: int,
                       flags: frozenset[str] = frozenset()) -> tuple[list[str], dict[str, str]]:
    """The command line and the environment additions of a raw vLLM server with ``pool``'s engine."""
    args = yaml.safe_load(config_file.read_text())["applications"][0]["args"]
    config = AppConfig.model_validate(args).with_absolute_paths(str(REPO_ROOT))  # as `serve run` from the checkout
    chosen = next((p for p in config.pools if p.name == pool), None)
    if chosen is None:
        raise SystemExit(f"{config_file}: no pool {pool!r} (pools: {', '.join(p.name for p in config.pools)})")
    on_cpu = chosen.num_gpus == 0
    engine = chosen.engine.model_copy(update={"dtype": engine_dtype(chosen.engine.dtype, on_cpu, flags)})
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *engine.to_cli_args(
        config.model.path, config.model.name), "--host", "127.0.0.1", "--port", str(port)]
    env: dict[str, str] = {}
    if engine.spin_wait_ms is not None:
        env[SPIN_MS_ENV] = str(engine.spin_wait_ms)
    if on_cpu and chosen.cpu_binding is not None:
        env.update(chosen.cpu_binding.environment(0))
    return argv, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "deploy" / "local.yaml")
    parser.add_argument("--pool", default="latency")
    parser.add_argument("--port", type=int, default=8100)
    options = parser.parse_args()
    argv, env = raw_server_command(options.config, options.pool, options.port, cpu_flags())
    print(" ".join(f"{name}={value}" for name, value in env.items()), " ".join(argv), flush=True)
    os.execve(argv[0], argv, {**os.environ, **env})


if __name__ == "__main__":
    main()
