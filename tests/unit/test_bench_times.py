"""The bench's job timeline: how long Spark jobs ran, overlapping jobs counted once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cdc_tools.bench import _interval, _millis, _union_ms

T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


def span(start_ms: int, end_ms: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(milliseconds=start_ms), T0 + timedelta(milliseconds=end_ms)


def test_disjoint_jobs_add_up() -> None:
    assert _union_ms([span(0, 100), span(200, 250)]) == 150


def test_overlapping_and_nested_jobs_count_once() -> None:
    # 0-100 and 50-180 overlap (180 ms), 60-70 is inside both, 300-310 is apart.
    assert _union_ms([span(50, 180), span(0, 100), span(60, 70), span(300, 310)]) == 190


def test_a_job_still_running_is_left_out() -> None:
    assert _union_ms([span(0, 40), None]) == 40
    assert _union_ms([]) == 0


def test_rest_api_times() -> None:
    job = {
        "submissionTime": "2026-11-26T09:00:00.250GMT",
        "completionTime": "2026-11-26T09:00:01.000GMT",
    }
    assert _interval(job) == span(250, 1000)
    assert _millis(job) == 750
    assert _millis({"submissionTime": "2026-11-26T09:00:00.250GMT"}) == 0
