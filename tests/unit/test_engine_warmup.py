"""The startup request runs the sampler paths vLLM compiles on first use: sampled and prompt
log-probabilities, with random sampling, under an id no replica signal counts as its own."""

import asyncio

from replicas.engine_signals import RequestTracker
from replicas.engine_warmup import WARMUP_REQUEST_ID, warm_lazy_kernels


class _Engine:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def generate(self, prompt, params, request_id):
        self.calls.append((prompt, params, request_id))
        for _ in range(2):
            yield object()


def test_the_warmup_asks_for_both_kinds_of_log_probabilities() -> None:
    engine = _Engine()
    asyncio.run(warm_lazy_kernels(engine))
    ((prompt, params, request_id),) = engine.calls
    assert params.logprobs == 1 and params.prompt_logprobs == 1 and params.temperature > 0
    assert len(prompt["prompt_token_ids"]) > 1 and params.max_tokens >= 1
    assert RequestTracker().key_of(request_id) is None and request_id == WARMUP_REQUEST_ID


def test_a_failed_warmup_does_not_stop_the_replica() -> None:
    class Refusing(_Engine):
        async def generate(self, prompt, params, request_id):
            raise ValueError("max_logprobs is 0")
            yield  # an async generator

    asyncio.run(warm_lazy_kernels(Refusing()))  # logged, not raised
