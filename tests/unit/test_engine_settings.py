"""Engine settings: validation, and that vLLM's own argument parser accepts what they produce."""

import pytest
from pydantic import ValidationError

from replicas.engine_settings import EngineSettings


def _parse_with_vllm(cli_args: list[str]):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args(cli_args)


def test_vllm_parser_accepts_every_setting() -> None:
    settings = EngineSettings(
        max_num_batched_tokens=256,
        max_num_seqs=16,
        max_model_len=2048,
        long_prefill_token_threshold=128,
        scheduling_policy="priority",
        enable_prefix_caching=False,
        enforce_eager=True,
        kv_cache_memory_bytes=1 << 30,
    )
    args = _parse_with_vllm(settings.to_cli_args("/models/m", "served-name"))
    assert args.model == "/models/m"
    assert args.served_model_name == ["served-name"]
    assert args.max_num_batched_tokens == 256
    assert args.max_num_seqs == 16
    assert args.max_model_len == 2048
    assert args.long_prefill_token_threshold == 128
    assert args.scheduling_policy == "priority"
    assert args.enable_chunked_prefill is True
    assert args.enable_prefix_caching is False
    assert args.enforce_eager is True
    assert args.kv_cache_memory_bytes == 1 << 30


def test_defaults_leave_optional_flags_out() -> None:
    cli = EngineSettings().to_cli_args("/m", "n")
    for flag in ("--max-model-len", "--long-prefill-token-threshold", "--enforce-eager",
                 "--max-num-partial-prefills", "--gpu-memory-utilization"):
        assert flag not in cli
    assert _parse_with_vllm(cli).scheduling_policy == "priority"


def test_budget_smaller_than_batch_is_rejected() -> None:
    with pytest.raises(ValidationError, match="max_num_batched_tokens must be >= max_num_seqs"):
        EngineSettings(max_num_batched_tokens=8, max_num_seqs=16)


def test_unknown_setting_is_rejected() -> None:
    with pytest.raises(ValidationError, match="extra"):
        EngineSettings.model_validate({"max_num_batched_token": 64})

