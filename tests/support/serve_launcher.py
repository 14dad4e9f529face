"""Bring up a `serve run` deployment on a free port, as a user would run it (the e2e tests and `python -m bench live`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from gateway.http_guard import GUARD_ENV
from tests.support.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]

START_TIMEOUT_S = 420


@contextmanager
def serve_run(config_file: Path, work_dir: Path, env: dict[str, str] | None = None,
              edit: Callable[[dict], None] | None = None,
              ready: Callable[[], bool] | None = None,
              ready_headers: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``serve run`` on a copy of ``config_file`` listening on a free port; yield its base URL.

    Ready means the gateway answered /v1/models (a vLLM replica is up behind it) and ``ready()`` holds
    (e.g. every replica has registered its capacity).
    """
    document = yaml.safe_load(config_file.read_text())
    port = free_port()
    document["http_options"]["port"] = port
    if edit is not None:
        edit(document["applications"][0]["args"])
    test_config = work_dir / config_file.name
    test_config.write_text(yaml.safe_dump(document))
    log_path = work_dir / "serve-run.log"
    env = {**os.environ, "RAY_ADDRESS": "local", "RAY_AUTH_MODE": "disabled", **GUARD_ENV, **(env or {})}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            ["serve", "run", str(test_config)], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_ready(process, base_url, log_path, ready, ready_headers or {})
        yield base_url
    finally:
        _stop(process)


def _wait_until_ready(process: subprocess.Popen, base_url: str, log_path: Path,
                      ready: Callable[[], bool] | None, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"serve run exited with {process.returncode}:\n{_tail(log_path)}")
            try:
                if client.get(f"{base_url}/v1/models", headers=headers).status_code == 200 and (ready is None or ready()):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
    raise TimeoutError(f"deployment not ready after {START_TIMEOUT_S}s:\n{_tail(log_path)}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def serve_deploy(config_file: Path, work_dir: Path, edit: Callable[[dict], None]) -> None:
    """Update the running ``serve_run`` deployment the way an operator would: ``edit`` the config it was
    started from (``work_dir``'s copy of ``config_file``, the whole document) and ``serve deploy`` it to the
    cluster's dashboard."""
    deployed = work_dir / config_file.name
    document = yaml.safe_load(deployed.read_text())
    edit(document)
    deployed.write_text(yaml.safe_dump(document))
    log = (work_dir / "serve-run.log").read_text(errors="replace")
    found = re.search(r"dashboard at \S*?(http://[0-9.:]+)", re.sub(r"\x1b\[[0-9;]*m", "", log))
    address = found.group(1) if found else "http://127.0.0.1:8265"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    subprocess.run(["serve", "deploy", str(deployed), "--address", address], cwd=REPO_ROOT, env=env,
                   check=True, capture_output=True, timeout=120)


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
