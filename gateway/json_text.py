"""The strings inside a JSON value, and those that no UTF-8 encoder takes.

:func:`strings` walks a parsed body's strings (the control-token check, the media-URL check). Strings no
encoder takes: JSON lets ``\\ud800`` stand alone, Python decodes it, and every
later step (the tokenizer, the engine's stop strings, the error message that quotes the field, a log line)
then fails on it. Such a body is refused where it is parsed, with the field that holds it.

Only an escape can spell a surrogate (raw surrogate bytes are not UTF-8 and fail in ``json.loads``), so a
body without one is never walked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def strings(value: Any, keys: bool = True) -> Iterator[str]:
    """Every string inside a JSON value, object keys too unless ``keys`` is False."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            if keys:
                stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def lone_surrogate_path(body: Any, raw_body: bytes) -> str | None:
    """The dotted path of the first string (or object key) of ``body`` holding a lone UTF-16 surrogate, ``""``
    for the top level; None when there is none."""
    if not _SURROGATE_ESCAPE.search(raw_body):
        return None
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if not _encodes(node):
                return path
        elif isinstance(node, dict):
            for key, value in node.items():
                child = f"{path}.{key}" if path else str(key)
                if not _encodes(key):
                    return path
                stack.append((child, value))
        elif isinstance(node, list):
            stack.extend((f"{path}.{index}" if path else str(index), item) for index, item in enumerate(node))
    return None


def _encodes(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
