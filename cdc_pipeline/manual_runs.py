"""The data interval of a DAG run, also for a run triggered without a logical date (no Airflow).

Airflow 3 lets a REST trigger pass `logical_date: null`; such a run has no data interval at all
(the API only infers one from a logical date), so `{{ data_interval_start }}` is undefined in
its tasks. A CDC run must own an interval: it takes the latest complete interval of the table's
schedule that ends at or before the run's `run_after` (the time it was triggered for), the
interval a scheduled run at that time would own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import croniter


@dataclass(frozen=True)
class RunInterval:
    """[start, end) of one run, in UTC."""

    start: datetime
    end: datetime


def latest_complete_interval(cron: str, run_after: datetime) -> RunInterval:
    """The interval between two consecutive ticks of `cron` whose end is the last tick <= run_after."""
    moment = run_after if run_after.tzinfo else run_after.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    # croniter's get_prev is strict: step a microsecond past run_after so a tick at it counts.
    end = croniter(cron, moment + timedelta(microseconds=1)).get_prev(datetime)
    start = croniter(cron, end).get_prev(datetime)
    return RunInterval(start.astimezone(UTC), end.astimezone(UTC))


def run_interval(cron: str, dag_run: Any) -> RunInterval:
    """The run's own data interval, or for a run without one the latest complete interval."""
    start = getattr(dag_run, "data_interval_start", None)
    end = getattr(dag_run, "data_interval_end", None)
    if start is not None and end is not None:
        return RunInterval(start, end)
    run_after = getattr(dag_run, "run_after", None)
    if run_after is None:
        raise ValueError(
            f"run {getattr(dag_run, 'run_id', '?')} has neither a data interval nor run_after: "
            "trigger it with a logical_date (the end of the interval to process)"
        )
    return latest_complete_interval(cron, run_after)
