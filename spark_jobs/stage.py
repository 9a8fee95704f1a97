"""Step `stage`: the interval's landed change files into the staging table (bad rows to quarantine)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cdc_pipeline.config import EVENT_FORMATS, TableConfig
from cdc_pipeline.errors import CdcError, ConfigError, InputError
from cdc_pipeline.intervals import HOUR_FOLDER_PATTERN, Interval
from cdc_pipeline.schema import plan_schema
from spark_jobs import delta, extracts, landing
from spark_jobs.common import StepArgs, StepContext, StepReport, run_step
from spark_jobs.csv_format import read_csv_changes
from spark_jobs.formats import ChangeRead, read_json_changes
from spark_jobs.landing import LandingFile, ParquetPlan, Refusal
from spark_jobs.transforms import (
    ABSENT,
    ARRIVAL,
    BATCH,
    FILE,
    FLAG,
    RAW,
    REASON,
    ROW,
    good_changes,
    quarantined_changes,
    quoted,
    type_changes,
)

MAX_LISTED = 10  # entries named in one warning line
NEWEST = "newest_change"  # per-file count: the newest sequence time among its good rows


def _with_arrival(df: DataFrame, row_position: str) -> DataFrame:
    """Add `_cdc_batch` (from the dt=/hr= folder), `_cdc_file` and `_cdc_row` to a file scan."""
    path = F.col("_metadata.file_path")
    pattern = HOUR_FOLDER_PATTERN + r"/[^/]*$"
    # Spark gives file names URL-encoded (a space as %20, % as %25) and leaves + as it is:
    # decoded back to the landed name (+ protected first, as the decoder reads it as a space),
    # so `_cdc_file` is what the ledger calls the file.
    name = F.url_decode(F.replace(F.col("_metadata.file_name"), F.lit("+"), F.lit("%2B")))
    # intervals.batch_id in Spark: the day, "T", the hour.
    batch = F.concat(
        F.regexp_extract(path, pattern, 1), F.lit("T"), F.regexp_extract(path, pattern, 2)
    )
    if row_position == "row_index":
        return df.select(
            "*",
            batch.alias(BATCH),
            name.alias(FILE),
            F.col("_metadata.row_index").alias(ROW),
        )
    # Text formats have no row index: order each file's rows by split offset, then by the
    # scan's increasing id (increasing within a split), and number them.
    scanned = df.select(
        "*",
        batch.alias(BATCH),
        name.alias(FILE),
        path.alias("__path"),
        F.col("_metadata.file_block_start").alias("__block"),
        F.monotonically_increasing_id().alias("__scan_id"),
    )
    window = Window.partitionBy("__path").orderBy("__block", "__scan_id")
    return scanned.withColumn(ROW, F.row_number().over(window) - 1).drop(
        "__path", "__block", "__scan_id"
    )


def read_landing(
    spark: SparkSession,
    table: TableConfig,
    files: Sequence[LandingFile],
    parquet: ParquetPlan | None = None,
) -> ChangeRead:
    """The change rows of `files` as read (csv/json values as text) with arrival columns;
    Parquet files as `parquet` groups them (probed here when not given)."""
    paths = [landing.spark_path(f.path) for f in files]
    if table.file_format == "json":
        lines = _with_arrival(spark.read.text(paths), "scan")
        return read_json_changes(spark, table, lines)
    if table.file_format == "parquet":
        return _read_parquet(spark, table, files, parquet)
    # CSV: each line parsed against its file's header (spark_jobs/csv_format.py).
    return read_csv_changes(
        spark, table, [f.path for f in files], lambda df: _with_arrival(df, "scan")
    )


def _read_parquet(
    spark: SparkSession,
    table: TableConfig,
    files: Sequence[LandingFile],
    parquet: ParquetPlan | None,
) -> ChangeRead:
    """Each group of same-schema files read on its own, cast to the run's column types, then
    unioned: a column that is an int in one file and a string in another never fails the read."""
    plan = parquet or landing.plan_parquet(files, table.columns, table.flag_source)
    technical = {table.flag_source, *ARRIVAL}
    frames = [
        _with_arrival(
            spark.read.option("mergeSchema", "true").parquet(
                *[landing.spark_path(f.path) for f in group]
            ),
            "row_index",
        )
        for group in plan.groups
    ]
    if len(frames) == 1:
        frame = frames[0]
        found = {
            f.name: f.dataType.simpleString()
            for f in frame.schema.fields
            if f.name not in technical
        }
        return _flat_read(table, frame, found)
    cast = [
        frame.select(
            *[
                F.col(f"`{f.name}`").cast(plan.column_types[f.name]).alias(f.name)
                if f.name in plan.column_types
                and f.dataType.simpleString() != plan.column_types[f.name]
                else F.col(f"`{f.name}`")
                for f in frame.schema.fields
            ]
        )
        for frame in frames
    ]
    result = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), cast)
    found = {c: t for c, t in plan.column_types.items() if c not in technical}
    return _flat_read(table, result, found)


def _flat_read(table: TableConfig, frame: DataFrame, found: dict[str, str]) -> ChangeRead:
    """A parquet or csv read: declared columns win; undeclared ones are reported."""
    if table.columns is None:
        return ChangeRead(frame, dict(found))
    undeclared = sorted(set(found) - set(table.columns))
    return ChangeRead(frame, dict(table.columns), undeclared=undeclared)


def table_column_types(table: TableConfig, staging: delta.Snapshot) -> dict[str, str] | None:
    """Staging's data columns and types (None before staging exists)."""
    if staging.schema is None:
        return None
    technical = {*ARRIVAL, FLAG, ABSENT, table.partition_column, *extracts.HASH_COLUMNS}
    return {
        f.name: f.dataType.simpleString() for f in staging.schema.fields if f.name not in technical
    }


def staging_columns(table: TableConfig, column_types: dict[str, str]) -> list[str]:
    """Staging's columns: data columns (and a snapshot's hashes), the partition column, the flag,
    (event formats) the columns a change did not carry, and the arrival columns."""
    partition = table.partition_by
    hashes = list(extracts.HASH_COLUMNS) if table.change_format == "snapshot" else []
    absent = [ABSENT] if table.change_format in EVENT_FORMATS or table.ignore_null_updates else []
    return [*column_types, *hashes, *partition, FLAG, *absent, *ARRIVAL]


def _files_in(
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


def _commit_append(
    path: Path, frame: DataFrame, partition_by: list[str], step: str, fault_point: str
) -> tuple[int, int]:
    """Append `frame` to the table at `path` (created if needed); returns (rows, version)."""
    delta.ensure_table(path, frame.schema, partition_by)
    return delta.append_with_retries(frame, path, step, fault_point)


def _commit_staging(
    path: Path, frame: DataFrame, planned: delta.Snapshot
) -> tuple[int, int] | None:
    """Append the staged rows as the first data commit after the snapshot the run planned from
    (its own schema evolution aside); None when another run's commit came first: it may hold
    the same file versions, so the caller plans again instead of staging them twice."""
    delta.ensure_table(path, frame.schema, [BATCH])
    current = delta.load_snapshot(path)
    if delta.data_commits_between(
        path, planned.version, current.version, ignore=("evolve_schema",)
    ):
        return None
    run_id = delta.new_run_id()
    written = delta.write_files(frame, path, current.partition_columns, run_id)
    if not written.actions:
        return 0, current.version
    delta.inject_fault("stage:before_staging_commit")
    result = delta.try_commit(current, written, "append", "stage", run_id, exclusive=True)
    return None if result is None else (written.rows, result.version)


@dataclass
class _StagePlan:
    """What one stage run reads and refuses: the interval's landing listing against the ledger."""

    listing: landing.Listing
    ledger: dict[tuple[str, str], landing.LedgerEntry]
    files: landing.FilePlan
    staging: delta.Snapshot
    pending: list[LandingFile]
    refusals: list[Refusal]
    snapshot_batch: str | None
    to_read: list[LandingFile]
    parquet: ParquetPlan | None
    refused: set[tuple[str, str]]
    outside_window: list[LandingFile]  # landed before the window, not staged: reported only


@dataclass
class _StageRows:
    """The typed rows of the files read (to staging, to quarantine), per-file counts, and the
    frames to unpersist once committed; good and bad are None when no file was read."""

    good: DataFrame | None = None
    bad: DataFrame | None = None
    per_file: list[Any] = field(default_factory=list)
    release: list[Callable[[], Any]] = field(default_factory=list)


def run_stage(context: StepContext, interval: Interval) -> StepReport:
    """Stage every landed file version not staged yet in the hours the run lists (the
    late-arrival window up to the interval's end); quarantine the rows that cannot be applied and
    the entries that cannot be read (links, unreadable files, contradicting Parquet schemas).

    Runs of one table may overlap (their windows do): staging takes one run's files at a time.
    An attempt whose staging commit is not the first after its plan plans again, and finds the
    other run's files in staging instead of staging them twice."""
    return delta.with_retries(
        f"table {context.table.name}: stage", lambda _: _stage_attempt(context, interval)
    )


def _stage_attempt(context: StepContext, interval: Interval) -> StepReport | None:
    """One plan-read-commit of the stage step; None when another run staged first."""
    spark, table, paths = context.spark, context.table, context.paths
    report = StepReport("stage", table.name, str(interval))
    plan = _plan_stage(context, interval)
    counts = report.counts
    _count_planned(counts, plan)
    _warn_landing(table, interval, plan.listing, plan.files, plan.refusals)
    _warn_outside_window(table, interval, plan.outside_window)
    quarantine = delta.load_snapshot(paths.quarantine)
    now, run_id = datetime.now(UTC), delta.new_run_id()
    ledger_rows = [
        landing.ledger_row(f, f.batch, f.file, 0, 0, entry.refused, now, run_id)
        for f, entry in plan.files.touched
    ]
    if not plan.pending and not plan.refusals:
        _append_ledger(paths.ledger, ledger_rows)
        counts.update(staging_version=plan.staging.version, quarantine_version=quarantine.version)
        return report
    # A crash between the staging, quarantine and ledger commits leaves a file recorded in some
    # of them: each table takes only the rows of files it does not hold yet.
    batches = sorted({f.batch for f in plan.pending} | {r.batch for r in plan.refusals})
    in_staging = _files_in(spark, plan.staging, batches)
    in_quarantine = _files_in(spark, quarantine, batches)
    delta.inject_fault("stage:before_first_write")
    rows = _read_planned(context, interval, plan, in_staging, counts)
    _settle_crashed_run(context, plan, rows, in_staging, in_quarantine, ledger_rows, now, run_id)
    _leave_changed_files(table, interval, plan, rows, counts)
    try:
        committed = _commit_rows(context, plan, rows, in_quarantine, quarantine)
    finally:
        for done_with in rows.release:
            done_with()
    if committed is None:
        return None
    staged, staging_version, quarantined, quarantine_version = committed
    delta.inject_fault("stage:before_ledger_commit")
    _add_ledger_rows(plan, rows, ledger_rows, now, run_id)
    _append_ledger(paths.ledger, ledger_rows)
    counts.update(
        rows_read=sum(int(r["good"]) + int(r["bad"]) for r in rows.per_file),
        staged=staged,
        quarantined=quarantined,
        staging_version=staging_version,
        quarantine_version=quarantine_version,
    )
    return report


def _plan_stage(context: StepContext, interval: Interval) -> _StagePlan:
    """List the interval's landing and plan it against the ledger: the files to read, the entries
    refused; an extract out of order, or one with a changed or refused file, stops the run."""
    table, paths = context.table, context.paths
    is_snapshot = table.change_format == "snapshot"
    window = landing.listing_interval(interval, table.late_arrival, is_snapshot)
    listing = landing.list_landing(paths, window, table.file_format)
    ledger = landing.read_ledger(delta.arrow_table_rows(paths.ledger))
    files = landing.plan_files(listing, ledger)
    outside: list[LandingFile] = []
    if not is_snapshot:
        outside = landing.unknown_before(paths, window.start, table.file_format, ledger)
    pending, refusals = files.pending, list(files.refusals)
    staging = delta.load_snapshot(paths.staging)
    snapshot_batch = None
    if is_snapshot:
        _check_extract_files(table, interval, files.changed_versions, refusals)
    if pending and is_snapshot:
        batch_ledger = {e.batch for e in ledger.values() if e.refused is None}
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
            _check_extract_files(table, interval, [], parquet.refusals)
    refused = {(r.batch, r.file) for r in refusals}
    to_read = [f for f in to_read if f.ident not in refused]
    return _StagePlan(
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


def _count_planned(counts: dict[str, Any], plan: _StagePlan) -> None:
    """The run's counts as planned (rows and versions are counted when they are written)."""
    counts.update(
        files=len(plan.listing.files),
        new_files=len(plan.pending) + len(plan.files.refused_files()),
        rows_read=0,
        staged=0,
        quarantined=0,
        files_refused=len([r for r in plan.refusals if r.source is not None]),
        symlinks_refused=plan.files.links,
        unrecognised_entries=len(plan.listing.unrecognised),
        files_deferred=len(plan.files.deferred),
        files_outside_window=len(plan.outside_window),
    )


def _read_planned(
    context: StepContext,
    interval: Interval,
    plan: _StagePlan,
    in_staging: set[tuple[str, str]],
    counts: dict[str, Any],
) -> _StageRows:
    """Read and type the planned files. When Spark cannot read a Parquet batch, the files it cannot
    read are found one by one, refused (added to the plan's refusals) and the rest read again."""
    spark, table = context.spark, context.table
    rows = _StageRows()
    if plan.to_read:
        read_args = (interval, plan.staging, plan.snapshot_batch, in_staging, counts)
        try:
            rows.good, rows.bad, rows.per_file, rows.release = _typed_changes(
                context, plan.to_read, plan.parquet, *read_args
            )
        except CdcError:
            raise
        except Exception as error:
            if table.file_format != "parquet":
                raise
            unreadable = _files_spark_cannot_read(spark, plan.to_read, error)
            if table.change_format == "snapshot":
                _check_extract_files(table, interval, [], unreadable)
            plan.refusals += unreadable
            plan.refused |= {(r.batch, r.file) for r in unreadable}
            plan.to_read = [f for f in plan.to_read if f.ident not in plan.refused]
            counts["files_refused"] += len(unreadable)
            for refusal in unreadable:
                warn(
                    f"table {table.name}: {interval}: file {refusal.relative} refused "
                    f"(quarantined): {refusal.reason}"
                )
            plan.parquet = landing.plan_parquet(plan.to_read, table.columns, table.flag_source)
            rows.good, rows.bad, rows.per_file, rows.release = (
                _typed_changes(context, plan.to_read, plan.parquet, *read_args)
                if plan.to_read
                else (None, None, [], [])
            )
    return rows


def _settle_crashed_run(
    context: StepContext,
    plan: _StagePlan,
    rows: _StageRows,
    in_staging: set[tuple[str, str]],
    in_quarantine: set[tuple[str, str]],
    ledger_rows: list[dict[str, Any]],
    now: datetime,
    run_id: str,
) -> None:
    """Change files only: settle the file versions a crashed run left in staging or quarantine
    but not in the ledger (their rows dropped from `rows`, their ledger rows added)."""
    if rows.good is not None and rows.bad is not None and plan.snapshot_batch is None:
        # A crash between the staging, quarantine and ledger commits leaves file versions in
        # staging or quarantine that the ledger does not know; their file may have changed since.
        settled = _settle_unrecorded(
            context,
            plan.ledger,
            plan.pending,
            rows.good,
            rows.bad,
            rows.per_file,
            in_staging,
            in_quarantine,
            plan.files,
            plan.refused,
        )
        rows.good, rows.bad, rows.per_file, plan.pending = (
            settled.good,
            settled.bad,
            settled.per_file,
            settled.pending,
        )
        ledger_rows += [
            landing.ledger_row(None, batch, file, staged_rows, quarantined_rows, None, now, run_id)
            for batch, file, staged_rows, quarantined_rows in settled.recorded
        ]


def _leave_changed_files(
    table: TableConfig,
    interval: Interval,
    plan: _StagePlan,
    rows: _StageRows,
    counts: dict[str, Any],
) -> None:
    """Drop the rows of files that changed while Spark read them: the next run stages their next
    version (a changed extract file stops the run instead)."""
    if rows.good is not None and rows.bad is not None:
        # A file that changed while Spark read it is left for the next run (its next version).
        changed = [f for f in plan.to_read if landing.has_changed(f)]
        if changed and plan.snapshot_batch is not None:
            raise InputError(
                f"table {table.name}: {interval}: the extract file {changed[0].relative} changed "
                "while it was read; nothing was staged: rerun the interval once it is complete"
            )
        moved = [f for f in plan.pending if f.path in {c.path for c in changed}]
        if moved:
            counts["files_deferred"] += len(moved)
            warn(
                f"table {table.name}: {interval}: files changed while they were read, left for "
                "the next run: " + _listed([f.relative for f in moved])
            )
            skipped = [f"{f.batch}/{f.file}" for f in moved]
            file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
            rows.good = rows.good.filter(~file_key.isin(skipped))
            rows.bad = rows.bad.filter(~file_key.isin(skipped))
            rows.per_file = [r for r in rows.per_file if f"{r[BATCH]}/{r[FILE]}" not in skipped]
            plan.pending = [f for f in plan.pending if f"{f.batch}/{f.file}" not in skipped]


def _commit_rows(
    context: StepContext,
    plan: _StagePlan,
    rows: _StageRows,
    in_quarantine: set[tuple[str, str]],
    quarantine: delta.Snapshot,
) -> tuple[int, int, int, int] | None:
    """Append the good rows to staging, then the bad rows and the new refusals to quarantine:
    (rows staged, staging version, rows quarantined, quarantine version); None when another
    run staged first (nothing was committed: plan again)."""
    spark, table, paths = context.spark, context.table, context.paths
    good, bad = rows.good, rows.bad
    new_refusals = [r for r in plan.refusals if (r.batch, r.file) not in in_quarantine]
    if good is not None:
        appended = _commit_staging(paths.staging, good, plan.staging)
        if appended is None:
            return None
        staged, staging_version = appended
    else:
        staged, staging_version = 0, plan.staging.version
    schema = bad.schema if bad is not None else _quarantine_schema(table, quarantine)
    if not new_refusals and not any(int(r["bad"]) for r in rows.per_file):
        # Nothing to quarantine (the per-file counts say so): no Spark job, no commit; the
        # table is created if it is missing, as an append of no rows did.
        delta.ensure_table(paths.quarantine, schema, [BATCH])
        return staged, staging_version, 0, delta.load_snapshot(paths.quarantine).version
    if new_refusals or bad is None:
        refused_rows = _refusal_rows(spark, new_refusals, schema)
        bad = refused_rows if bad is None else bad.unionByName(refused_rows)
    _evolve_quarantine(spark, paths.quarantine, bad.schema)
    quarantined, quarantine_version = _commit_append(
        paths.quarantine, bad, [BATCH], "quarantine", "stage:before_quarantine_commit"
    )
    return staged, staging_version, quarantined, quarantine_version


def _add_ledger_rows(
    plan: _StagePlan,
    rows: _StageRows,
    ledger_rows: list[dict[str, Any]],
    now: datetime,
    run_id: str,
) -> None:
    """The ledger rows of the files read (their row counts), of the pending files that gave no
    rows, and of the refusals."""
    by_ident = {f.ident: f for f in plan.pending}
    ledger_rows += [
        landing.ledger_row(
            by_ident.get((r[BATCH], r[FILE])),
            r[BATCH],
            r[FILE],
            int(r["good"]),
            int(r["bad"]),
            None,
            now,
            run_id,
            datetime.fromisoformat(r[NEWEST]).replace(tzinfo=UTC) if r.get(NEWEST) else None,
        )
        for r in rows.per_file
        if (r[BATCH], r[FILE]) in by_ident
    ]
    done = {(r[BATCH], r[FILE]) for r in rows.per_file}
    ledger_rows += [
        landing.ledger_row(f, f.batch, f.file, 0, 0, None, now, run_id)
        for f in plan.pending
        if f.ident not in done and f.ident not in plan.refused
    ]
    ledger_rows += [
        landing.ledger_row(r.source, r.batch, r.file, 0, 1, r.reason, now, run_id)
        for r in plan.refusals
    ]


def _typed_changes(
    context: StepContext,
    to_read: Sequence[LandingFile],
    parquet: ParquetPlan | None,
    interval: Interval,
    staging: delta.Snapshot,
    snapshot_batch: str | None,
    in_staging: set[tuple[str, str]],
    counts: dict[str, Any],
) -> tuple[DataFrame, DataFrame, list[dict[str, Any]], list[Callable[[], Any]]]:
    """Read and type the files: (good rows, bad rows, per-file counts, frames to unpersist).

    Good rows of files already in staging are dropped for a snapshot extract only; for change
    files `_settle_unrecorded` decides (the file may have changed since)."""
    spark, table, paths = context.spark, context.table, context.paths
    read, raw = _read_files(context, to_read, parquet, interval, snapshot_batch, counts)
    is_snapshot = table.change_format == "snapshot"
    flag_present = not is_snapshot and table.flag_source in raw.columns
    if not flag_present and not table.insert_only and not is_snapshot:
        raise InputError(
            f"table {table.name}: the change files of {interval} have no flag column {table.flag_column}"
        )
    policy = table.on_schema_change if table.columns is None else "evolve"
    plan = plan_schema(table_column_types(table, staging), read.batch_types, policy)
    if plan.refused:
        _refuse_schema(context, interval, to_read, read, raw, flag_present, plan.refused)
    column_types = plan.columns
    if table.columns is None and not staging.exists:
        _check_identity_columns(table, read.batch_types)
    typed, per_file = _typed_rows(table, read, raw, column_types, flag_present, is_snapshot)
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    columns = staging_columns(table, column_types)
    release: list[Callable[[], Any]] = [typed.unpersist]
    if ABSENT not in columns and staging.schema is not None and ABSENT in staging.schema.names:
        # ignore_null_updates turned off: staging keeps the column; new rows carry every value.
        typed = typed.withColumn(ABSENT, F.lit(None).cast("array<string>"))
        columns.insert(columns.index(FLAG) + 1, ABSENT)
    if plan.changes and staging.exists:
        changed = delta.evolve_table(spark, paths.staging, typed.select(*columns).schema)
        counts.update(columns_added=len(plan.added), columns_widened=len(plan.widened))
        warn(f"table {table.name}: {interval}: staging schema evolved: {', '.join(changed)}")
    elif staging.schema is not None and not set(columns) <= set(staging.schema.fieldNames()):
        # A staging table from before `_cdc_absent` existed gains it (metadata only).
        delta.evolve_table(spark, paths.staging, typed.select(*columns).schema)
    good = good_changes(typed, columns)
    if snapshot_batch is not None:
        held = typed.filter(F.col(REASON).isNotNull())  # quarantined rows whose key is known
        for key in table.keys:
            held = held.filter(F.col(key).isNotNull())
        derived, operations = extracts.derive_changes(context, good, held, snapshot_batch, columns)
        counts.update(operations)
        good = derived
        release.append(derived.unpersist)
        good = good.filter(~file_key.isin([f"{b}/{n}" for b, n in in_staging]))
    bad = quarantined_changes(typed, table, column_types)
    release.append(read.release)
    return good, bad, per_file, release


def _check_identity_columns(table: TableConfig, found: dict[str, str | None]) -> None:
    """keys and sequence_by name columns of the data: without declared `columns`, `cdc validate`
    cannot know them, so the first batch with any column checks them (a ConfigError naming the
    field and the columns there are, before anything is written; every row would otherwise be
    quarantined for a null key or sequence, run after run)."""
    data = [c for c in found if not c.startswith("_cdc_")]
    if not data:
        return  # nothing readable yet: the rows are quarantined with their own reasons
    for field_name, names in (("keys", table.keys), ("sequence_by", table.sequence_by)):
        missing = [c for c in names if c not in found]
        if missing:
            raise ConfigError(
                f"table {table.name}: {field_name}: {', '.join(missing)} is not a column of the "
                f"data (its columns: {', '.join(data)}); name columns the change files carry"
            )


def _read_files(
    context: StepContext,
    to_read: Sequence[LandingFile],
    parquet: ParquetPlan | None,
    interval: Interval,
    snapshot_batch: str | None,
    counts: dict[str, Any],
) -> tuple[ChangeRead, DataFrame]:
    """The files' rows as read, with their arrival (a new version's file name, an extract's
    time); the fields the config ignores are counted and named."""
    spark, table = context.spark, context.table
    read = read_landing(spark, table, to_read, parquet)
    raw = read.frame
    versions = {(f.batch, f.name): f.file for f in to_read if f.is_new_version}
    if versions:
        raw = raw.withColumn(FILE, _arrival_names(versions))
    if snapshot_batch is not None:
        raw = raw.withColumn(extracts.SNAPSHOT_AT, extracts.snapshot_time(F.col(BATCH)))
        read.batch_types[extracts.SNAPSHOT_AT] = "timestamp"
    counts.update(read.ignored)
    if read.undeclared:
        counts["undeclared_columns_ignored"] = len(read.undeclared)
        warn(
            f"table {table.name}: {interval}: columns not in the config row are ignored: "
            + ", ".join(read.undeclared)
        )
    return read, raw


def _refuse_schema(
    context: StepContext,
    interval: Interval,
    to_read: Sequence[LandingFile],
    read: ChangeRead,
    raw: DataFrame,
    flag_present: bool,
    refused: list[str],
) -> None:
    """Quarantine the batch whose schema cannot be applied, and fail the step (`refuse_batch`)."""
    spark, paths = context.spark, context.paths
    quarantine = delta.load_snapshot(paths.quarantine)
    batches = sorted({f.batch for f in to_read})
    read.frame = raw
    refuse_batch(
        context,
        interval,
        read,
        flag_present,
        refused,
        _files_in(spark, quarantine, batches),
    )


def _typed_rows(
    table: TableConfig,
    read: ChangeRead,
    raw: DataFrame,
    column_types: dict[str, str],
    flag_present: bool,
    is_snapshot: bool,
) -> tuple[DataFrame, list[dict[str, Any]]]:
    """The typed rows (persisted; an extract's with their hashes) and each file's count of good
    and bad rows. A partition_expression Spark cannot analyse is a ConfigError."""
    try:
        typed = type_changes(raw, table, column_types, flag_present)
        if is_snapshot:
            typed = extracts.with_hashes(typed, table, list(column_types))
        typed = typed.persist()
        try:
            # The first action over the rows: a file Spark cannot read fails here, before any
            # write.
            per_file = [
                r.asDict()
                for r in typed.groupBy(BATCH, FILE)
                .agg(
                    F.sum(F.when(F.col(REASON).isNull(), 1).otherwise(0)).alias("good"),
                    F.sum(F.when(F.col(REASON).isNotNull(), 1).otherwise(0)).alias("bad"),
                    _newest_change(table, column_types).alias(NEWEST),
                )
                .collect()  # metadata: one row per file
            ]
        except Exception:
            typed.unpersist()
            read.release()
            raise
    except AnalysisException as error:
        message = str(error).strip().splitlines()[0]
        raise ConfigError(f"table {table.name}: partition_expression: {message}") from None
    return typed, per_file


def _newest_change(table: TableConfig, column_types: dict[str, str]) -> Column:
    """Newest value of the first sequence column among a file's good rows, when it is a time or
    a date (the ledger keeps it: freshness by data); null otherwise."""
    column = table.sequence_by[0]
    kind = column_types.get(column, "")
    if kind not in ("timestamp", "timestamp_ntz", "date") or column not in column_types:
        return F.lit(None).cast("string")
    # As text in the session's time zone (UTC): a Python datetime would take the driver's zone.
    newest = F.max(F.when(F.col(REASON).isNull(), F.col(quoted(column)).cast("timestamp")))
    return F.date_format(newest, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")


def _files_spark_cannot_read(
    spark: SparkSession, files: Sequence[LandingFile], error: Exception
) -> list[Refusal]:
    """The Parquet files whose data Spark cannot read on their own: one full read of each (only
    after the whole hour's read failed); re-raises `error` when every file reads alone."""
    refusals = []
    for landing_file in files:
        try:
            # The noop sink reads every row of every column and writes nothing.
            frame = spark.read.parquet(landing.spark_path(landing_file.path))
            frame.write.format("noop").mode("overwrite").save()
        except Exception as own:
            reason = (
                f"unreadable Parquet file {landing_file.name} ({landing_file.size} bytes): its "
                f"footer reads but its data does not ({_spark_cause(own)})"
            )
            refusals.append(
                Refusal(
                    landing_file.batch,
                    landing_file.file,
                    landing_file.relative,
                    reason,
                    landing_file,
                )
            )
    if not refusals:
        raise error
    return refusals


def _spark_cause(error: Exception) -> str:
    """The innermost cause a Spark error names, in a few words (never a path or a trace)."""
    text = str(error)
    causes = re.findall(r"Caused by: ([\w.$]+(?:Exception|Error))(?:: ([^\n]*))?", text)
    if causes:
        kind, message = causes[-1]
        short = kind.rsplit(".", 1)[-1]
        message = re.sub(r"(file:)?/\S+", "<file>", message or "").strip()
        return f"{short}: {message}"[:200].rstrip(": ")
    error_class = re.search(r"\[([A-Z_.]+)\]", text)
    return error_class.group(1) if error_class else type(error).__name__


@dataclass
class Settled:
    """Change rows after the versions an earlier, crashed run left unrecorded were settled."""

    good: DataFrame
    bad: DataFrame
    per_file: list[dict[str, Any]]
    pending: list[LandingFile]
    recorded: list[tuple[str, str, int, int]] = field(default_factory=list)  # for the ledger


def _settle_unrecorded(
    context: StepContext,
    ledger: dict[tuple[str, str], landing.LedgerEntry],
    pending: list[LandingFile],
    good: DataFrame,
    bad: DataFrame,
    per_file: list[dict[str, Any]],
    in_staging: set[tuple[str, str]],
    in_quarantine: set[tuple[str, str]],
    files: landing.FilePlan,
    refused: set[tuple[str, str]],
) -> Settled:
    """Drop the rows staging or quarantine already hold, and give changed files a new version.

    Staging commits before quarantine, and both before the ledger. A run killed in between leaves
    a file version in staging (and maybe quarantine) that the ledger does not know. When the file
    still holds the same rows, this run's copy is dropped table by table; when it changed since,
    it is a new version (numbered after every version the tables hold), never mistaken for the
    one already staged; the unrecorded version gets its ledger row (content unknown). A version
    only quarantine holds (a file without good rows, or a batch refused for its schema) keeps
    its identity; its rows are dropped when quarantine holds exactly them. The rows are compared
    only on this recovery path (a few actions per file)."""
    spark, paths = context.spark, context.paths
    settled = Settled(good, bad, per_file, list(pending))
    staged_unrecorded = in_staging - set(ledger)
    quarantined_unrecorded = in_quarantine - set(ledger)
    if not staged_unrecorded and not quarantined_unrecorded:
        return settled
    renames: dict[tuple[str, str], str] = {}
    skip_staging: set[tuple[str, str]] = set()
    skip_quarantine: set[tuple[str, str]] = set()
    recorded: set[tuple[str, str]] = set()
    staging = delta.load_snapshot(paths.staging)
    quarantine = delta.load_snapshot(paths.quarantine)
    held = in_staging | in_quarantine
    for index, landing_file in enumerate(settled.pending):
        if landing_file.ident in refused:
            continue
        crashed = sorted(
            (
                file
                for batch, file in staged_unrecorded
                if batch == landing_file.batch
                and landing.split_version(file)[0] == landing_file.name
            ),
            key=lambda file: landing.split_version(file)[1],
        )
        if not crashed:
            if landing_file.ident in quarantined_unrecorded and _holds_same_rows(
                spark, quarantine, bad, landing_file, landing_file.file
            ):
                skip_quarantine.add(landing_file.ident)
            continue
        last = crashed[-1]
        ident = (landing_file.batch, last)
        same = _holds_same_rows(spark, staging, good, landing_file, last) and (
            ident not in in_quarantine
            or _holds_same_rows(spark, quarantine, bad, landing_file, last)
        )
        if same:
            target = last
            skip_staging.add(ident)
            if ident in in_quarantine:
                skip_quarantine.add(ident)
            recorded |= {(landing_file.batch, file) for file in crashed[:-1]}
        else:
            taken = landing.latest_sequence(f for b, f in held if b == landing_file.batch)
            sequence = max(files.sequences.get(landing_file.batch, 0), taken) + 1
            files.sequences[landing_file.batch] = sequence
            target = landing.versioned_name(landing_file.name, sequence)
            recorded |= {(landing_file.batch, file) for file in crashed}
        if target != landing_file.file:
            renames[landing_file.ident] = target
            arrival = None if target == landing_file.name else target
            settled.pending[index] = replace(landing_file, arrival=arrival)
    if renames:
        settled.good = settled.good.withColumn(FILE, _arrival_names(renames))
        settled.bad = settled.bad.withColumn(FILE, _arrival_names(renames))
        settled.per_file = [
            {**r, FILE: renames.get((r[BATCH], r[FILE]), r[FILE])} for r in settled.per_file
        ]
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    if skip_staging:
        settled.good = settled.good.filter(~file_key.isin([f"{b}/{f}" for b, f in skip_staging]))
    if skip_quarantine:
        settled.bad = settled.bad.filter(~file_key.isin([f"{b}/{f}" for b, f in skip_quarantine]))
    in_tables = (
        _row_counts(spark, staging, sorted(recorded)),
        _row_counts(spark, quarantine, sorted(recorded)),
    )
    settled.recorded = [
        (batch, file, in_tables[0].get((batch, file), 0), in_tables[1].get((batch, file), 0))
        for batch, file in sorted(recorded)
    ]
    return settled


def _holds_same_rows(
    spark: SparkSession,
    snapshot: delta.Snapshot,
    rows: DataFrame,
    landing_file: LandingFile,
    held_as: str,
) -> bool:
    """Whether the table holds, as `held_as`, exactly the rows (as text) this run read from the
    file."""
    current = rows.filter(
        (F.col(BATCH) == landing_file.batch) & (F.col(FILE) == landing_file.file)
    ).withColumn(FILE, F.lit(held_as))
    if snapshot.schema is None:
        return current.limit(1).count() == 0
    # Not the reason: a max_sequence_ahead reason names the time of its run.
    columns = [c for c in current.columns if c in snapshot.schema.fieldNames() and c != REASON]
    stored = delta.read_snapshot(
        spark, snapshot, partitions=[landing_file.batch], columns=columns
    ).filter(F.col(FILE) == held_as)
    as_text = [F.col(quoted(c)).cast("string").alias(c) for c in columns]
    mine, theirs = current.select(*as_text), stored.select(*as_text)
    return mine.exceptAll(theirs).limit(1).count() == 0 and (
        theirs.exceptAll(mine).limit(1).count() == 0
    )


def _row_counts(
    spark: SparkSession, snapshot: delta.Snapshot, idents: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """Rows a staging-like table holds for each (batch, file)."""
    if not idents or not snapshot.exists:
        return {}
    batches = sorted({b for b, _ in idents})
    if not snapshot.files_in(batches):
        return {}
    frame = delta.read_snapshot(spark, snapshot, partitions=batches, columns=[BATCH, FILE])
    keys = [f"{b}/{f}" for b, f in idents]
    rows = (
        frame.filter(F.concat_ws("/", F.col(BATCH), F.col(FILE)).isin(keys))
        .groupBy(BATCH, FILE)
        .count()
        .collect()  # metadata: one row per file
    )
    return {(r[BATCH], r[FILE]): int(r["count"]) for r in rows}


def _arrival_names(versions: dict[tuple[str, str], str]) -> Column:
    """`_cdc_file` of later versions of a file: `name~v002`, ... (so they rank after the first)."""
    column = F.col(FILE)
    for (batch, name), file in versions.items():
        column = F.when((F.col(BATCH) == batch) & (F.col(FILE) == name), F.lit(file)).otherwise(
            column
        )
    return column


def _check_extract_files(
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


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _warn_landing(
    table: TableConfig,
    interval: Interval,
    listing: landing.Listing,
    files: landing.FilePlan,
    refusals: Sequence[Refusal],
) -> None:
    """One warning line per kind of landing problem (the summary counts them)."""
    where = f"table {table.name}: {interval}"
    if listing.unrecognised:
        warn(
            f"{where}: not in the landing layout dt=YYYY-MM-DD/hr=HH/*"
            f"{'|'.join(landing.EXTENSIONS[table.file_format])}, never read: "
            + _listed(listing.unrecognised)
        )
    if listing.links:
        warn(
            f"{where}: symbolic links refused, never followed: "
            + _listed([link.relative for link in listing.links])
        )
    if files.deferred:
        warn(
            f"{where}: files changing while listed, left for the next run: "
            + _listed([f.relative for f in files.deferred])
        )
    for refusal in refusals:
        if refusal.source is not None:
            warn(f"{where}: file {refusal.relative} refused (quarantined): {refusal.reason}")


def _warn_outside_window(
    table: TableConfig, interval: Interval, outside: Sequence[LandingFile]
) -> None:
    """Files landed in hour folders older than the late-arrival window are never staged silently:
    one warning naming them and the command that applies them."""
    if not outside:
        return
    oldest = min(f.batch for f in outside)
    start = f"{oldest[:10]}T{oldest[11:]}:00:00Z"
    warn(
        f"table {table.name}: {interval}: {len(outside)} file(s) landed in hour folders older than "
        f"the late_arrival_window ({table.late_arrival_window}), not staged: "
        + _listed([f.relative for f in outside])
        + f"; apply them with `cdc run {table.name} --start {start} --end "
        f"{interval.end.strftime('%Y-%m-%dT%H:%M:%SZ')}` or widen late_arrival_window"
    )


def _quarantine_schema(table: TableConfig, quarantine: delta.Snapshot) -> StructType:
    """The quarantine's columns, for file-level rows when no row was read."""
    if quarantine.schema is not None:
        return quarantine.schema
    text = [*(table.columns or {}), table.flag_source, RAW, REASON, BATCH, FILE]
    fields = [StructField(c, StringType(), True) for c in text]
    return StructType([*fields, StructField(ROW, LongType(), True)])


def _refusal_rows(
    spark: SparkSession, refusals: Sequence[Refusal], schema: StructType
) -> DataFrame:
    """One quarantine row per refused entry: null data, the path in `_cdc_raw`, the reason."""
    values = {RAW: "relative", REASON: "reason", BATCH: "batch", FILE: "file"}
    rows = [
        tuple(getattr(r, values[f.name]) if f.name in values else None for f in schema.fields)
        for r in refusals
    ]
    return delta.local_frame(spark, rows, schema)


def _append_ledger(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows to the ledger; an older ledger gains the content columns (merged schema)."""
    delta.append_arrow(path, pa.Table.from_pylist(rows, landing.LEDGER_SCHEMA))


def warn(message: str) -> None:
    """A warning line on stderr (the task log); the summary line stays the one line on stdout."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _evolve_quarantine(spark: SparkSession, path: Path, incoming: StructType) -> None:
    """Quarantine keeps every column as text: add the columns a batch brings (never narrows)."""
    snapshot = delta.load_snapshot(path)
    if snapshot.schema is None:
        return
    known = set(snapshot.schema.fieldNames())
    new = [f for f in incoming.fields if f.name not in known]
    if new:
        delta.evolve_table(spark, path, StructType(new))


def refuse_batch(
    context: StepContext,
    interval: Interval,
    read: ChangeRead,
    flag_present: bool,
    problems: list[str],
    in_quarantine: set[tuple[str, str]],
) -> None:
    """Quarantine every row of a batch whose schema cannot be applied, then fail the step.

    Staging and final are not touched and the files are not recorded as staged, so once the
    config row says how to read them (columns, on_schema_change) a rerun stages them.
    """
    spark, table, paths = context.spark, context.table, context.paths
    batch_types = {name: kind or "string" for name, kind in read.batch_types.items()}
    reason = "schema change refused: " + "; ".join(problems)
    typed = type_changes(read.frame, table, batch_types, flag_present).withColumn(
        REASON, F.lit(reason)
    )
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    rows = quarantined_changes(typed, table, batch_types).filter(
        ~file_key.isin([f"{b}/{n}" for b, n in in_quarantine])
    )
    _evolve_quarantine(spark, paths.quarantine, rows.schema)
    quarantined, _ = _commit_append(
        paths.quarantine, rows, [BATCH], "quarantine", "stage:before_quarantine_commit"
    )
    raise InputError(
        f"table {table.name}: {interval}: {reason}. The batch's rows are in quarantine "
        f"({quarantined} new); staging and final are unchanged. Declare the column types in "
        "the config row's columns, then rerun the interval"
    )


def stage_step(context: StepContext, args: StepArgs) -> StepReport:
    """`cdc stage` body."""
    return run_stage(context, args.interval())


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: stage TABLE --start TS --end TS."""
    return run_step("stage", argv)


if __name__ == "__main__":
    sys.exit(main())
