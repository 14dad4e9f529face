"""Engine settings of one vLLM replica pool, validated, and turned into vLLM's own CLI arguments."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.step_budget import StepBudget, step_budget


# vLLM flags that change how a chat is rendered (and so counted), how its reply is parsed, or which media
# URLs it takes
CHAT_FLAGS = frozenset({
    "--chat-template", "--chat-template-content-format", "--default-chat-template-kwargs",
    "--exclude-tools-when-tool-choice-none", "--enable-auto-tool-choice", "--tool-call-parser",
    "--tool-parser-plugin", "--reasoning-parser", "--tokenizer", "--tokenizer-mode", "--tokenizer-revision",
    "--trust-remote-code", "--hf-overrides", "--allowed-media-domains",
})


def flag_groups(args: list[str]) -> list[tuple[str, list[str]]]:
    """vLLM CLI arguments grouped by flag: each flag's name (without its ``=value``) and its tokens as written,
    the flag and every value up to the next flag (some flags take a list)."""
    groups: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append((arg.partition("=")[0], [arg]))
        else:
            groups[-1][1].append(arg)
    return groups


class EngineSettings(BaseModel):
    """vLLM engine settings that matter for tail latency, with production-minded defaults.

    The chunked-prefill budget (``max_num_batched_tokens``) bounds the work of one engine step, so a long
    prompt is prefilled in chunks beside running decodes instead of stalling them.
    """

    model_config = ConfigDict(extra="forbid")

    max_num_batched_tokens: int = Field(
        512, ge=1, description="Chunked-prefill token budget per engine step (prefill + decode tokens)."
    )
    max_num_seqs: int = Field(32, ge=1, description="Most sequences in one running batch.")
    max_model_len: int | None = Field(
        None, ge=16, description="Context length served; None takes the model's own."
    )
    long_prefill_token_threshold: int = Field(
        0, ge=0, description="Most prompt tokens one request may prefill per step (0: vLLM's default)."
    )
    max_num_partial_prefills: int | None = Field(
        None,
        ge=1,
        description="Concurrent partial prefills; passed only when set, since vLLM 0.32 has no such option.",
    )
    guarded_step_tokens: int | None = Field(
        None, ge=1, description="With the global queue, the step budget while the engine holds only guarded work "
        "(long prompts on a latency replica, which takes them only while it holds no short work): e.g. the "
        "throughput pool's, so it prefills them as fast. The engine is started and sized for it; the step falls "
        "back to max_num_batched_tokens as soon as a request of the pool's own classes is in the engine. None: "
        "max_num_batched_tokens always.",
    )
    guarded_prefill_chunk: int = Field(
        0, ge=0, description="long_prefill_token_threshold while the engine holds only guarded work (0: none).",
    )
    scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority", description="vLLM scheduler policy; 'priority' honours each request's integer priority."
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache across shared prompt prefixes.")
    enforce_eager: bool = Field(
        False, description="Skip graph compilation: faster start-up, slower steps (good for CPU dev loops)."
    )
    dtype: str = Field("auto", description="Weights and activation dtype passed to vLLM.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per replica (tensor parallelism).")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="GPU only: fraction of device memory vLLM may take."
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="Explicit KV cache size in bytes (CPU and GPU); overrides memory sizing."
    )
    spin_wait_ms: float | None = Field(
        None, ge=0, description="How long the engine's processes spin for each other's next message between steps "
        "before they sleep between checks (replicas/engine_wait.py). vLLM spins for a second after every "
        "message, which under load keeps a core busy per engine; on a host of few cores (CPU replicas) that "
        "starves the proxy and gateways. None: vLLM's own wait.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Further vLLM CLI arguments, passed through verbatim."
    )

    def chat_args(self) -> list[str]:
        """The arguments of ``extra_args`` that change how vLLM renders a chat or parses its reply (template,
        content format, template options, tokenizer, tool calling, media hosts), each with its values."""
        chosen: list[str] = []
        for flag, tokens in flag_groups(self.extra_args):
            if flag in CHAT_FLAGS:
                _, equals, inline = tokens[0].partition("=")
                chosen += [flag, *([inline] if equals else []), *tokens[1:]]
        return chosen

    @model_validator(mode="after")
    def _budget_fits_batch(self) -> "EngineSettings":
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (a vLLM requirement)")
        if self.guarded_step_tokens is not None and self.guarded_step_tokens < self.max_num_batched_tokens:
            raise ValueError("guarded_step_tokens must be >= max_num_batched_tokens (it is the larger step)")
        return self

    def step_budget(self, own_max_prompt_tokens: int | None) -> StepBudget | None:
        """The engine's two steps, when it guards classes (``own_max_prompt_tokens``: the longest prompt of
        the pool's own classes; None: it guards none) and has a guarded step; else None (one step)."""
        return step_budget(self.max_num_batched_tokens, self.long_prefill_token_threshold, self.guarded_step_tokens,
                           self.guarded_prefill_chunk, own_max_prompt_tokens)

    def to_cli_args(self, model_path: str, served_model_name: str, budget: StepBudget | None = None) -> list[str]:
        """vLLM CLI arguments equivalent to these settings, for vLLM's own argument parser; with a ``budget``
        the engine is started for its larger step (the scheduler picks the step: replicas/step_budget.py)."""
        step = self.max_num_batched_tokens if budget is None else budget.guarded_step_tokens
        args = [
            "--model", model_path,
            "--served-model-name", served_model_name,
            "--max-num-batched-tokens", str(step),
            "--max-num-seqs", str(self.max_num_seqs),
            "--scheduling-policy", self.scheduling_policy,
            "--dtype", self.dtype,
            "--tensor-parallel-size", str(self.tensor_parallel_size),
            "--enable-chunked-prefill",
            "--enable-prefix-caching" if self.enable_prefix_caching else "--no-enable-prefix-caching",
        ]  # fmt: skip
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.max_num_partial_prefills is not None:
            args += ["--max-num-partial-prefills", str(self.max_num_partial_prefills)]
        if self.long_prefill_token_threshold:
            args += ["--long-prefill-token-threshold", str(self.long_prefill_token_threshold)]
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.kv_cache_memory_bytes is not None:
            args += ["--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes)]
        return args + list(self.extra_args)
