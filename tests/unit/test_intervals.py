"""Interval planning: which hour folders a run reads."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cdc_pipeline.errors import UsageError
from cdc_pipeline.intervals import Interval, parse_timestamp


def test_parse_forms() -> None:
    assert parse_timestamp("2024-01-01") == datetime(2024, 1, 1, tzinfo=UTC)
    assert parse_timestamp("2024-01-01T05:00:00Z") == datetime(2024, 1, 1, 5, tzinfo=UTC)
    assert parse_timestamp("2024-01-01T07:30:00+02:00") == datetime(2024, 1, 1, 5, 30, tzinfo=UTC)
    assert parse_timestamp("2024-01-01T05:00:00") == datetime(2024, 1, 1, 5, tzinfo=UTC)


def test_bad_timestamp_message() -> None:
    with pytest.raises(UsageError, match=r"'yesterday' is not an ISO 8601 timestamp"):
        parse_timestamp("yesterday")


def test_hours_whose_start_is_inside_the_interval() -> None:
    interval = Interval.parse("2024-01-01T22:00:00Z", "2024-01-02T01:00:00Z")
    assert [h.folder for h in interval.hours()] == [
        "dt=2024-01-01/hr=22",
        "dt=2024-01-01/hr=23",
        "dt=2024-01-02/hr=00",
    ]
    assert interval.batch_ids() == ["2024-01-01T22", "2024-01-01T23", "2024-01-02T00"]


def test_unaligned_interval_skips_hours_started_before_it() -> None:
    interval = Interval.parse("2024-01-01T05:30:00Z", "2024-01-01T07:30:00Z")
    assert interval.batch_ids() == ["2024-01-01T06", "2024-01-01T07"]


def test_a_day_has_24_hours_and_batch_ids_sort_in_time_order() -> None:
    ids = Interval.parse("2024-01-01", "2024-01-02").batch_ids()
    assert len(ids) == 24 and ids == sorted(ids)


def test_empty_interval_is_an_error() -> None:
    with pytest.raises(UsageError, match="must be after start"):
        Interval.parse("2024-01-02", "2024-01-01")
