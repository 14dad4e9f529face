"""Request classification: length class and cost estimate from the counted prompt tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LengthClasses:
    """Prompt-length thresholds: a prompt of more than ``long_above`` tokens is 'long', else 'short'."""

    long_above: int = 512

    def classify(self, prompt_tokens: int) -> str:
        """The length class of a prompt of ``prompt_tokens`` tokens."""
        return "long" if prompt_tokens > self.long_above else "short"


def estimate_cost(prompt_tokens: int, max_tokens: int | None, default_output_tokens: int, max_model_len: int) -> int:
    """Tokens a request is expected to cost: its prompt plus the output it may produce.

    ``max_tokens`` bounds the output when the client sets it; otherwise a configured typical output length,
    never beyond what the context leaves.
    """
    room = max(max_model_len - prompt_tokens, 1)
    output = max_tokens if max_tokens is not None else default_output_tokens
    return prompt_tokens + max(1, min(output, room))
