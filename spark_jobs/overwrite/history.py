"""`history: true`: an SCD type 2 table with one version per change of every key (seed 003).

Two Delta tables, both partitioned by a hash bucket of the key (`_cdc_key_bucket`), so all rows
of a key live in one partition that is found without a lookup:

- `{table}/history_log`: every applied change (the staged rows, delete flags included).
- `{table}/history`: the versions cut from the log. A version starts at a change whose tracked
  columns differ from the open version's (or that follows a delete); a change of untracked
  columns only updates the open version in place; a delete closes the open version
  (`_cdc_is_deleted`); the version a later change closes ends at that change's sequence.

overwrite-final appends the interval's changes to the log, then recuts every key of the buckets
they touch from the whole log and replaces those buckets in one commit. Cutting from the full
log is what makes any order right: a late change is spliced between the versions around it,
duplicates collapse (an identical change does not differ from the open version), several changes
of a key in one batch each become a version, and a rerun cuts the same versions.

A step with nothing new commits nothing: when the log already holds every change of the interval
(a rerun), the buckets' versions are cut and compared with what history holds, and only a
difference (a run that crashed between its log append and its recut) is committed.

`_cdc_valid_from`/`_cdc_valid_to` hold the first `sequence_by` column of the changes that open and
close a version (full ties are broken by the rest of sequence_by and arrival, like final).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, IntegerType, StructField, StructType

from cdc_pipeline.columns import BUCKET, IS_CURRENT, IS_DELETED, VALID_FROM, VALID_TO
from cdc_pipeline.config import TableConfig
from cdc_pipeline.counts import OverwriteCounts, ResetCounts
from cdc_pipeline.errors import ConfigError
from spark_jobs import delta
from spark_jobs.overwrite.absent import fill_absent
from spark_jobs.overwrite.truncates import remembered_truncates
from spark_jobs.rules.transforms import (
    ABSENT,
    ARRIVAL,
    FLAG,
    TRUNCATE,
    columns_as_json,
    compared_columns,
    hash_of,
)
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.report import StepReport

VERSION_COLUMNS = (VALID_FROM, VALID_TO, IS_CURRENT, IS_DELETED)
_BUCKETS_NOTE = re.compile(r"history_buckets=(\d+)")


def key_bucket(table: TableConfig) -> Column:
    """The key's bucket: a hash of the key values as JSON text (stable when a type widens)."""
    hashed = F.xxhash64(columns_as_json(table.keys))
    return F.pmod(hashed, F.lit(table.history_buckets)).cast(IntegerType())


def log_schema(staging_schema: StructType) -> StructType:
    """The log's columns: staging's (data, partition, flag, arrival) plus the key bucket."""
    return StructType([*staging_schema.fields, StructField(BUCKET, IntegerType(), True)])


def history_schema(staging_schema: StructType, table: TableConfig) -> StructType:
    """The history's columns: final's, the version columns, and the key bucket."""
    boundary = staging_schema[table.sequence_by[0]].dataType
    return StructType(
        [
            *[f for f in staging_schema.fields if f.name not in (FLAG, ABSENT)],
            StructField(VALID_FROM, boundary, True),
            StructField(VALID_TO, boundary, True),
            StructField(IS_CURRENT, BooleanType(), True),
            StructField(IS_DELETED, BooleanType(), True),
            StructField(BUCKET, IntegerType(), True),
        ]
    )


def tracked_columns(table: TableConfig, columns: Sequence[str]) -> list[str]:
    """Columns whose change starts a new version (the others update the version in place)."""
    if table.track_history_columns is not None:
        return [c for c in table.track_history_columns if c in columns]
    return compared_columns(columns, {*table.keys, *table.sequence_by, table.partition_column})


def cut_versions(
    events: DataFrame, table: TableConfig, truncates: DataFrame | None = None
) -> DataFrame:
    """The versions of every key of `events` (the full change log of those keys).

    A value a change did not carry (`_cdc_absent`) is the key's previous one; a truncate ends
    the version of every key open at it (a delete of each key with a change before it)."""
    keys = [F.col(k) for k in table.keys]
    order = [F.col(c) for c in [*table.sequence_by, *ARRIVAL, FLAG]]
    events = _completed(events, table, truncates, order)
    data_columns = [c for c in events.columns if c not in (FLAG, BUCKET, ABSENT)]
    by_key = Window.partitionBy(*keys).orderBy(*order)
    is_delete = F.col(FLAG) == "D"
    tracked = tracked_columns(table, data_columns)
    fingerprint = hash_of(tracked) if tracked else F.lit("")
    marked = events.withColumn("__delete", is_delete).withColumn(
        "__print", F.when(~is_delete, fingerprint)
    )
    previous = F.lag(F.struct(F.col("__delete").alias("d"), F.col("__print").alias("p"))).over(
        by_key
    )
    starts = ~F.col("__delete") & (
        previous.isNull() | previous["d"] | ~previous["p"].eqNullSafe(F.col("__print"))
    )
    # Each segment is one version (an opening change and the changes folded into it) or one
    # delete; a change after a delete always opens a version.
    running = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    segmented = marked.withColumn(
        "__segment",
        F.sum(F.when(starts | F.col("__delete"), 1).otherwise(0)).over(running),
    )
    in_segment = Window.partitionBy(*keys, F.col("__segment"))
    first_sequence = F.first(F.col(table.sequence_by[0])).over(
        in_segment.orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    latest_first = in_segment.orderBy(*[c.desc() for c in order])
    segments = (
        segmented.withColumn("__from", first_sequence)
        .withColumn("__rank", F.row_number().over(latest_first))
        .filter(F.col("__rank") == 1)
    )
    following = F.lead(F.struct(F.col("__delete").alias("d"), F.col("__from").alias("f"))).over(
        Window.partitionBy(*keys).orderBy("__segment")
    )
    return (
        segments.withColumn("__next", following)
        .filter(~F.col("__delete"))
        .select(
            *[F.col(f"`{c}`") for c in data_columns],
            F.col("__from").alias(VALID_FROM),
            F.col("__next")["f"].alias(VALID_TO),
            F.col("__next").isNull().alias(IS_CURRENT),
            F.coalesce(F.col("__next")["d"], F.lit(False)).alias(IS_DELETED),
            F.col(BUCKET),
        )
    )


def _completed(
    events: DataFrame, table: TableConfig, truncates: DataFrame | None, order: list[Column]
) -> DataFrame:
    """The events plus the deletes truncates imply, with the values they did not carry."""
    if truncates is not None:
        events = _with_truncates(events, table, truncates)
    if ABSENT in events.columns:
        # The key's earlier changes carry what a change left out (a key change: the old key's).
        events = fill_absent(
            events.withColumn("__change", F.lit(True)),
            table.keys,
            [c.desc() for c in order],
            "__change",
        ).drop("__change")
    return events


def _with_truncates(events: DataFrame, table: TableConfig, truncates: DataFrame) -> DataFrame:
    """`events` plus, for every truncate and every key with a change before it, a delete of the
    key at the truncate (truncates are few: broadcast)."""
    sequence = [F.col(f"`{c}`") for c in table.sequence_by]
    firsts = events.groupBy(*table.keys).agg(
        F.min(F.struct(*sequence)).alias("__first"), F.first(BUCKET).alias(BUCKET)
    )
    marks = truncates.select(
        F.struct(*sequence).alias("__at"),
        *[F.col(c) for c in [*table.sequence_by, *ARRIVAL]],
    )
    deletes = (
        firsts.crossJoin(F.broadcast(marks))
        .filter(F.col("__at") > F.col("__first"))
        .select(
            *table.keys,
            *[F.col(c) for c in [*table.sequence_by, *ARRIVAL]],
            F.lit("D").alias(FLAG),
            F.col(BUCKET),
        )
    )
    return events.unionByName(deletes, allowMissingColumns=True)


def _check_buckets(table: TableConfig, snapshot: delta.Snapshot) -> None:
    """A table's keys stay in the buckets they were hashed into: the count cannot change."""
    if snapshot.table is None:
        return
    found = _BUCKETS_NOTE.search(snapshot.table.metadata().description or "")
    if found and int(found.group(1)) != table.history_buckets:
        raise ConfigError(
            f"table {table.name}: history_buckets: is {table.history_buckets}, but "
            f"{snapshot.path} was created with {found.group(1)}; set it back to {found.group(1)}"
        )


def _bucket_filters(buckets: set[Any] | None) -> list[tuple[str, str, Any]] | None:
    if buckets is None:
        return None
    return [(BUCKET, "in", sorted(str(b) for b in buckets))]


def append_to_log(
    context: StepContext, events: DataFrame, buckets: set[Any] | None
) -> tuple[int, set[int]]:
    """Append the changes the log does not hold yet; returns (rows appended, their buckets)."""
    table, paths, spark = context.table, context.paths, context.spark
    # A change is one row at one arrival position (a seeded copy of it carries another flag).
    identity = [*table.keys, *table.sequence_by, *ARRIVAL]

    def attempt(_: int) -> tuple[int, set[int]] | None:
        log = delta.load_snapshot(paths.history_log)
        held = delta.read_snapshot(spark, log, partitions=buckets, columns=identity)
        fresh = events.join(held, on=identity, how="left_anti")
        run_id = delta.new_run_id()
        written = delta.write_files(fresh, paths.history_log, [BUCKET], run_id)
        if not written.actions:
            return 0, set()
        if delta.try_commit(log, written, "append", step="history_log", run_id=run_id) is None:
            return None
        # A concurrent run may have appended the same changes: harmless, a change seen
        # twice folds into the version it opens.
        appended = {int(a.partition_values[BUCKET] or 0) for a in written.actions}
        return written.rows, appended

    return delta.with_retries(f"table {table.name}: the history log", attempt)


def holds_exactly(
    spark: SparkSession, history: delta.Snapshot, buckets: set[Any] | None, versions: DataFrame
) -> bool:
    """True when the given buckets of `history` hold exactly the rows of `versions`.

    Compared as multisets of whole rows (every column, grouped: exact, no hash), in one Spark
    job over the buckets' history rows and their cut.
    """
    if history.schema is None:
        return False
    names = history.schema.fieldNames()
    held = delta.read_snapshot(spark, history, partitions=buckets).select(
        *[F.col(f"`{n}`") for n in names], F.lit(-1).alias("__side")
    )
    cut = versions.select(
        *[F.col(f"`{f.name}`").cast(f.dataType) for f in history.schema.fields],
        F.lit(1).alias("__side"),
    )
    differing = (
        cut.unionByName(held)
        .groupBy(*[F.col(f"`{n}`") for n in names])
        .agg(F.sum("__side").alias("__balance"))
        .filter(F.col("__balance") != 0)
    )
    return differing.limit(1).count() == 0


def recut(
    context: StepContext, buckets: set[Any] | None, *, unless_held: bool = False
) -> tuple[int, int, bool]:
    """Replace the history of the given buckets (None: all) by the versions cut from the log.

    Returns (rows written, history version, committed). `unless_held`: when history already
    holds exactly those versions, commit nothing (a rerun: the log gained nothing).
    """
    table, paths, spark = context.table, context.paths, context.spark

    def attempt(_: int) -> tuple[int, int, bool] | None:
        # History before the log: a history commit made after this read is seen as a conflict.
        history = delta.load_snapshot(paths.history)
        log = delta.load_snapshot(paths.history_log)
        events = delta.read_snapshot(spark, log, partitions=buckets)
        truncates = remembered_truncates(context)
        if truncates is not None and truncates.isEmpty():  # metadata: any truncate at all
            truncates = None
        versions = cut_versions(events, table, truncates).select(*history.schema.fieldNames())  # type: ignore[union-attr]
        # Compared on every attempt: after a conflict, the run that committed first may have
        # cut the same versions.
        if unless_held and holds_exactly(spark, history, buckets, versions):
            return 0, history.version, False
        run_id = delta.new_run_id()
        written = delta.write_files(versions, paths.history, [BUCKET], run_id)
        result = delta.try_commit(
            history,
            written,
            "overwrite",
            step="history",
            run_id=run_id,
            partition_filters=_bucket_filters(buckets),
            exclusive=True,
        )
        return None if result is None else (written.rows, result.version, True)

    return delta.with_retries(f"table {table.name}: the history", attempt)


def update_history(
    context: StepContext,
    changes: DataFrame,
    final_rows: DataFrame | None,
    report: StepReport[OverwriteCounts],
    *,
    recut_all: bool = False,
) -> None:
    """Log the interval's changes and recut the history of the buckets they touch.

    On the first run of a table that already has a final table (history switched on later),
    the log starts from final's rows and the remembered deletes, and every bucket is cut.
    """
    table, paths, spark = context.table, context.paths, context.spark
    staging_schema = changes.schema
    log_before = delta.load_snapshot(paths.history_log)
    note = f"cdc history of {table.name}; history_buckets={table.history_buckets}"
    _check_buckets(table, log_before)
    delta.ensure_table(paths.history_log, log_schema(staging_schema), [BUCKET], note)
    delta.ensure_table(paths.history, history_schema(staging_schema, table), [BUCKET], note)
    delta.evolve_table(spark, paths.history_log, log_schema(staging_schema))
    delta.evolve_table(spark, paths.history, history_schema(staging_schema, table))
    events = changes
    if not log_before.exists and final_rows is not None:
        events = events.unionByName(final_rows)
    events = events.withColumn(BUCKET, key_bucket(table)).dropDuplicates(
        [*table.keys, *table.sequence_by, *ARRIVAL]
    )
    buckets: set[Any] | None = None  # a new log (or a new truncate): every bucket is cut
    if log_before.exists and not recut_all:
        bucket_ids = events.select(BUCKET).distinct()
        buckets = {r[0] for r in bucket_ids.collect()}  # metadata: at most history_buckets ints
    logged, _ = append_to_log(context, events, buckets)
    # Nothing logged: a rerun, or a run whose changes another run logged. History is then
    # recut only if it does not hold the cut already (that other run has not recut yet, or
    # crashed before it did).
    versions, history_version, committed = recut(
        context, buckets, unless_held=logged == 0 or recut_all
    )
    rewritten = len(buckets) if buckets is not None else table.history_buckets
    report.result.logged(logged, rewritten if committed else 0, versions, history_version)


def flush_staging(context: StepContext, staged: DataFrame, report: StepReport[ResetCounts]) -> None:
    """Before reset-staging compacts staging, log the changes the log does not hold yet.

    A change staged but not applied yet may lose to a later one in the reset; its interval's
    overwrite-final then no longer sees it, so it is logged (and its buckets recut) here.
    """
    table, paths = context.table, context.paths
    if not delta.load_snapshot(paths.history_log).exists:
        return  # no history yet: the first overwrite-final seeds it from final
    delta.evolve_table(context.spark, paths.history_log, log_schema(staged.schema))
    staged = staged.filter(F.col(FLAG) != TRUNCATE)  # truncates live in tombstones
    logged, buckets = append_to_log(context, staged.withColumn(BUCKET, key_bucket(table)), None)
    if buckets:
        recut(context, buckets)
    report.result.history_changes_logged = logged
