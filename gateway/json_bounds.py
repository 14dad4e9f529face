"""Bounds on how much work a request body's shape can cost before it is refused.

Validating a body against vLLM's models costs a few microseconds per JSON value, and each value that fails
costs pydantic an error record of about fifteen more (one per union member it tried: a message's content
fails ~20 times). An 8 MiB body of millions of bad values would hold a gateway thread, and the GIL, for a
minute. So a body may hold at most :data:`MAX_VALUES` values (a prompt of 128k token ids, or a logit bias
over a whole vocabulary, fit), and a failed validation with more errors than :data:`MAX_ERRORS` is described
from a copy cut to the first few items of every list, not from hundreds of thousands of error records.
"""

from __future__ import annotations

from typing import Any

MAX_VALUES = 300_000
MAX_ERRORS = 256
KEPT_ITEMS = 8  # items of each list in the copy that describes a failure
KEPT_KEYS = 32  # keys of each object below the request's own fields, in that copy


def values_over(body: Any, raw_bytes: int, cap: int = MAX_VALUES) -> bool:
    """True when ``body`` holds more than ``cap`` JSON values. A body of under two bytes a value cannot, so
    small bodies are not walked."""
    if raw_bytes <= 2 * cap:
        return False
    count, stack = 0, [body]
    while stack:
        node = stack.pop()
        count += 1
        if count > cap:
            return True
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def cut(body: Any, items: int = KEPT_ITEMS, keys: int = KEPT_KEYS, top: bool = True) -> Any:
    """A copy of ``body`` with every list cut to its first ``items`` items and every object below the top
    level to its first ``keys`` keys (the request's own fields all stay): small enough to validate again."""
    if isinstance(body, list):
        return [cut(item, items, keys, False) for item in body[:items]]
    if isinstance(body, dict):
        kept = list(body.items()) if top else list(body.items())[:keys]
        return {key: cut(value, items, keys, False) for key, value in kept}
    return body
