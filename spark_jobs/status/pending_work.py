"""Whether a run of an interval could change anything, asked before any Spark starts (the
Airflow operator reports a no-op without a session when it could not)."""

from __future__ import annotations

from cdc_pipeline.config import TableConfig
from cdc_pipeline.intervals import Interval
from cdc_pipeline.paths import TablePaths
from spark_jobs import delta
from spark_jobs.kafka.lag import kafka_has_work
from spark_jobs.landing import (
    Ledger,
    list_landing,
    listing_interval,
    read_ledger,
    unknown_files,
)
from spark_jobs.overwrite import applied


def idle_outside(
    paths: TablePaths, table: TableConfig, interval: Interval, *, count_outside: bool
) -> int | None:
    """None when stage or overwrite-final of `interval` could change anything; otherwise the
    change files outside its window no run staged (0 unless `count_outside`: a no-op stage
    reports them). The ledger is read once for both."""
    ledger = read_ledger(delta.arrow_table(paths.ledger)) if table.source == "files" else None
    if interval_has_work(paths, table, interval, ledger=ledger):
        return None
    return files_outside_window(paths, table, interval, ledger=ledger) if count_outside else 0


def interval_has_work(
    paths: TablePaths, table: TableConfig, interval: Interval, *, ledger: Ledger | None = None
) -> bool:
    """Whether stage or overwrite-final of `interval` could change anything.

    A Kafka table: False only when no partition of its topic holds a message not staged and
    every staged range is applied (the broker's offsets against staging's: no Spark either).

    False only when no hour folder the run lists (its late-arrival window) holds a change file
    the ledger does not know by size and mtime (nor a link, which stage would record as
    refused) AND every staged file version is applied: a rerun after a crash between stage and
    overwrite-final still finds its staged rows. Reads only folder listings and the ledger and
    applied tables (delta-rs), never Spark.
    """
    if table.source == "kafka":
        return kafka_has_work(table, paths) or bool(applied.pending_files(paths).files)
    window = listing_interval(
        interval, table.late_arrival_window.delta, whole_extracts=table.change_format == "snapshot"
    )
    listing = list_landing(paths, window, table.file_format)
    if listing.links:
        return True
    if ledger is None:
        ledger = read_ledger(delta.arrow_table(paths.ledger))
    if unknown_files(listing.files, ledger.entries({f.batch for f in listing.files})):
        return True
    whole_extracts = table.change_format == "snapshot"
    return bool(applied.pending_files(paths, whole_extracts=whole_extracts, ledger=ledger).files)


def files_outside_window(
    paths: TablePaths, table: TableConfig, interval: Interval, *, ledger: Ledger | None = None
) -> int:
    """Change files landed in hour folders before the run's window that no run staged (a files
    table; folder listings and the ledger only)."""
    from spark_jobs.landing import unknown_before

    if table.source != "files":
        return 0
    window = listing_interval(
        interval, table.late_arrival_window.delta, whole_extracts=table.change_format == "snapshot"
    )
    if ledger is None:
        ledger = read_ledger(delta.arrow_table(paths.ledger))
    return len(unknown_before(paths, window.start, table.file_format, ledger))
