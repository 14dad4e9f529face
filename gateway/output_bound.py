"""How much output a request's cost estimate expects: what keeps a tenant from looking cheap at its grant.

A request that sets ``max_tokens`` is bounded by it. One that does not usually stops at the model's end of
sequence, so the queue expects ``queue.default_output_tokens`` of it. But a request can take the end of
sequence away (``ignore_eos``; a negative ``logit_bias`` on an end token; ``allowed_token_ids`` or
``bad_words`` that exclude every end token) and then runs to the end of the context; or it can force a
length with ``min_tokens``. Estimated at the default, such a request would be charged as cheap at its grant
(fairness, the token rate limit) and win grants ahead of honest tenants until it completes and its charge is
corrected. So it is estimated at what it forces: the context's end, or ``min_tokens``.
"""

from __future__ import annotations

from typing import Any

UNBOUNDED = 1 << 62  # "to the end of the context": the estimate clamps it to the room the prompt leaves


class OutputBound:
    """The output a request of one model is expected to produce, given that model's end tokens."""

    def __init__(self, model_path: str, tokenizer: Any, default_output_tokens: int) -> None:
        self._default = default_output_tokens
        self._end_ids = end_token_ids(model_path, tokenizer)
        self._end_texts = frozenset(tokenizer.convert_ids_to_tokens(sorted(self._end_ids)))

    def expected(self, body: dict[str, Any], max_tokens: int | None) -> int:
        """Output tokens to estimate for a request of ``body`` (``max_tokens`` as parsed)."""
        if max_tokens is not None:
            return max_tokens
        if self._end_taken_away(body):
            return UNBOUNDED
        return max(self._default, _int(body.get("min_tokens")))

    def _end_taken_away(self, body: dict[str, Any]) -> bool:
        if body.get("ignore_eos"):
            return True
        bias = body.get("logit_bias") or {}
        if any(_int(token, -1) in self._end_ids and _float(value) < 0 for token, value in bias.items()):
            return True
        allowed = body.get("allowed_token_ids")
        if allowed and not self._end_ids.intersection(_int(token, -1) for token in allowed):
            return True
        return any(word in self._end_texts for word in body.get("bad_words") or [])


def end_token_ids(model_path: str, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a sequence, as vLLM reads them: the generation config's ``eos_token_id`` (one or a
    list) and the tokenizer's own."""
    ids: set[int] = set()
    try:
        from transformers import GenerationConfig

        configured = GenerationConfig.from_pretrained(model_path).eos_token_id
        ids.update(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    except (OSError, ValueError):  # no generation config in the model folder
        pass
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(int(token) for token in ids)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0
