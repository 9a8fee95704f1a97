"""Freshness by data: what final has applied and what has landed but is not applied yet.

Measured from the tables and the landing zone, never from the runs that succeeded: a table whose
hourly runs all succeed as no-ops while its capture job stopped (or while its files land in a
folder no run reads) is stale here. Driver-side metadata only (folder listings, the ledger, the
applied marks and the Delta logs' statistics), no Spark: `cdc status`, the CDC tables view and
the freshness alert read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc

from cdc_pipeline.config import TableConfig
from cdc_pipeline.intervals import HOUR, Interval, format_timestamp
from cdc_pipeline.paths import TablePaths
from spark_jobs import delta, landing
from spark_jobs.overwrite import applied

BACKLOG_SHOWN = 20  # files listed per kind (the counts are always whole)


@dataclass(frozen=True, kw_only=True)
class BacklogFile:
    """A landed file not applied: where, its hour, size and age, and the run that applies it."""

    path: str  # relative to the table's landing folder: dt=.../hr=.../name
    hour: str  # its hour folder's start, ISO 8601
    size: int
    age_hours: float
    apply_with: str  # the command that stages and applies it

    def document(self) -> dict[str, Any]:
        """As plain JSON data."""
        return {
            "path": self.path,
            "hour": self.hour,
            "size": self.size,
            "age_hours": round(self.age_hours, 2),
            "apply_with": self.apply_with,
        }


def backlog(table: str, files: list[landing.LandingFile], now: datetime) -> tuple[BacklogFile, ...]:
    """The first BACKLOG_SHOWN files, oldest hour first, each with `cdc run` over its hour."""
    shown = []
    for found in sorted(files, key=lambda f: (f.batch, f.relative))[:BACKLOG_SHOWN]:
        hour = datetime.fromisoformat(f"{found.batch}:00:00+00:00")
        start, end = format_timestamp(hour), format_timestamp(hour + HOUR)
        shown.append(
            BacklogFile(
                path=found.relative,
                hour=start,
                size=found.size,
                age_hours=max(0.0, (now.timestamp() - found.mtime_ns / 1e9) / 3600),
                apply_with=f"cdc run {table} --start {start} --end {end}",
            )
        )
    return tuple(shown)


@dataclass(frozen=True)
class DataFreshness:
    """One table's freshness by data at `measured_at`."""

    table: str
    measured_at: datetime
    newest_change: datetime | None  # newest sequence time applied (sequence_by[0] a time)
    newest_applied_file: datetime | None  # landing time (mtime) of the newest applied file
    files_applied: int
    files_waiting: int  # landed in the window and not staged, or staged and not applied
    oldest_waiting: datetime | None  # landing time of the oldest of them
    files_outside_window: int  # landed before the window, never staged
    # How old the oldest waiting change can be: the start of its file's hour folder (changes land
    # in the folder of the hour they were captured), or its landing time when that is earlier; a
    # Kafka table's oldest unstaged message's broker time. The lag by data is measured from it.
    oldest_change_waiting: datetime | None = None
    # A Kafka table: messages in its topic not staged yet, its partitions, and why the broker
    # could not tell (oldest_waiting is then the oldest unstaged message's broker time).
    messages_waiting: int | None = None
    partitions: int | None = None
    source_error: str | None = None
    # The files behind files_waiting and files_outside_window (the first BACKLOG_SHOWN of each):
    # what `cdc status --json` and the view list, with the command that applies them.
    waiting_files: tuple[BacklogFile, ...] = ()
    outside_files: tuple[BacklogFile, ...] = ()

    @property
    def oldest_change(self) -> datetime | None:
        """Where the lag by data counts from: the oldest waiting change (None: nothing waits)."""
        return self.oldest_change_waiting or self.oldest_waiting

    @property
    def waiting_hours(self) -> float | None:
        """Age of the oldest waiting change in hours (None: nothing waits)."""
        if self.oldest_change is None:
            return None
        return max(0.0, (self.measured_at - self.oldest_change).total_seconds() / 3600)

    @property
    def newest_change_hours(self) -> float | None:
        """Age of the newest change applied, in hours (None: unknown)."""
        if self.newest_change is None:
            return None
        return max(0.0, (self.measured_at - self.newest_change).total_seconds() / 3600)

    def document(self) -> dict[str, Any]:
        """As plain JSON data (`cdc status --json`, the view)."""
        return {
            "table": self.table,
            "measured_at": _iso(self.measured_at),
            "newest_change": _iso(self.newest_change),
            "newest_applied_file": _iso(self.newest_applied_file),
            "files_applied": self.files_applied,
            "files_waiting": self.files_waiting,
            "oldest_waiting": _iso(self.oldest_waiting),
            "oldest_change_waiting": _iso(self.oldest_change),
            "waiting_hours": None if self.waiting_hours is None else round(self.waiting_hours, 2),
            "files_outside_window": self.files_outside_window,
            **(
                {
                    "waiting_files": [f.document() for f in self.waiting_files],
                    "outside_files": [f.document() for f in self.outside_files],
                }
                if self.waiting_files or self.outside_files
                else {}
            ),
            **(
                {
                    "messages_waiting": self.messages_waiting,
                    "partitions": self.partitions,
                    "source_error": self.source_error,
                }
                if self.partitions is not None or self.source_error is not None
                else {}
            ),
        }

    def line(self) -> str:
        """`status orders: newest_change=... files_waiting=0 ...` (one line per table)."""
        values = " ".join(
            f"{k}={'-' if v is None else v}"
            for k, v in self.document().items()
            if k not in ("table", "waiting_files", "outside_files")
        )
        return f"status {self.table}: {values}"

    def backlog_lines(self) -> list[str]:
        """One indented line per listed file not applied: where, how old, the command."""
        return [
            f"  {kind}: {f.path} (hour {f.hour}, {f.size} bytes, {f.age_hours:.1f} h old): "
            f"{f.apply_with}"
            for kind, files in (
                ("waiting", self.waiting_files),
                ("outside window", self.outside_files),
            )
            for f in files
        ]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else format_timestamp(value)


def _from_ns(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1e9, UTC)


def change_bound(batch: str, mtime_ns: int | None) -> datetime | None:
    """The oldest a landed file's changes can be: its hour folder's start, or the time it
    landed when that is earlier (a file written ahead into a later hour's folder)."""
    landed = _from_ns(mtime_ns)
    try:
        hour = datetime.strptime(batch, "%Y-%m-%dT%H").replace(tzinfo=UTC)
    except ValueError:
        return landed
    return hour if landed is None else min(hour, landed)


def data_freshness(
    table: TableConfig,
    paths: TablePaths,
    now: datetime | None = None,
    *,
    kafka_properties: Mapping[str, str] | None = None,
) -> DataFreshness:
    """The table's freshness by data now: a run ending now would list the hours of its late-arrival
    window; what it would stage, and what is staged but not applied, is waiting."""
    now = now or datetime.now(UTC)
    if table.source == "kafka":
        return _kafka_freshness(table, paths, now, kafka_properties)
    is_extract = table.change_format == "snapshot"
    end = now.replace(minute=0, second=0, microsecond=0) + HOUR  # the current hour is listed
    window = landing.listing_interval(
        Interval(end - HOUR, end), table.late_arrival_window.delta, whole_extracts=is_extract
    )
    ledger = landing.read_ledger(delta.arrow_table(paths.ledger))
    listed = landing.list_landing(paths, window, table.file_format).files
    not_staged = landing.unknown_files(listed, ledger.entries({f.batch for f in listed}))
    outside = landing.unknown_before(paths, window.start, table.file_format, ledger)
    marks = applied.applied_marks(paths)
    pending = applied.pending_files(paths, whole_extracts=is_extract, ledger=ledger, marks=marks)
    waiting = [f.mtime_ns for f in not_staged] + [
        e.mtime_ns for e in pending.files if e.mtime_ns is not None
    ]
    bounds = [change_bound(f.batch, f.mtime_ns) for f in not_staged] + [
        change_bound(e.batch, e.mtime_ns) for e in pending.files
    ]
    changes_waiting = [b for b in bounds if b is not None]
    landed = pc.max(marks["landed_mtime_ns"]).as_py()
    return DataFreshness(
        table=table.name,
        measured_at=now,
        newest_change=ledger.newest_change(marks),
        newest_applied_file=_from_ns(landed) if landed is not None else None,
        files_applied=applied.distinct_versions(marks),
        files_waiting=len(not_staged) + len(pending.files),
        oldest_waiting=_from_ns(min(waiting)) if waiting else None,
        oldest_change_waiting=min(changes_waiting) if changes_waiting else None,
        files_outside_window=len(outside),
        waiting_files=backlog(table.name, not_staged, now),
        outside_files=backlog(table.name, outside, now),
    )


def _kafka_freshness(
    table: TableConfig,
    paths: TablePaths,
    now: datetime,
    properties: Mapping[str, str] | None,
) -> DataFreshness:
    """A Kafka table's freshness: what it applied (the ledger's ranges, as for files) and what
    waits (its topic's unstaged messages, then the staged ranges not applied)."""
    from spark_jobs.kafka.lag import topic_lag

    ledger = landing.read_ledger(delta.arrow_table(paths.ledger))
    marks = applied.applied_marks(paths)
    pending = applied.pending_files(paths, ledger=ledger, marks=marks)
    lag = topic_lag(table, paths, properties)
    staged_waiting = [e.staged_at for e in pending.files if e.staged_at is not None]
    oldest = [t for t in [lag.oldest_waiting, *staged_waiting] if t is not None]
    return DataFreshness(
        table=table.name,
        measured_at=now,
        newest_change=ledger.newest_change(marks),
        newest_applied_file=None,
        files_applied=applied.distinct_versions(marks),
        files_waiting=len(pending.files),
        oldest_waiting=min(oldest) if oldest else None,
        oldest_change_waiting=min(oldest) if oldest else None,
        files_outside_window=0,
        messages_waiting=lag.messages_waiting,
        partitions=lag.partitions,
        source_error=lag.error,
    )


@dataclass(frozen=True)
class Freshness:
    """How far behind a table is, and whether it missed its deadline.

    Measured by the data when it can be read (`data`): behind is the age of the oldest file
    landed but not applied (0 when every landed file is applied), the deadline that file's
    landing time plus `freshness`; a file outside the late-arrival window is overdue at once.
    Otherwise by the runs: now minus the last successful interval's end.
    """

    last_success_end: datetime | None
    hours_behind: float | None
    deadline: datetime | None  # None: no limit, or nothing waiting
    overdue: bool
    data: DataFreshness | None = None


def data_freshness_of(
    table: TableConfig, last_success_end: datetime | None, data: DataFreshness
) -> Freshness:
    """Freshness by the data: see Freshness."""
    limit = table.freshness
    waiting = data.waiting_hours
    behind = waiting if waiting is not None else (0.0 if data.files_applied else None)
    deadline = None
    if limit and data.oldest_change is not None:
        deadline = data.oldest_change + limit.delta
    overdue = data.files_outside_window > 0 or (
        deadline is not None and data.measured_at > deadline
    )
    return Freshness(last_success_end, behind, deadline, overdue, data)
