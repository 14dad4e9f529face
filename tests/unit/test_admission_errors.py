"""Admission failures map to the right status, OpenAI body, Retry-After and rejection-reason header."""

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
