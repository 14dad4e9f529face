"""The soak's report: an error soon after a fault is that fault's; any other 5xx or broken connection is
counted as unexplained (a client's own timeout never is)."""

from __future__ import annotations

import argparse

from bench.soak import _report
from bench.soak_load import Answer, LoadLog


def test_errors_are_explained_only_by_a_fault_just_before_them() -> None:
    log = LoadLog()
    log.answers = [Answer("short", 10.0, 200), Answer("short", 95.0, 503, "queue-unavailable"),
                   Answer("stream", 100.0, 0, "RemoteProtocolError"), Answer("timeout", 300.0, 0, "client_timeout"),
                   Answer("short", 400.0, 503, "queue-unavailable"), Answer("bad", 5.0, 400, "invalid_value")]
    faults = [{"fault": "redis", "at_s": 90.0, "recovered_after_s": 3.0}]
    report = _report(log, faults, argparse.Namespace(minutes=7, explain_s=45), "balanced")
    assert report["requests"] == 6 and report["unexplained_count"] == 1
    assert report["unexplained_errors"][0]["at_s"] == 400.0
    assert report["by_status_and_reason"]["503 queue-unavailable"] == 2


def test_each_explained_error_is_put_on_the_latest_fault_before_it() -> None:
    log = LoadLog()
    log.answers = [Answer("short", 95.0, 503, "queue-unavailable"), Answer("stream", 130.0, 500)]
    faults = [{"fault": "redis", "at_s": 90.0}, {"fault": "gateway", "at_s": 120.0}]
    report = _report(log, faults, argparse.Namespace(minutes=7, explain_s=45), "balanced")
    assert report["errors_by_fault"] == {"redis": {"503 queue-unavailable": 1}, "gateway": {"500": 1}}
