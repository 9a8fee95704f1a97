"""The typed rows of a stage run: read the planned files, settle their schema against staging's
(evolve, or refuse the batch), type every value and split the rows to staging and quarantine."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.columns import TECHNICAL_PREFIX
from cdc_pipeline.config import EVENT_FORMATS, TableConfig
from cdc_pipeline.counts import StageCounts
from cdc_pipeline.errors import CdcError, ConfigError, InputError
from cdc_pipeline.intervals import Interval
from cdc_pipeline.schema import plan_schema
from spark_jobs import delta, landing
from spark_jobs.formats import snapshot as extracts
from spark_jobs.formats.json_lines import ChangeRead
from spark_jobs.formats.reading import undeclared_names
from spark_jobs.landing import LandingFile, ParquetPlan
from spark_jobs.rules.transforms import (
    ABSENT,
    ARRIVAL,
    BATCH,
    FILE,
    FLAG,
    REASON,
    UNDECLARED,
    good_changes,
    persisted,
    quarantined_changes,
    quoted,
    type_changes,
    unpersist_quietly,
)
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.session import plan_run
from spark_jobs.staging.commit import refuse_batch
from spark_jobs.staging.notices import warn
from spark_jobs.staging.plan import StagePlan, StageRows, check_extract_files, files_in
from spark_jobs.staging.readers import (
    arrival_names,
    files_spark_cannot_read,
    read_in_one_task,
    read_landing,
)

NEWEST = "newest_change"  # per-file count: the newest sequence time among its good rows


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


def read_planned(
    context: StepContext,
    interval: Interval,
    plan: StagePlan,
    in_staging: set[tuple[str, str]],
) -> StageRows:
    """Read and type the planned files. When Spark cannot read a Parquet batch, the files it cannot
    read are found one by one, refused (the rows' plan has them among its refusals) and the rest
    read again."""
    spark, table = context.spark, context.table
    if not plan.to_read:
        return StageRows(plan)
    try:
        return _typed_changes(context, interval, plan, in_staging)
    except CdcError:
        raise
    except Exception as error:
        if table.file_format != "parquet":
            raise
        unreadable = files_spark_cannot_read(spark, plan.to_read, error)
    if table.change_format == "snapshot":
        check_extract_files(table, interval, [], unreadable)
    refused = plan.refused | {(r.batch, r.file) for r in unreadable}
    to_read = [f for f in plan.to_read if f.ident not in refused]
    plan = replace(
        plan,
        refusals=[*plan.refusals, *unreadable],
        refused=refused,
        to_read=to_read,
        parquet=landing.plan_parquet(to_read, table.columns, table.flag_source),
    )
    for refusal in unreadable:
        warn(
            f"table {table.name}: {interval}: file {refusal.relative} refused "
            f"(quarantined): {refusal.reason}"
        )
    if not plan.to_read:
        return StageRows(plan)
    return _typed_changes(context, interval, plan, in_staging)


@dataclass(frozen=True)
class TypedRead:
    """A read's rows typed against staging: all of them (persisted), the good and the bad, the
    staging columns, each source's (file's) counts, what reading found, what to release."""

    typed: DataFrame
    good: DataFrame
    bad: DataFrame
    columns: list[str]
    per_file: list[dict[str, Any]]
    found: StageCounts
    release: list[Callable[[], Any]]


def type_read(
    context: StepContext,
    interval: Interval,
    read: ChangeRead,
    raw: DataFrame,
    staging: delta.Snapshot,
    batches: Sequence[str],
    *,
    small: bool = False,
) -> TypedRead:
    """Settle the read's schema against staging's (evolve it, or refuse the batch: `batches` are
    the staging partitions the refused rows are quarantined under), type every value and split
    the rows to staging and quarantine. Landed files and Kafka messages both come through here.
    `small`: few enough rows for one task (no shuffle before the counts: two Spark jobs fewer)."""
    spark, table, paths = context.spark, context.table, context.paths
    is_snapshot = table.change_format == "snapshot"
    # The read's columns as its reader built them, when `raw` is its frame (no request to Spark).
    columns = read.columns if raw is read.frame and read.columns is not None else raw.columns
    flag_present = not is_snapshot and table.flag_source in columns
    if not flag_present and not table.insert_only and not is_snapshot:
        raise InputError(
            f"table {table.name}: the changes of {interval} have no flag column {table.flag_column}"
        )
    policy = table.on_schema_change if table.columns is None else "evolve"
    schema = plan_schema(table_column_types(table, staging), read.batch_types, policy)
    if schema.refused:
        _refuse_schema(
            context,
            interval,
            batches=batches,
            read=read,
            raw=raw,
            flag_present=flag_present,
            refused=schema.refused,
        )
    column_types = schema.columns
    if table.columns is None and not staging.exists:
        _check_identity_columns(table, read.batch_types)
    if small:
        raw = raw.coalesce(1)  # one partition: the counts group it without a shuffle
    typed, per_file, cached = _typed_rows(
        table, read, raw, column_types, columns, flag_present=flag_present, small=small
    )
    found = _read_counts(table, interval, read, per_file)
    columns = staging_columns(table, column_types)
    release: list[Callable[[], Any]] = [typed.unpersist] if cached else []
    if ABSENT not in columns and staging.schema is not None and ABSENT in staging.schema.names:
        # ignore_null_updates turned off: staging keeps the column; new rows carry every value.
        typed = typed.withColumn(ABSENT, F.lit(None).cast("array<string>"))
        columns.insert(columns.index(FLAG) + 1, ABSENT)
    if schema.changes and staging.exists:
        changed = delta.evolve_table(spark, paths.staging, typed.select(*columns).schema)
        found = replace(found, columns_added=len(schema.added), columns_widened=len(schema.widened))
        warn(f"table {table.name}: {interval}: staging schema evolved: {', '.join(changed)}")
    elif staging.schema is not None and not set(columns) <= set(staging.schema.fieldNames()):
        # A staging table from before `_cdc_absent` existed gains it (metadata only).
        delta.evolve_table(spark, paths.staging, typed.select(*columns).schema)
    good = good_changes(typed, columns)
    bad = quarantined_changes(typed, table, column_types)
    return TypedRead(typed, good, bad, columns, per_file, found, release)


def _typed_changes(
    context: StepContext,
    interval: Interval,
    plan: StagePlan,
    in_staging: set[tuple[str, str]],
) -> StageRows:
    """Read and type the plan's files: good rows, bad rows, per-file counts, frames to unpersist,
    and what the reading found (`StageRows.found`).

    Good rows of files already in staging are dropped for a snapshot extract only; for change
    files `recovery.settle_unrecorded` decides (the file may have changed since)."""
    to_read, snapshot_batch = plan.to_read, plan.snapshot_batch
    read, raw = _read_files(context, to_read, plan.parquet, snapshot_batch)
    batches = sorted({f.batch for f in to_read})
    small = read_in_one_task(to_read)
    plan_run(context.spark, small=small)
    done = type_read(context, interval, read, raw, plan.staging, batches, small=small)
    good, found, release = done.good, done.found, done.release
    if snapshot_batch is not None:
        held = done.typed.filter(F.col(REASON).isNotNull())  # quarantined rows whose key is known
        for key in context.table.keys:
            held = held.filter(F.col(key).isNotNull())
        derived, operations = extracts.derive_changes(
            context, good, held, snapshot_batch, done.columns
        )
        found = replace(found, operations=operations)
        good = derived
        release.append(derived.unpersist)
        file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
        good = good.filter(~file_key.isin([f"{b}/{n}" for b, n in in_staging]))
    release.append(read.release)
    return StageRows(plan, good, done.bad, done.per_file, release, found=found)


def _read_counts(
    table: TableConfig, interval: Interval, read: ChangeRead, per_file: list[dict[str, Any]]
) -> StageCounts:
    """What the reading skipped and ignored; the undeclared columns are named in a warning.
    Rows that carry their undeclared keys have them in `per_file` (taken out of it here)."""
    if read.carries_undeclared:
        read.undeclared = undeclared_names(k for r in per_file for k in r.pop(UNDECLARED) or [])
    if read.undeclared:
        warn(
            f"table {table.name}: {interval}: columns not in the config row are ignored: "
            + ", ".join(read.undeclared)
        )
    return StageCounts(
        skipped=read.ignored or None, undeclared_columns_ignored=len(read.undeclared) or None
    )


def _check_identity_columns(table: TableConfig, found: dict[str, str | None]) -> None:
    """keys and sequence_by name columns of the data: without declared `columns`, `cdc validate`
    cannot know them, so the first batch with any column checks them (a ConfigError naming the
    field and the columns there are, before anything is written; every row would otherwise be
    quarantined for a null key or sequence, run after run)."""
    data = [c for c in found if not c.startswith(TECHNICAL_PREFIX)]
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
    snapshot_batch: str | None,
) -> tuple[ChangeRead, DataFrame]:
    """The files' rows as read, with their arrival (a new version's file name, an extract's
    time)."""
    spark, table = context.spark, context.table
    read = read_landing(spark, table, to_read, parquet)
    raw = read.frame
    versions = {(f.batch, f.name): f.file for f in to_read if f.is_new_version}
    if versions:
        raw = raw.withColumn(FILE, arrival_names(versions))
    if snapshot_batch is not None:
        raw = raw.withColumn(extracts.SNAPSHOT_AT, extracts.snapshot_time(F.col(BATCH)))
        read.batch_types[extracts.SNAPSHOT_AT] = "timestamp"
    return read, raw


def _refuse_schema(
    context: StepContext,
    interval: Interval,
    *,
    batches: Sequence[str],
    read: ChangeRead,
    raw: DataFrame,
    flag_present: bool,
    refused: list[str],
) -> None:
    """Quarantine the batch whose schema cannot be applied, and fail the step (`refuse_batch`)."""
    spark, paths = context.spark, context.paths
    quarantine = delta.load_snapshot(paths.quarantine)
    read.frame = raw
    refuse_batch(
        context,
        interval,
        read,
        flag_present=flag_present,
        problems=refused,
        in_quarantine=files_in(spark, quarantine, batches),
    )


def _typed_rows(
    table: TableConfig,
    read: ChangeRead,
    raw: DataFrame,
    column_types: dict[str, str],
    columns: Sequence[str],
    *,
    flag_present: bool,
    small: bool,
) -> tuple[DataFrame, list[dict[str, Any]], bool]:
    """The typed rows (an extract's with their hashes), each file's count of good and bad rows,
    and whether the rows are persisted (to unpersist). A partition_expression Spark cannot
    analyse is a ConfigError.

    Every later query reads the rows as typed by ONE read of the files (a file rewritten
    meanwhile cannot give two contents): persisted in Spark's cache, or for a `small` run of
    change files (one task's), brought to the driver as Arrow by that read and handed back as a
    local relation. The cache costs a small run more than its rows: persisting plans the whole
    read (a request of its own), filling it is a Spark job of its own, and unpersisting is one
    more request."""
    is_snapshot = table.change_format == "snapshot"
    local = small and not is_snapshot
    try:
        typed = type_changes(raw, table, column_types, flag_present=flag_present, columns=columns)
        if is_snapshot:
            typed = extracts.with_hashes(typed, table, list(column_types))
        if not local:
            typed = persisted(typed)
        try:
            # The first action over the rows: a file Spark cannot read fails here, before any
            # write.
            per_file = None
            if local:
                rows, schema = delta.arrow_and_schema(typed)  # the rows of one task's files
                typed = delta.local_frame(typed.sparkSession, rows, schema)
                per_file = per_file_on_driver(table, rows, column_types, read)
            if per_file is None:  # one partition: no shuffle
                per_file = _per_file(
                    table, typed.coalesce(1) if local else typed, column_types, read
                )
        except Exception:
            if not local:
                unpersist_quietly(typed)
            with contextlib.suppress(Exception):  # the error that ended the step stands
                read.release()
            raise
    except AnalysisException as error:
        message = str(error).strip().splitlines()[0]
        raise ConfigError(f"table {table.name}: partition_expression: {message}") from None
    return typed, per_file, not local


def _per_file(
    table: TableConfig, typed: DataFrame, column_types: dict[str, str], read: ChangeRead
) -> list[dict[str, Any]]:
    """Each file's count of good and bad rows, its newest change and (JSON with declared
    columns) the keys outside them, from one Spark aggregate of the typed rows."""
    return [
        r.asDict()
        for r in typed.groupBy(BATCH, FILE)
        .agg(
            F.sum(F.when(F.col(REASON).isNull(), 1).otherwise(0)).alias("good"),
            F.sum(F.when(F.col(REASON).isNotNull(), 1).otherwise(0)).alias("bad"),
            _newest_change(table, column_types).alias(NEWEST),
            # (JSON, declared columns) the keys outside them, gathered in this pass
            *_undeclared_keys(read),
        )
        .collect()  # metadata: one row per file, and the undeclared keys' names
    ]


def per_file_on_driver(
    table: TableConfig, rows: pa.Table, column_types: dict[str, str], read: ChangeRead
) -> list[dict[str, Any]] | None:
    """The per-file counts of `_typed_rows`' Spark aggregate, from the rows already on the
    driver (a small run's): one query fewer a stage run (on a warm Connect server about 90 ms
    of its CPU and 70 ms of the step's wall time, 300 changes). None when a value is outside
    what Python's datetime holds: the Spark aggregate then counts them, as before."""
    good = pc.is_null(rows[REASON])
    parts: dict[str, Any] = {
        BATCH: rows[BATCH],
        FILE: rows[FILE],
        "good": pc.cast(good, pa.int64()),
        "bad": pc.cast(pc.invert(good), pa.int64()),
    }
    column, kind = table.sequence_by[0], column_types.get(table.sequence_by[0], "")
    timed = kind in ("timestamp", "timestamp_ntz", "date") and column in rows.column_names
    if timed:
        parts[NEWEST] = pc.if_else(good, rows[column], pa.scalar(None, rows[column].type))
    aggregates = [("good", "sum"), ("bad", "sum"), *([(NEWEST, "max")] if timed else [])]
    grouped = pa.table(parts).group_by([BATCH, FILE]).aggregate(aggregates)
    undeclared = _undeclared_on_driver(rows) if read.carries_undeclared else None
    per_file = []
    try:
        for row in grouped.to_pylist():
            newest = row.get(f"{NEWEST}_max")
            entry = {BATCH: row[BATCH], FILE: row[FILE]}
            entry.update(good=row["good_sum"], bad=row["bad_sum"], **{NEWEST: _as_text(newest)})
            if undeclared is not None:
                entry[UNDECLARED] = undeclared.get((row[BATCH], row[FILE]), [])
            per_file.append(entry)
    except (ValueError, OverflowError):  # a year Python's datetime does not hold
        return None
    return per_file


def _as_text(newest: Any) -> str | None:
    """A newest sequence value as `_newest_change` writes it: the UTC wall time, microseconds."""
    if newest is None:
        return None
    if isinstance(newest, datetime):
        newest = newest.astimezone(UTC).replace(tzinfo=None) if newest.tzinfo else newest
    else:  # a date: its midnight
        newest = datetime.combine(newest, datetime.min.time())
    return newest.isoformat(timespec="microseconds")


def _undeclared_on_driver(rows: pa.Table) -> dict[tuple[str, str], list[str]]:
    """Each file's distinct undeclared keys, from its rows' `UNDECLARED` lists."""
    lists = rows[UNDECLARED].combine_chunks()
    owners = pc.list_parent_indices(lists)
    keys = (
        pa.table(
            {
                BATCH: pc.take(rows[BATCH], owners),
                FILE: pc.take(rows[FILE], owners),
                "key": pc.list_flatten(lists),
            }
        )
        .group_by([BATCH, FILE, "key"])
        .aggregate([])
    )
    found: dict[tuple[str, str], list[str]] = {}
    for row in keys.to_pylist():
        if row["key"] is not None:
            found.setdefault((row[BATCH], row[FILE]), []).append(row["key"])
    return found


def _undeclared_keys(read: ChangeRead) -> list[Column]:
    """The distinct undeclared keys of a file's rows, when the rows carry them."""
    if not read.carries_undeclared:
        return []
    return [F.array_distinct(F.flatten(F.collect_set(UNDECLARED))).alias(UNDECLARED)]


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
