"""The body parser's cheap count (gateway/body_parser.py) is never below the JSON values a body holds: a
body it calls sparse really is, so no dense body is parsed beside the gateway's event loop."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from gateway.body_parser import values_bound

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=60,
)


def _values(node: object) -> int:
    if isinstance(node, dict):
        return 1 + sum(_values(value) for value in node.values())
    if isinstance(node, list):
        return 1 + sum(_values(item) for item in node)
    return 1


@given(json_values, st.booleans())
def test_the_bound_is_never_below_the_values_held(body: object, compact: bool) -> None:
    raw = json.dumps(body, separators=(",", ":") if compact else None, ensure_ascii=False).encode()
    assert values_bound(raw) >= _values(body)


def test_a_long_prose_prompt_is_not_dense() -> None:
    assert values_bound(json.dumps({"model": "m", "prompt": "word " * 100_000}).encode()) < 10


def test_counting_stops_past_the_limit_but_not_below_it() -> None:
    raw = json.dumps([[1, 2]] * 200_000).encode()  # 1.4 MB, 600,001 values
    assert values_bound(raw) >= 600_001
    assert 4_096 < values_bound(raw, stop_above=4_096) < 40_000  # stopped within its first 64 KiB step
    assert values_bound(raw, stop_above=10_000_000) == values_bound(raw)
