"""An outage of Redis is logged once, summarised while it lasts, and its end is logged: not one line per call."""

from __future__ import annotations

import logging

from redis.exceptions import ConnectionError as RedisConnectionError

from fleet.outage_log import OutageLog

LOGGER = logging.getLogger("test.outage")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER.name]


def test_an_outage_is_one_line_then_a_summary_per_interval_then_its_end(caplog) -> None:
    clock = _Clock()
    log = OutageLog(LOGGER, "the heartbeat", every_s=30, clock=clock)
    refused = RedisConnectionError("Error 111 connecting to 127.0.0.1:6399. Connection refused.")
    with caplog.at_level(logging.WARNING, LOGGER.name):
        log.succeeded()  # nothing was down: nothing to say
        for _ in range(40):  # 10 s of failures, four a second
            log.failed(refused)
            clock.now += 0.25
        assert log.down
        assert len(_lines(caplog)) == 1
        assert "the heartbeat failed (ConnectionError: Error 111 connecting to 127.0.0.1:6399" in _lines(caplog)[0]
        for _ in range(120):  # 30 s more: the summary comes 30 s after the first line
            log.failed(TimeoutError())
            clock.now += 0.25
        assert len(_lines(caplog)) == 2
        assert _lines(caplog)[1] == "the heartbeat still failing: 120 more failures in 30 s (last: TimeoutError)"
        log.succeeded()
        log.succeeded()
    lines = _lines(caplog)
    assert len(lines) == 3 and not log.down
    assert lines[2] == "the heartbeat works again after 40.0 s (160 failed calls)"


def test_a_second_outage_is_reported_afresh(caplog) -> None:
    clock = _Clock()
    log = OutageLog(LOGGER, "the inbox", every_s=30, clock=clock)
    with caplog.at_level(logging.WARNING, LOGGER.name):
        log.failed(RedisConnectionError())
        clock.now += 1
        log.succeeded()
        clock.now += 60
        log.failed(RedisConnectionError())
        log.failed(RedisConnectionError())
        clock.now += 2
        log.succeeded()
    lines = _lines(caplog)
    assert [line.split(" (")[0].split(" after")[0] for line in lines] == [
        "the inbox failed", "the inbox works again", "the inbox failed", "the inbox works again"]
    assert lines[3] == "the inbox works again after 2.0 s (2 failed calls)"
