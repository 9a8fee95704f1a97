"""The rebuild of `cdc repair`: overwrite-final over every staged change (applied was set aside,
so every staged file version is pending again), then the check `cdc check` runs.

Invariants: final (and tombstones, history) are written only through overwrite-final's own
commit protocol (exclusive commits, tombstones before final, marks after final), so a run of
the table that starts meanwhile competes as two overlapping runs do, never writes around it; the
result counts as repaired only when the check passes, and the check's result is written where
`cdc status` and the view read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cdc_pipeline.counts import OverwriteCounts
from cdc_pipeline.intervals import Interval
from spark_jobs import delta
from spark_jobs.check import CheckResult, check_table, write_check_file
from spark_jobs.overwrite_final import run_overwrite_final
from spark_jobs.runtime.context import StepContext


@dataclass(frozen=True)
class Rebuilt:
    """What the rebuild applied, the final it left, and the check's verdict on it."""

    counts: OverwriteCounts
    final_rows: int
    final_version: int
    check: CheckResult


def repair_interval(now: datetime | None = None) -> Interval:
    """The interval the rebuild's overwrite-final reports: the current hour. overwrite-final
    applies every pending change whatever interval it is given (README, What a run reads), so
    the interval names when it ran, not what it read."""
    hour = (now or datetime.now(UTC)).replace(minute=0, second=0, microsecond=0)
    return Interval(hour, hour + timedelta(hours=1))


def rebuild_final(context: StepContext) -> Rebuilt:
    """Apply every pending staged change to final (rebuilt from nothing when it was set aside),
    then check the table and write the check's result."""
    report = run_overwrite_final(context, repair_interval())
    final = delta.load_snapshot(context.paths.final)
    check = check_table(context.spark, context.table, context.paths)
    write_check_file(check, context.paths)
    return Rebuilt(report.result, final.num_records, final.version, check)
