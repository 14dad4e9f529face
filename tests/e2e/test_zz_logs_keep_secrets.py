"""API keys and prompts never reach the logs: the `serve run` output and every Ray / Serve / vLLM log file.

Named to run last in the e2e suite, so every other test's traffic (errors included) is in the logs too.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import TINY_MODEL_NAME
from tests.e2e.conftest import auth

pytestmark = pytest.mark.e2e

RAY_LOGS = Path("/tmp/ray/session_latest/logs")  # the deployment's cluster is the latest one started


def test_no_key_or_prompt_in_any_log(base_url: str, api_keys: dict, serve_work_dir: Path) -> None:
    marker = f"PROMPT-MARKER-{uuid.uuid4().hex}"
    forged_key = f"fg-{uuid.uuid4().hex}"
    headers = auth(api_keys["calm"])
    for body in ({"model": TINY_MODEL_NAME, "prompt": marker, "max_tokens": 2},  # served
                 {"model": TINY_MODEL_NAME, "prompt": marker, "max_tokens": "x"},  # 422
                 {"model": TINY_MODEL_NAME, "prompt": marker * 2000, "max_tokens": 2},  # over the context
                 {"model": "no-such-model", "prompt": marker}):  # 404
        httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=60)
    httpx.post(f"{base_url}/v1/chat/completions", headers=headers, timeout=60,
               json={"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": marker}], "max_tokens": 2,
                     "stream": True})
    httpx.post(f"{base_url}/v1/completions", json={"model": TINY_MODEL_NAME, "prompt": marker},
               headers=auth(forged_key), timeout=60)
    files = [serve_work_dir / "serve-run.log"] + [p for p in RAY_LOGS.rglob("*") if p.is_file()]
    assert len(files) > 5, "the logs were not found"
    secrets = [marker, forged_key, *api_keys.values()]
    for path in files:
        text = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in text, f"{secret[:12]}... found in {path}"
