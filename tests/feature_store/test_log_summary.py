"""Per-request warnings become one line per interval, with counts."""

from __future__ import annotations

import logging
import time

import pytest

from feature_store.runtime.log_summary import LogSummary


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.summary"]


def wait_for_lines(caplog: pytest.LogCaptureFixture, count: int) -> list[str]:
    deadline = time.monotonic() + 30
    while len(lines(caplog)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return lines(caplog)


def test_the_first_occurrence_is_logged_and_repeats_are_summarised_with_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.summary")
    summary = LogSummary(logging.getLogger("test.summary"), every_s=0.2)
    for n in range(1000):
        summary.record("recommend degraded", f"Redis down ({n})")
    summary.record("POST /v1/events answered 503", "broker down")
    logged = lines(caplog)
    assert len(logged) == 2  # one line per kind, not 1,001
    assert logged[0].startswith("recommend degraded: Redis down (0)")
    got = wait_for_lines(caplog, 3)  # the 999 repeats, in one line when the interval ends
    assert "recommend degraded: 999 more times" in got[2] and "Redis down (999)" in got[2]
    summary.record("recommend degraded", "Redis down (again)")  # a new interval: counted
    summary.close()  # writes what is pending
    final = lines(caplog)
    assert len(final) == 4 and "1 more times" in final[3]
