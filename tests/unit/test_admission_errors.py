"""Admission failures map to the right status, OpenAI body, Retry-After and rejection-reason header."""

import time

import pytest
import redis

from gateway.admission import admission_error
from fleet.session import QueueDeadlineExpired, QueueRejected, QueueTicketLost


@pytest.mark.parametrize(
    ("exc", "status", "code", "reason", "retry_after"),
    [
        (QueueRejected("queue_full"), 429, "queue_full", "rejected-saturated", "7"),
        (QueueRejected("queue_tokens_full"), 429, "queue_full", "rejected-saturated", "7"),
        (QueueDeadlineExpired(), 429, "queue_timeout", "rejected-ttl-expired", "7"),
        (redis.ConnectionError("down"), 503, "queue_unavailable", "queue-unavailable", "1"),
        (QueueTicketLost("t1"), 503, "queue_unavailable", "queue-unavailable", "1"),
    ],
)
def test_admission_error_mapping(exc, status, code, reason, retry_after) -> None:
    error = admission_error(exc, retry_after_s=7)
    response = error.response()
    assert response.status_code == status
    assert response.headers["retry-after"] == retry_after
    assert response.headers["x-fleetgate-rejected-reason"] == reason
    assert error.body()["error"]["code"] == code


class _Replies:
    """A replica's reply stream that answers with one header, and records whether it was cancelled."""

    def __init__(self, header: dict) -> None:
        self.header, self.cancelled = header, False

    async def __anext__(self) -> dict:
        return self.header

    def cancel(self) -> None:
        self.cancelled = True


async def test_a_replica_that_finds_no_grant_is_a_retryable_503_not_a_500() -> None:
    # found by the soak: after Redis restarted empty, a grant in flight reached its replica, which answered
    # 403 no_grant, and the gateway answered 500
    from types import SimpleNamespace

    from gateway.errors import GrantLost
    from gateway.lifecycle import RequestLifecycle
    from replicas.base import NO_GRANT

    replies = _Replies({"status": NO_GRANT, "body": {"error": {"code": "no_grant", "message": "no grant"}}})
    lifecycle = object.__new__(RequestLifecycle)
    lifecycle._pools = SimpleNamespace(call=lambda *args: replies)
    lifecycle._clock = time.monotonic
    place = SimpleNamespace(pool="latency", replica_id="r1", ticket_id="t1", prompt_tokens=3, charged=20)
    with pytest.raises(GrantLost) as caught:
        await lifecycle._forward(None, place, [False])
    response = caught.value.response()
    assert (response.status_code, response.headers["retry-after"]) == (503, "1")
    assert caught.value.body()["error"]["code"] == "grant_lost" and replies.cancelled
