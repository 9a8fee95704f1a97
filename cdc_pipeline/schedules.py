"""Schedules: the one preset table and the one cron check shared by validation, DAGs and cadences.

Airflow 3.3's `CronDataIntervalTimetable` resolves presets with its own `CRON_PRESETS` table
and validates with `croniter(expression)` (airflow/sdk/definitions/timetables/_cron.py).
This module checks with the same `croniter`, so what `cdc validate` accepts is what the DAG
builder and the maintenance cadence (`planning.is_due`) can evaluate; a test keeps `PRESETS`
a superset of Airflow's table with the same expressions.

`@once` and `null` are not schedules of a CDC table: its runs own consecutive data intervals
(an `@once` DAG has no cron to step through, and `CronDataIntervalTimetable` refuses it). A
one-off load is `cdc run TABLE --start .. --end ..`. A maintenance cadence of `null` means never.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from croniter import CroniterBadCronError, CroniterBadDateError, CroniterError, croniter

# Airflow's CRON_PRESETS (hourly, daily, weekly, monthly, quarterly, yearly) plus croniter's own
# aliases @midnight and @annually, which this project has always accepted.
PRESETS: dict[str, str] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@quarterly": "0 0 1 */3 *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
CRON_HELP = "five fields 'minute hour day-of-month month day-of-week' (e.g. '0 3 * * *')"
# Where a cron is tried for at least one firing: croniter gives up on a date that never comes
# (February 30) only after searching, so the check looks from a fixed, leap-year-rich start.
_PROBE_START = datetime(2024, 1, 1, tzinfo=UTC)


def cron_of(schedule: str) -> str:
    """A preset as its cron expression; a cron expression unchanged (stripped)."""
    text = schedule.strip()
    return PRESETS.get(text, text)


def schedule_problem(value: object) -> str | None:
    """Why `value` is not a schedule this project can run, or None when it is one.

    Accepts a preset of `PRESETS` or a five-field cron that croniter (Airflow's cron library)
    parses and that fires at least once.
    """
    if not isinstance(value, str):
        return (
            f"{value!r} is not text: write a preset ({', '.join(PRESETS)}) or a cron ({CRON_HELP})"
        )
    text = value.strip()
    if text in PRESETS:
        return None
    if text == "@once":
        return (
            "'@once' is not a cadence: a CDC table's runs own consecutive data intervals; "
            "use a preset or a cron (a one-off load is `cdc run TABLE --start .. --end ..`)"
        )
    if text.startswith("@"):
        return f"{text!r} is not a preset (presets: {', '.join(PRESETS)})"
    fields = text.split()
    if len(fields) != 5:
        return f"{text!r} has {len(fields)} field(s); a cron has {CRON_HELP}"
    try:
        croniter(text, _PROBE_START.replace(tzinfo=None)).get_next(datetime)
    except CroniterBadDateError:
        return f"{text!r} never fires (no date matches it)"
    except (CroniterBadCronError, CroniterError, ValueError) as error:
        return f"{text!r} is not a valid cron ({_cron_reason(error)}); a cron has {CRON_HELP}"
    return None


def _cron_reason(error: Exception) -> str:
    """croniter's reason without the expression it repeats in brackets."""
    text = str(error).strip()
    if text.startswith("[") and "]" in text:
        text = text[text.index("]") + 1 :].strip()
    if "out of range" in text:
        return "a value is out of range: minute 0-59, hour 0-23, day 1-31, month 1-12, weekday 0-6"
    return text or type(error).__name__


def is_due(schedule: str | None, start: datetime, end: datetime) -> bool:
    """True when the cadence `schedule` fires at some time in [start, end); never for None."""
    if schedule is None:
        return False
    first = croniter(cron_of(schedule), start - timedelta(microseconds=1)).get_next(datetime)
    return bool(start <= first < end)


def schedule_period(schedule: str, at: datetime) -> timedelta:
    """The length of the schedule's interval ending at or before `at` (an hourly table: 1 h)."""
    previous = croniter(cron_of(schedule), at).get_prev(datetime)
    return previous - croniter(cron_of(schedule), previous).get_prev(datetime)
