"""Runs a real vLLM engine (in process, the tiny model on the CPU) with the step-budget scheduler and
prints, as JSON, the tokens each step scheduled while it served a long prompt alone, then the same long
prompt beside a short one: ``python -m tests.support.step_budget_engine MODEL_PATH``.

A process of its own, so that vLLM's in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which makes
its scheduler reachable) leaves the test process untouched.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

SHORT_LIMIT = 256  # the pool's own work: prompts of at most this many tokens
LONG_PROMPT = 1500
SHORT_PROMPT = 40
OUTPUT_TOKENS = 6


def _engine(model_path: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.llm_engine import LLMEngine

    from replicas.engine_settings import EngineSettings
    from replicas.step_budget import use_step_budget

    settings = EngineSettings(max_num_batched_tokens=128, long_prefill_token_threshold=64, guarded_step_tokens=1024,
                              max_num_seqs=8, max_model_len=4096, enforce_eager=True, dtype="float32",
                              kv_cache_memory_bytes=256 << 20)
    budget = settings.step_budget(SHORT_LIMIT)
    assert budget is not None
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(settings.to_cli_args(model_path, "tiny", budget))
    vllm_config = EngineArgs.from_cli_args(args).create_engine_config()
    use_step_budget(vllm_config, budget)
    return LLMEngine.from_vllm_config(vllm_config)


def _run(engine: Any, prompts: dict[str, int]) -> list[dict[str, Any]]:
    """Serve ``prompts`` (id -> prompt tokens) to the end; each step's budget and scheduled tokens."""
    from vllm import SamplingParams

    scheduler = engine.engine_core.engine_core.scheduler
    steps: list[dict[str, Any]] = []
    schedule = scheduler.schedule

    def recording(*args: Any, **kwargs: Any) -> Any:
        output = schedule(*args, **kwargs)
        steps.append({"budget": scheduler.last_step[0], "tokens": output.total_num_scheduled_tokens})
        return output

    scheduler.schedule = recording
    for index, (request_id, tokens) in enumerate(prompts.items()):  # distinct tokens: no prefix cache hits
        engine.add_request(request_id, {"prompt_token_ids": [7 + (i * (index + 3)) % 97 for i in range(tokens)]},
                           SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    scheduler.schedule = schedule
    return [s for s in steps if s["tokens"]]


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    engine = _engine(sys.argv[1])
    print(json.dumps({"alone": _run(engine, {"long-1": LONG_PROMPT}),
                      "beside_short": _run(engine, {"short": SHORT_PROMPT, "long-2": LONG_PROMPT})}))


if __name__ == "__main__":
    main()
