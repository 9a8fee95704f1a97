"""Interval planning: which landing hour folders a run over [start, end) reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from cdc_pipeline.errors import UsageError

HOUR = timedelta(hours=1)


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
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, order=True)
class HourBatch:
    """One landing hour folder, dt=YYYY-MM-DD/hr=HH; its id sorts in arrival order."""

    start: datetime

    @property
    def batch_id(self) -> str:
        """Sortable id stored in `_cdc_batch`: 2024-01-01T05."""
        return self.start.strftime("%Y-%m-%dT%H")

    @property
    def folder(self) -> str:
        """Relative landing folder of this hour."""
        return self.start.strftime("dt=%Y-%m-%d/hr=%H")


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

    @classmethod
    def parse(cls, start: str, end: str) -> Interval:
        """Interval from two ISO 8601 strings."""
        return cls(parse_timestamp(start), parse_timestamp(end))

    def hours(self) -> list[HourBatch]:
        """Every hour folder whose hour starts inside [start, end)."""
        first = self.start.replace(minute=0, second=0, microsecond=0)
        if first < self.start:
            first += HOUR
        batches = []
        current = first
        while current < self.end:
            batches.append(HourBatch(current))
            current += HOUR
        return batches

    def batch_ids(self) -> list[str]:
        """`_cdc_batch` values of the interval's hours."""
        return [batch.batch_id for batch in self.hours()]

    def __str__(self) -> str:
        return f"[{format_timestamp(self.start)}, {format_timestamp(self.end)})"
