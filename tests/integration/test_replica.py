"""The vLLM replica deployment under real Ray Serve with a real vLLM CPU engine.

One replica, driven through its DeploymentHandle: vLLM's serving path, its error mapping, priority
scheduling, and the abort of an engine request when the caller goes away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicas.cpu_binding import CpuBinding
from replicas.engine_settings import EngineSettings
from replicas.spec import ReplicaSpec
from tests.conftest import REPO_ROOT, TINY_MODEL_NAME

pytestmark = pytest.mark.integration

ENGINE = EngineSettings(
    max_num_batched_tokens=128,
    max_num_seqs=8,
    max_model_len=4096,
    scheduling_policy="priority",
    enforce_eager=True,
    kv_cache_memory_bytes=256 << 20,
)


@pytest.fixture(scope="module")
def replica(tiny_model_path: Path) -> Iterator[object]:
    import ray
    from ray import serve

    from replicas.deployment import VLLMReplica

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    deployment = serve.deployment(VLLMReplica).options(name="vllm-it", ray_actor_options={"num_cpus": 0.5})
    app = deployment.bind(ReplicaSpec(
        model_path=str(tiny_model_path), served_model_name=TINY_MODEL_NAME, engine=ENGINE.model_dump(),
        cpu_binding=CpuBinding(cores_per_replica=1), cache_dir=str(REPO_ROOT / ".cache" / "runtime"),
    ))
    handle = serve.run(app, name="replica-it", route_prefix=None)
    yield handle
    serve.shutdown()
    ray.shutdown()


async def _collect(replica, endpoint: str, body: dict) -> list:
    return [item async for item in replica.options(stream=True).generate.remote(endpoint, body)]


async def test_completion_with_priority(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "The gateway", "max_tokens": 5, "ignore_eos": True,
            "priority": 7}  # vLLM rejects a non-zero priority unless priority scheduling is on
    (header,) = await _collect(replica, "completion", body)
    assert header["status"] == 200 and not header["stream"]
    assert header["body"]["usage"]["completion_tokens"] == 5


async def test_chat_stream_yields_sse_lines_then_done(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "ignore_eos": True, "stream": True}
    header, *lines = await _collect(replica, "chat", body)
    assert header == {"status": 200, "body": None, "stream": True}
    assert all(line.startswith("data: ") and line.endswith("\n\n") for line in lines)
    assert lines[-1] == "data: [DONE]\n\n"
    assert len(lines) >= 4


async def test_prompt_over_context_is_a_400_from_vllm(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "hello world " * 3000, "max_tokens": 4}
    (header,) = await _collect(replica, "completion", body)
    assert header["status"] == 400
    assert "maximum context length" in header["body"]["error"]["message"]


async def test_cancelled_caller_aborts_the_engine_request(replica) -> None:
    body = {"model": TINY_MODEL_NAME, "prompt": "x", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    replies = replica.options(stream=True).generate.remote("completion", body)
    header = await replies.__anext__()
    assert header["stream"]
    for _ in range(3):
        await replies.__anext__()
    assert await replica.unfinished_requests.remote() == 1
    cancelled_at = time.monotonic()
    replies.cancel()
    # 4000 tokens would take this engine well over 10 s; an abort frees the engine at once.
    while await replica.unfinished_requests.remote() != 0:
        assert time.monotonic() - cancelled_at < 5.0, "the engine request was not aborted"
        await asyncio.sleep(0.05)
