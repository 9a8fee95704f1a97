"""Interval planning: which landing hour folders a run over [start, end) reads."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from cdc_pipeline.errors import UsageError

HOUR = timedelta(hours=1)
MAX_RUN_HOURS_ENV = "CDC_MAX_RUN_HOURS"
# One leap year of hour folders. Airflow runs (and backfills) are one schedule interval each;
# only a CLI catch-up spans more, and a year of hours is 8,784 folders to list, a few MB of
# plan. Without a bound, a typo such as --end 9999-12-31 planned every hour until memory ran out.
DEFAULT_MAX_RUN_HOURS = 24 * 366
# A landing hour folder, dt=YYYY-MM-DD/hr=HH: group 1 the day, group 2 the hour (see batch_id).
HOUR_FOLDER_PATTERN = r"dt=(\d{4}-\d{2}-\d{2})/hr=(\d{2})"


def batch_id(day: str, hour: str) -> str:
    """The `_cdc_batch` id of the hour folder dt={day}/hr={hour}: 2024-01-01T05 (sorts in arrival
    order). The Spark twin that reads it off a file path is `stage._with_arrival`."""
    return f"{day}T{hour}"


def hour_folder(batch: str) -> str:
    """The landing folder of a batch id, relative to the table's landing folder: 2024-01-01T05 ->
    dt=2024-01-01/hr=05."""
    return f"dt={batch[:10]}/hr={batch[11:]}"


def max_run_hours() -> int:
    """The most hour folders one run may span: `CDC_MAX_RUN_HOURS`, default 8784 (a leap year)."""
    text = os.environ.get(MAX_RUN_HOURS_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_RUN_HOURS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(
            f"{MAX_RUN_HOURS_ENV}={text!r} must be a whole number of hours, at least 1"
        )
    return value


def parse_timestamp(text: str) -> datetime:
    """ISO 8601 timestamp (or a date meaning midnight) as an aware UTC datetime."""
    value = text.strip()
    try:
        if len(value) == 10:
            parsed = datetime.combine(date.fromisoformat(value), datetime.min.time())
        else:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{text!r} is not an ISO 8601 timestamp (for example 2024-01-01T00:00:00Z or 2024-01-01)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def format_timestamp(value: datetime) -> str:
    """UTC timestamp as 2024-01-01T00:00:00Z."""
    # isoformat, not strftime: %Y drops the leading zeros of years before 1000.
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


@dataclass(frozen=True, order=True)
class HourBatch:
    """One landing hour folder, dt=YYYY-MM-DD/hr=HH; its id sorts in arrival order."""

    start: datetime

    @property
    def batch_id(self) -> str:
        """Sortable id stored in `_cdc_batch`: 2024-01-01T05."""
        return batch_id(f"{self.start:%Y-%m-%d}", f"{self.start:%H}")

    @property
    def folder(self) -> str:
        """Relative landing folder of this hour."""
        return hour_folder(self.batch_id)


@dataclass(frozen=True)
class Interval:
    """A run's data interval [start, end) in UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise UsageError(
                f"interval end {format_timestamp(self.end)} must be after start {format_timestamp(self.start)}"
            )
        limit = max_run_hours()
        if self.hour_count() > limit:
            raise UsageError(
                f"interval {self} spans {self.hour_count()} hours, more than the {limit} one run "
                f"may span; split it into shorter runs or raise {MAX_RUN_HOURS_ENV}"
            )

    @classmethod
    def parse(cls, start: str, end: str) -> Interval:
        """Interval from two ISO 8601 strings."""
        return cls(parse_timestamp(start), parse_timestamp(end))

    def _first_hour(self) -> datetime:
        first = self.start.replace(minute=0, second=0, microsecond=0)
        return first + HOUR if first < self.start else first

    def hour_count(self) -> int:
        """How many hour folders start inside [start, end), computed without listing them."""
        first = self._first_hour()
        if first >= self.end:
            return 0
        return (self.end - first - timedelta(microseconds=1)) // HOUR + 1

    def hours(self) -> list[HourBatch]:
        """Every hour folder whose hour starts inside [start, end)."""
        batches = []
        current = self._first_hour()
        while current < self.end:
            batches.append(HourBatch(current))
            current += HOUR
        return batches

    def batch_ids(self) -> list[str]:
        """`_cdc_batch` values of the interval's hours."""
        return [batch.batch_id for batch in self.hours()]

    def __str__(self) -> str:
        return f"[{format_timestamp(self.start)}, {format_timestamp(self.end)})"
