"""What one stage run reads and refuses: the interval's landing listing against the ledger
(`StagePlan`), and the rows it read (`StageRows`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from cdc_pipeline.config import TableConfig
from cdc_pipeline.counts import StageCounts
from cdc_pipeline.errors import InputError
from cdc_pipeline.intervals import Interval
from spark_jobs import delta, landing
from spark_jobs.formats import snapshot as extracts
from spark_jobs.landing import LandingFile, ParquetPlan, Refusal
from spark_jobs.rules.transforms import BATCH, FILE
from spark_jobs.runtime.context import StepContext


@dataclass(frozen=True)
class StagePlan:
    """What one stage run reads and refuses: the interval's landing listing against the ledger.

    Never changed once made: a step that learns more (a file Spark cannot read, a file that
    changed while read) makes a new plan with `replace`."""

    listing: landing.Listing
    ledger: dict[tuple[str, str], landing.LedgerEntry]  # the listed hours' versions
    files: landing.FilePlan
    staging: delta.Snapshot
    pending: list[LandingFile]
    refusals: list[Refusal]
    snapshot_batch: str | None
    to_read: list[LandingFile]
    parquet: ParquetPlan | None
    refused: frozenset[tuple[str, str]]
    outside_window: list[LandingFile]  # landed before the window, not staged: reported only


@dataclass(frozen=True)
class StageRows:
    """The plan as read, the typed rows of its files (to staging, to quarantine), per-file counts,
    the frames to unpersist once committed, and the ledger rows of versions a crashed run left
    unrecorded; good and bad are None when no file was read."""

    plan: StagePlan
    good: DataFrame | None = None
    bad: DataFrame | None = None
    per_file: list[Any] = field(default_factory=list)
    release: list[Callable[[], Any]] = field(default_factory=list)
    recorded: list[dict[str, Any]] = field(default_factory=list)
    # What reading found besides rows: lines skipped, columns ignored or evolved, operations.
    found: StageCounts = field(default_factory=StageCounts)
    changed_while_read: int = 0  # files left for the next run (`recovery.leave_changed_files`)


@dataclass(frozen=True)
class Committed:
    """What a stage run committed: rows and the version of staging, then of quarantine."""

    staged: int
    staging_version: int
    quarantined: int
    quarantine_version: int


def plan_stage(context: StepContext, interval: Interval) -> StagePlan:
    """List the interval's landing and plan it against the ledger: the files to read, the entries
    refused; an extract out of order, or one with a changed or refused file, stops the run."""
    table, paths = context.table, context.paths
    is_snapshot = table.change_format == "snapshot"
    window = landing.listing_interval(
        interval, table.late_arrival_window.delta, whole_extracts=is_snapshot
    )
    listing = landing.list_landing(paths, window, table.file_format)
    whole_ledger = landing.read_ledger(delta.arrow_table(paths.ledger))
    # Only the listed hours' versions become objects (a year of runs is 35,000 rows).
    listed = {f.batch for f in listing.files} | {link.batch for link in listing.links}
    ledger = whole_ledger.entries(listed | {h.batch_id for h in window.hours()})
    files = landing.plan_files(listing, ledger)
    outside: list[LandingFile] = []
    if not is_snapshot:
        outside = landing.unknown_before(paths, window.start, table.file_format, whole_ledger)
    pending, refusals = files.pending, list(files.refusals)
    staging = delta.load_snapshot(paths.staging)
    snapshot_batch = None
    if is_snapshot:
        check_extract_files(table, interval, files.changed_versions, refusals)
    if pending and is_snapshot:
        batch_ledger = whole_ledger.unrefused_batches()
        snapshot_batch = extracts.check_order(
            context, interval, [f.batch for f in pending], batch_ledger, staging
        )
    # A full extract is compared as a whole: all its files, also those staged before.
    to_read = [f for f in listing.files if f.batch == snapshot_batch] if snapshot_batch else pending
    parquet = None
    if table.file_format == "parquet" and to_read:
        parquet = landing.plan_parquet(to_read, table.columns, table.flag_source)
        refusals += parquet.refusals
        if is_snapshot:
            check_extract_files(table, interval, [], parquet.refusals)
    refused = frozenset((r.batch, r.file) for r in refusals)
    to_read = [f for f in to_read if f.ident not in refused]
    return StagePlan(
        listing,
        ledger,
        files,
        staging,
        pending,
        refusals,
        snapshot_batch,
        to_read,
        parquet,
        refused,
        outside,
    )


def planned_counts(plan: StagePlan) -> StageCounts:
    """The run's counts as planned (rows and versions are counted when they are written)."""
    return StageCounts(
        files=len(plan.listing.files),
        new_files=len(plan.pending) + len(plan.files.refused_files()),
        rows_read=0,
        staged=0,
        quarantined=0,
        files_refused=refused_files(plan),
        symlinks_refused=plan.files.links,
        unrecognised_entries=len(plan.listing.unrecognised),
        files_deferred=len(plan.files.deferred),
        files_outside_window=len(plan.outside_window),
    )


def refused_files(plan: StagePlan) -> int:
    """Files (not links) the plan refuses, those Spark could not read included."""
    return len([r for r in plan.refusals if r.source is not None])


def files_in(
    spark: SparkSession, snapshot: delta.Snapshot, batches: Sequence[str]
) -> set[tuple[str, str]]:
    """(batch, file) pairs that have rows in a staging-like table (partitioned by `_cdc_batch`)."""
    if not snapshot.exists or not snapshot.files_in(batches):
        return set()
    rows = read_snapshot_distinct_files(spark, snapshot, batches)
    return {(r[BATCH], r[FILE]) for r in rows}


def read_snapshot_distinct_files(
    spark: SparkSession, snapshot: delta.Snapshot, batches: Sequence[str]
) -> list:
    """Distinct (batch, file) of the given batches; a small metadata result."""
    frame = delta.read_snapshot(spark, snapshot, partitions=batches, columns=[BATCH, FILE])
    return frame.distinct().collect()  # metadata: one row per file


def check_extract_files(
    table: TableConfig, interval: Interval, changed: Sequence[LandingFile], refusals: list[Refusal]
) -> None:
    """A snapshot extract is compared as a whole: a changed or refused file of it stops the run
    (staging a part of an extract would delete the keys of the missing part)."""
    where = f"table {table.name}: {interval}"
    if changed:
        raise InputError(
            f"{where}: the extract file {changed[0].relative} changed after it was staged; "
            "snapshot extracts are compared as a whole: land the corrected extract in a later "
            "hour folder"
        )
    if refusals:
        raise InputError(
            f"{where}: the extract entry {refusals[0].relative} is refused ({refusals[0].reason}); "
            "snapshot extracts are compared as a whole: fix or remove it, then rerun the interval"
        )
