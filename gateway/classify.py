"""Classify a parsed request: prompt tokens (the model's own tokenizer), length class, token cost.

Counted once, here, and passed on: the context check, the length class (placement), the cost (fairness,
rate limits) and the response header all use this one count.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fleet.config import QueueConfig
from gateway.control_tokens import ControlTokens
from gateway.errors import ContextLengthExceeded, InvalidValue
from gateway.output_bound import OutputBound
from gateway.request_parsing import ParsedRequest
from gateway.tokens import OFF_LOOP_ABOVE_CHARS, PromptTokenCounter
from policies.classification import estimate_batch_cost


@dataclass(frozen=True)
class Classification:
    """What the gateway knows of a request's size."""

    prompt_tokens: int
    length_class: str
    cost: int


class RequestClassifier:
    """Counts prompt tokens and classifies requests for one model."""

    def __init__(self, config: QueueConfig, model_path: str, max_sequences: int | None = None,
                 max_prompt_logprob_entries: int = 0, max_output_logprob_entries: int = 0,
                 engine_args: list[str] | None = None, refuse_control_tokens: bool = False) -> None:
        self._counter = PromptTokenCounter(model_path, engine_args)
        self._control_tokens = ControlTokens(self._counter.tokenizer) if refuse_control_tokens else None
        self._max_sequences = max_sequences
        self._max_prompt_logprob_entries = max_prompt_logprob_entries
        self._max_output_logprob_entries = max_output_logprob_entries
        self._lengths = config.length_class_policy()
        self._default_output_tokens = config.default_output_tokens
        self._output = OutputBound(model_path, self._counter.tokenizer, config.default_output_tokens)

    async def classify(self, parsed: ParsedRequest, max_model_len: int) -> Classification:
        """Count and classify ``parsed``; a prompt that cannot fit the context is a 400.

        A batch of prompts (a completions request's list) is checked against the context prompt by prompt,
        classed by its longest prompt, and costs every prompt; ``n`` (or the beam width) multiplies the
        output each prompt may produce. A request of more engine sequences (prompts times ``n``) than
        ``max_sequences`` is a 400, before any tokenizing, as is a chat that spells out a control token where
        they are refused (gateway/control_tokens.py). A prompt is counted as the engine will run it: after
        ``truncate_prompt_tokens``."""
        self._check_sequences(parsed)
        keep = _kept_tokens(parsed.truncate_prompt_tokens, max_model_len)
        within = keep if keep is not None else max_model_len or None
        if parsed.body_chars > OFF_LOOP_ABOVE_CHARS:  # one trip off the event loop for both
            prompts = await asyncio.to_thread(self._check_and_count, parsed, within)
        else:
            prompts = self._check_and_count(parsed, within)
        if keep is not None:
            prompts = [min(tokens, keep) for tokens in prompts]
        longest = max(prompts)
        if max_model_len and longest + (parsed.max_tokens or 1) > max_model_len:
            counted = ("the prompt alone is longer than that" if longest > max_model_len else
                       f"the prompt has {longest} tokens and {parsed.max_tokens or 1} more were requested")
            raise ContextLengthExceeded(f"This model's maximum context length is {max_model_len} tokens; {counted}.",
                                        param="messages" if parsed.endpoint == "chat" else "prompt")
        self._check_prompt_logprobs(parsed, sum(prompts))
        output = self._output.expected(parsed.body, parsed.max_tokens)  # what the request may force
        self._check_output_logprobs(parsed, min(output, max_model_len - longest) if max_model_len else output)
        cost = estimate_batch_cost(prompts, output, self._default_output_tokens,
                                   max_model_len or longest + self._default_output_tokens, parsed.sequences)
        return Classification(sum(prompts), self._lengths.classify(longest), cost)

    def _check_and_count(self, parsed: ParsedRequest, within: int | None) -> list[int]:
        if self._control_tokens is not None and parsed.endpoint == "chat":
            self._control_tokens.check_now(parsed.body)
        return self._counter.count(parsed, within)

    def _check_prompt_logprobs(self, parsed: ParsedRequest, prompt_tokens: int) -> None:
        # the engine computes log-probabilities over the vocabulary at every prompt position, and the replica
        # turns each entry into text at once, while its other streams wait
        limit, asked = self._max_prompt_logprob_entries, parsed.prompt_logprobs
        if not limit or asked is None:
            return
        per_token = self._entries_per_token(asked)  # the prompt's own token, too
        if prompt_tokens * per_token > limit:
            param = "prompt_logprobs" if parsed.body.get("prompt_logprobs") is not None else "echo"
            raise InvalidValue(
                f"This request asks for {prompt_tokens * per_token} prompt log-probabilities ({prompt_tokens} prompt "
                f"tokens x {per_token}); this gateway returns at most {limit} (gateway.max_prompt_logprob_entries). "
                "Send a shorter prompt or fewer prompt_logprobs.", param=param)

    def _check_output_logprobs(self, parsed: ParsedRequest, output_tokens: int) -> None:
        # a reply that is not streamed is built whole at its end, every entry turned into text and sent across
        # Ray at once, while the replica's other streams wait; a stream spreads the same work over its chunks
        limit, asked = self._max_output_logprob_entries, parsed.output_logprobs
        if not limit or asked is None or parsed.stream:
            return
        per_token = self._entries_per_token(asked)  # the sampled token, too
        entries = output_tokens * per_token * parsed.engine_requests
        if entries > limit:
            sequences = f" x {parsed.engine_requests} sequences" if parsed.engine_requests > 1 else ""
            param = "top_logprobs" if parsed.body.get("top_logprobs") else "logprobs"
            raise InvalidValue(
                f"This reply may carry {entries} log-probabilities ({output_tokens} output tokens x {per_token}"
                f"{sequences}); this gateway returns at most {limit} in a reply that is not streamed "
                "(gateway.max_output_logprob_entries). Stream it, or ask for fewer tokens (max_tokens) or fewer "
                "log-probabilities.", param=param)

    def _entries_per_token(self, top: int) -> int:
        """Entries vLLM returns per token for ``top`` log-probabilities (-1: the vocabulary), the token's own too."""
        return (len(self._counter.tokenizer) if top == -1 else top) + 1

    def _check_sequences(self, parsed: ParsedRequest) -> None:
        # the queue grants a request one sequence slot of one replica: a request of many sequences would fill
        # that replica's engine past what its grant reserved, ahead of the work the queue holds back
        sequences = parsed.engine_requests
        if self._max_sequences is not None and sequences > self._max_sequences:
            batch = sequences // parsed.sequences
            raise InvalidValue(
                f"This request asks for {sequences} sequences ({batch} prompt(s) x n={parsed.sequences}); this "
                f"gateway runs at most {self._max_sequences} per request. Send fewer prompts or a smaller n.",
                param="n" if parsed.sequences > 1 else "prompt",
            )


def _kept_tokens(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """How many tokens of each prompt vLLM keeps under ``truncate_prompt_tokens`` (None: no truncation); -1
    keeps what the context holds with one token left to generate. A cut over the context is a 400, as in vLLM."""
    if truncate_prompt_tokens is None or (truncate_prompt_tokens == -1 and not max_model_len):
        return None
    if truncate_prompt_tokens == -1:
        return max_model_len - 1
    if max_model_len and truncate_prompt_tokens > max_model_len:
        raise InvalidValue(f"truncate_prompt_tokens={truncate_prompt_tokens} cannot be greater than the model's "
                           f"context length, {max_model_len} tokens.", param="truncate_prompt_tokens")
    return truncate_prompt_tokens
