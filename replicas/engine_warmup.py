"""What vLLM compiles on first use, compiled at startup, before the replica joins the fleet.

vLLM's sampler compiles some kernels the first time a request needs them (``torch.compile``: the rank of each
log-probability, vllm/v1/sample/ops/logprobs.py). On a CPU that is a C++ build inside an engine step, so the
first tenant to ask for log-probabilities stalled every stream of that engine while it built: in a fresh
checkout a 120-token prompt with ``prompt_logprobs: 1`` took 14.7 s instead of 2.6 s. One small request that
uses those paths runs here instead; a later start finds the kernels in the cache directory.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

WARMUP_REQUEST_ID = "fleetgate-warmup"  # not a replica key (replicas/engine_signals.py): no signal counts it


async def warm_lazy_kernels(engine: Any) -> None:
    """Run one 3-token prompt for 2 tokens with sampled and prompt log-probabilities on ``engine`` (vLLM's
    AsyncLLM). A failure is logged, not raised: the replica serves anyway, and compiles on first use."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=2, temperature=1.0, logprobs=1, prompt_logprobs=1)
    try:
        async for _ in engine.generate({"prompt_token_ids": [1, 2, 3]}, params, WARMUP_REQUEST_ID):
            pass
    except Exception as exc:  # e.g. an engine configured to return no log-probabilities
        logger.warning("engine warm-up failed (%s): the first request with log-probabilities compiles them",
                       type(exc).__name__)
