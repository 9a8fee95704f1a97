"""One cron check for validation, DAGs and cadences; the bound on a run's interval."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from cdc_pipeline import planning
from cdc_pipeline.errors import UsageError
from cdc_pipeline.intervals import DEFAULT_MAX_RUN_HOURS, Interval
from cdc_pipeline.schedules import PRESETS, cron_of, is_due, schedule_problem


@pytest.mark.parametrize(
    "value", [*PRESETS, "0 3 * * *", "*/15 * * * *", "0 0 L * *", "0 0 29 2 *"]
)
def test_presets_and_crons_are_accepted_and_evaluate(value: str) -> None:
    assert schedule_problem(value) is None
    is_due(value, datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 2, tzinfo=UTC))


@pytest.mark.parametrize(
    ("value", "start"),
    [
        ("99 * * * *", "'99 * * * *' is not a valid cron (a value is out of range"),
        ("0 25 * * *", "'0 25 * * *' is not a valid cron (a value is out of range"),
        ("@once", "'@once' is not a cadence"),
        ("@fortnightly", "'@fortnightly' is not a preset"),
        ("0 0 30 2 *", "'0 0 30 2 *' never fires"),
        ("* * * * * *", "'* * * * * *' has 6 field(s)"),
        ("H * * * *", "'H * * * *' is not a valid cron (Hashed definitions must include hash_id)"),
        ("*/0 * * * *", "'*/0 * * * *' is not a valid cron"),
    ],
)
def test_what_croniter_or_the_dag_cannot_run_is_refused(value: str, start: str) -> None:
    problem = schedule_problem(value)
    assert problem is not None and problem.startswith(start), problem


def test_planning_uses_the_one_shared_table() -> None:
    assert planning.PRESETS is PRESETS
    assert planning.cron_of is cron_of and planning.is_due is is_due
    assert cron_of(" @quarterly ") == "0 0 1 */3 *"


def test_a_run_longer_than_the_bound_is_refused_before_planning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CDC_MAX_RUN_HOURS", raising=False)
    with pytest.raises(UsageError) as raised:
        Interval.parse("0001-01-01", "9999-12-31")
    assert (date(9999, 12, 31) - date(1, 1, 1)).days * 24 == 87649392
    assert str(raised.value) == (
        "interval [0001-01-01T00:00:00Z, 9999-12-31T00:00:00Z) spans 87649392 hours, more than "
        "the 8784 one run may span; split it into shorter runs or raise CDC_MAX_RUN_HOURS"
    )
    year = Interval.parse("2024-01-01", "2025-01-01")  # 2024 is a leap year: exactly the bound
    assert year.hour_count() == DEFAULT_MAX_RUN_HOURS == len(year.hours())
    with pytest.raises(UsageError, match="spans 8785 hours"):
        Interval.parse("2024-01-01", "2025-01-01T01:00:00Z")
    monkeypatch.setenv("CDC_MAX_RUN_HOURS", "2")
    assert Interval.parse("2024-01-01T00:30:00Z", "2024-01-01T02:30:00Z").batch_ids() == [
        "2024-01-01T01",
        "2024-01-01T02",
    ]
    with pytest.raises(UsageError, match="spans 3 hours, more than the 2 one run may span"):
        Interval.parse("2024-01-01T00:00:00Z", "2024-01-01T02:00:01Z")
    monkeypatch.setenv("CDC_MAX_RUN_HOURS", "lots")
    with pytest.raises(UsageError, match="CDC_MAX_RUN_HOURS='lots' must be a whole number"):
        Interval.parse("2024-01-01", "2024-01-02")


@pytest.mark.parametrize(
    ("start", "end"),
    [
        ("2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z"),
        ("2024-01-01T00:00:01Z", "2024-01-01T01:00:00Z"),
        ("2024-01-01T00:00:01Z", "2024-01-01T01:00:01Z"),
        ("2024-01-01T05:30:00Z", "2024-01-03T07:30:00Z"),
        ("2024-01-01T00:00:00Z", "2024-01-01T01:00:00Z"),
    ],
)
def test_hour_count_equals_the_listed_hours(start: str, end: str) -> None:
    interval = Interval.parse(start, end)
    assert interval.hour_count() == len(interval.hours())
