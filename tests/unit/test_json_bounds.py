"""A body's shape bounds its validation work: too many JSON values is a 400 before validating, and a failed
validation of many errors is described from a copy cut short, not from every error record."""

import json

import pytest

from gateway.errors import InvalidJSON, InvalidRequest
from gateway.json_bounds import MAX_ERRORS, MAX_VALUES, cut, values_over
from gateway.request_parsing import parse_request


def test_values_are_counted_only_where_they_could_exceed_the_cap() -> None:
    body = {"a": [1, 2, [3, {"b": 4}]]}
    assert not values_over(body, raw_bytes=6, cap=3)  # too few bytes to hold more than 3 values: not walked
    assert values_over(body, raw_bytes=100, cap=3)
    assert not values_over(body, raw_bytes=100, cap=8)  # 8 values: the object, a, its list, 1, 2, [..], 3, {b}, 4


def test_a_cut_copy_keeps_the_requests_own_fields_and_the_first_items() -> None:
    body = {f"field{i}": i for i in range(40)} | {"prompt": list(range(100)),
                                                 "nested": {f"k{i}": [0] * 20 for i in range(40)}}
    short = cut(body)
    assert set(short) == set(body)  # every field of the request stays
    assert short["prompt"] == list(range(8)) and len(short["nested"]) == 32
    assert all(value == [0] * 8 for value in short["nested"].values())


def test_a_body_of_too_many_values_is_400_before_validation() -> None:
    body = json.dumps({"model": "m", "prompt": [-1] * (MAX_VALUES + 1)}).encode()
    with pytest.raises(InvalidJSON) as caught:
        parse_request(body, "completion")
    assert caught.value.status == 400 and "JSON values" in caught.value.message


def test_many_errors_are_described_from_the_first_items() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": 5}] * 2000}).encode()
    with pytest.raises(InvalidRequest) as caught:
        parse_request(body, "chat")
    assert caught.value.param == "messages.0.content"
    assert "more errors" in caught.value.message and int(caught.value.message.split("(and ")[1].split()[0]) > MAX_ERRORS
    late = json.dumps({"model": "m", "prompt": [1] * 1000 + [-1] * 1000}).encode()  # the errors lie past the cut
    with pytest.raises(InvalidRequest) as caught:
        parse_request(late, "completion")
    assert caught.value.status == 422 and "errors, past the first 8 items" in caught.value.message
