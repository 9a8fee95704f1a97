"""Step `overwrite-final`: apply the interval's staged changes by rewriting only touched partitions.

The final table already holds the winner of every earlier change and the tombstones table the
latest delete of every deleted key, so ranking the interval's changes against the final rows and
tombstones of the same keys gives the answer ranking all of staging would, at a cost that follows
the change set. The touched partitions are those of the new rows plus those that hold the keys
now (a key that moves, or is deleted by a key-only D, leaves its old partition); a table declared
`partition_stable` looks up only the keys with a delete and trusts the partition values the
changes name. Only the changed keys are ranked; the other rows of the touched partitions are
copied as they are. The touched partitions are replaced in one delta-rs commit made as the
version right after the snapshot that was read: if final changed meanwhile, the attempt is
recomputed from a new snapshot.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from cdc_pipeline.config import TableConfig
from cdc_pipeline.intervals import Interval
from spark_jobs import delta, history
from spark_jobs.common import StepArgs, StepContext, StepReport, run_step
from spark_jobs.transforms import (
    ARRIVAL,
    FLAG,
    latest_arrival_per_key_and_sequence,
    latest_change_per_key,
)

ROUTE = delta.ROUTE_COLUMN  # "final" or "tombstones": which table an output row is for
REMEMBERED = "_cdc_remembered"  # a ranked row that came from tombstones
FROM_CHANGE = "_cdc_from_change"  # a ranked row that came from the interval's changes
CURRENT_ROWS = "_cdc_current_rows"  # how many rows of final the ranked row's key has
# Up to this many staged changes, their keys are broadcast to every join (a map-side filter of
# final, no shuffle of its rows); above it Spark chooses (adaptive execution, shuffle joins).
BROADCAST_CHANGES_MAX = 1_000_000
# Up to this many staged changes, the changed keys are collected to the driver (as Arrow) and
# reach the joins as a local relation; above it they are a cached distinct of the changes.
LOCAL_KEYS_MAX = 100_000


def final_schema(staging_schema: StructType) -> StructType:
    """Final's columns: staging's without the flag (data, partition and arrival columns)."""
    return StructType([f for f in staging_schema.fields if f.name != FLAG])


def tombstone_schema(staging_schema: StructType, table: TableConfig) -> StructType:
    """Tombstones' columns: key, sequence and arrival of a delete."""
    names = [*table.keys, *table.sequence_by, *ARRIVAL]
    return StructType([staging_schema[n] for n in names])


@dataclass
class ChangedKeys:
    """The interval's distinct changed keys and what the changes say about where they live."""

    frame: DataFrame  # every distinct changed key (a local relation, or cached)
    local: pa.Table | None  # the same keys on the driver (at most LOCAL_KEYS_MAX changes)
    # The partitions the changes name: the upserts' (with partition_stable also the deletes'
    # row images'); None: unpartitioned.
    partitions: set[Any] | None
    lookup: DataFrame  # the keys whose current partition is looked up in final
    lookup_local: pa.Table | None  # the same on the driver, with `local`
    broadcast: bool  # few enough to send to every task

    def release(self) -> None:
        """Drop the cached frames (the Spark path)."""
        if self.local is None:
            self.frame.unpersist()
            if self.lookup is not self.frame:
                self.lookup.unpersist()


@dataclass
class Plan:
    """What one attempt will write: the touched partitions and the rows replacing them."""

    touched: set[Any] | None  # None: the table is unpartitioned and rewritten whole
    output: DataFrame  # final's new rows and the new tombstones, told apart by ROUTE
    winners: DataFrame  # the ranked rows (persisted: the verdict and the write both read them)

    def changes_nothing(self) -> bool:
        """True when the rewrite would give final and tombstones exactly the rows they hold.

        That is when no change wins (a winning change is a new row image or a new delete),
        every winning row of final is its key's only row there, and no remembered delete wins
        over a row of final. Exact ties go to the copy already in final or tombstones, so a
        change applied before (a rerun, a second extract staged the same) does not count.
        """
        row = self.winners.agg(
            F.count(F.lit(1)).alias("winners"),
            F.sum(
                F.when(
                    F.col(FROM_CHANGE)
                    | (F.col(REMEMBERED) & (F.col(CURRENT_ROWS) > 0))
                    | (~F.col(REMEMBERED) & (F.col(CURRENT_ROWS) != 1)),
                    1,
                ).otherwise(0)
            ).alias("changing"),
        ).collect()[0]  # metadata: one row of two counts
        return bool(row["winners"]) and not row["changing"]

    def release(self) -> None:
        """Drop the cached ranking."""
        self.winners.unpersist()


def partitions_holding_keys(
    context: StepContext,
    final: delta.Snapshot,
    keys_df: DataFrame,
    known: set[Any],
    trust_unique: bool = True,
    broadcast: bool = True,
    local_keys: pa.Table | None = None,
) -> set[Any]:
    """Partition values of the final files holding any of the keys, outside `known`.

    Final holds each key once, so a key found in the `known` partitions (those the changes
    write to, rewritten anyway) is nowhere else: only the other keys (new keys, keys that
    moved, key-only deletes) are looked up, and only in the files whose key statistics (min and
    max of each key column, written with every file) can hold one of them. New keys above
    every file's range, the common case, read no file at all; with the keys on the driver, a
    change set that no file outside `known` can hold does not even read the known partitions.

    A recompute after a failed commit (`trust_unique=False`) looks up every key anyway, so a
    key that some other writer left in two partitions is found in both and healed (commits to
    final are exclusive, so this step does not leave one). `broadcast`: the keys are few enough
    to send to every task. `local_keys`: the same keys on the driver (at most LOCAL_KEYS_MAX,
    the key columns only), whose ranges are then checked there, with no Spark job.
    """
    table = context.table
    if not final.files or table.partition_column is None:
        return set()
    spark, keys = context.spark, list(table.keys)
    column = table.partition_column
    others = [f for f in final.files if f.partition_values.get(column) not in known]
    if local_keys is not None:
        # No file outside the known partitions can hold any of the keys (or there are no
        # keys): nothing to look up.
        others = files_in_key_ranges(others, local_keys)
        if not others:
            return set()
    if known and trust_unique:
        found = delta.read_snapshot(spark, final, partitions=known, columns=keys).join(
            _small(keys_df, broadcast), on=keys, how="left_semi"
        )  # the changed keys already in the known partitions: few rows, whatever final's size
        if local_keys is not None:
            found_keys = found.toArrow()  # metadata: at most LOCAL_KEYS_MAX keys
            local_keys = local_keys.join(
                found_keys.cast(local_keys.schema), keys, join_type="left anti"
            )
        else:
            keys_df = keys_df.join(found, on=keys, how="left_anti")
    if local_keys is not None:
        candidates = files_in_key_ranges(others, local_keys)
        if candidates:
            keys_df = delta.local_frame(spark, local_keys, keys_df.schema)
    else:
        candidates = files_that_may_hold(context, final, others, keys_df)
    if not candidates:
        return set()
    located = delta.read_snapshot(spark, final, columns=keys, with_file_name=True, files=candidates)
    names = (
        located.join(_small(keys_df, broadcast), on=keys, how="left_semi")
        .select(delta.FILE_NAME_COLUMN)
        .distinct()
        .collect()  # metadata: file names (at most one per candidate file), not rows
    )
    by_name = {f.name: f.partition_values[column] for f in candidates}
    return {by_name[row[0]] for row in names}


def files_in_key_ranges(files: list[delta.DataFile], keys: pa.Table) -> list[delta.DataFile]:
    """The files whose key ranges (from their statistics) contain at least one of the keys, an
    Arrow table on the driver. A file is kept when a statistic is missing or does not compare
    with its key column's type, and for floating-point keys (NaN order)."""
    if keys.num_rows == 0:
        return []
    names = keys.column_names
    exact = not any(pa.types.is_floating(keys[k].type) for k in names)
    kept = []
    for file in files:
        if not exact or not all(k in file.min_values and k in file.max_values for k in names):
            kept.append(file)
            continue
        try:
            inside = None
            for k in names:
                column = keys[k]
                low = pa.scalar(file.min_values[k], column.type)
                high = pa.scalar(file.max_values[k], column.type)
                part = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
                inside = part if inside is None else pc.and_(inside, part)
            if pc.any(inside).as_py():
                kept.append(file)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
            kept.append(file)
    return kept


def files_that_may_hold(
    context: StepContext, final: delta.Snapshot, files: list[delta.DataFile], keys_df: DataFrame
) -> list[delta.DataFile]:
    """The files whose key ranges (from their statistics) contain at least one of the keys;
    files without statistics for every key column are always included."""
    spark, keys = context.spark, list(context.table.keys)
    ranged = [f for f in files if all(k in f.min_values and k in f.max_values for k in keys)]
    unranged = [f for f in files if f not in ranged]
    if not ranged or final.schema is None:
        return files
    fields = [StructField("__file", StringType(), False)]
    for key in keys:
        kind = final.schema[key].dataType
        fields += [StructField(f"__min_{key}", kind), StructField(f"__max_{key}", kind)]
    ranges = delta.local_frame(
        spark,
        [(f.name, *[v for k in keys for v in (f.min_values[k], f.max_values[k])]) for f in ranged],
        StructType(fields),
    )
    inside = [F.col(k).between(F.col(f"__min_{k}"), F.col(f"__max_{k}")) for k in keys]
    condition = inside[0]
    for part in inside[1:]:
        condition = condition & part
    hits = {
        row[0]
        for row in keys_df.join(F.broadcast(ranges), condition)
        .select("__file")
        .distinct()
        .collect()  # metadata: file names (at most one per file of the snapshot), not rows
    }
    return unranged + [f for f in ranged if f.name in hits]


def _small(frame: DataFrame, broadcast: bool) -> DataFrame:
    """`frame` with a broadcast hint when it is known to be small."""
    return F.broadcast(frame) if broadcast else frame


def as_changes(frame: DataFrame, columns: Sequence[str], flag: str) -> DataFrame:
    """Rows of final or tombstones shaped like staged changes (`columns`, staging's), flagged
    `flag`: U for final's rows, D for tombstones (their other columns null)."""
    present = set(frame.columns)
    return frame.select(
        *[F.col(c) if c in present else F.lit(None).alias(c) for c in columns if c != FLAG],
        F.lit(flag).alias(FLAG),
    ).select(*columns)


def plan_rewrite(
    context: StepContext,
    changes: DataFrame,
    changed: ChangedKeys,
    final: delta.Snapshot,
    tombstones: delta.Snapshot,
    attempt: int = 1,
) -> Plan:
    """Rank the changes against the current rows and tombstones of their keys.

    Only the changed keys are ranked (a shuffle the size of the change set); the other rows of
    the touched partitions are copied through a map-side anti join (broadcast keys when they
    are few enough), without a shuffle or sort. `attempt` > 1 is a recompute after another
    commit landed first: it looks up every key and ranks every row of the touched partitions,
    so it also heals any key left twice there.
    """
    spark, table = context.spark, context.table
    keys = list(table.keys)
    change_columns = changes.columns
    keys_df, broadcast = changed.frame, changed.broadcast
    if table.partition_column is not None:
        if changed.partitions is None:
            raise ValueError(f"table {table.name}: plan_rewrite needs the changes' partitions")
        if attempt == 1:
            held = partitions_holding_keys(
                context,
                final,
                changed.lookup,
                changed.partitions,
                True,
                broadcast,
                changed.lookup_local,
            )
        else:
            held = partitions_holding_keys(
                context, final, keys_df, changed.partitions, False, broadcast, changed.local
            )
        touched: set[Any] | None = changed.partitions | held
        final_rows = delta.read_snapshot(spark, final, partitions=touched)
    else:
        touched = None
        final_rows = delta.read_snapshot(spark, final)
    small_keys = _small(keys_df, broadcast)
    remembered = delta.read_snapshot(spark, tombstones).join(small_keys, on=keys, how="left_semi")
    # Every current row of a changed key is ranked, so a key left twice in the touched
    # partitions comes out once. A recompute (a commit landed before ours) ranks every row of
    # them: cheap insurance against rows doubled by a writer that is not this step, such as an
    # OPTIMIZE racing an overwrite that was not exclusive.
    heal = attempt > 1
    current = final_rows if heal else final_rows.join(small_keys, on=keys, how="left_semi")
    candidates = (
        changes.select(
            *change_columns, F.lit(False).alias(REMEMBERED), F.lit(True).alias(FROM_CHANGE)
        )
        .unionByName(
            as_changes(current, change_columns, "U")
            .withColumn(REMEMBERED, F.lit(False))
            .withColumn(FROM_CHANGE, F.lit(False))
        )
        .unionByName(
            as_changes(remembered, change_columns, "D")
            .withColumn(REMEMBERED, F.lit(True))
            .withColumn(FROM_CHANGE, F.lit(False))
        )
    )
    # Each ranked row knows how many rows of final its key has (same window partitioning as
    # the ranking: no second shuffle), so the verdict below needs no other join.
    is_current = ~F.col(REMEMBERED) & ~F.col(FROM_CHANGE)
    candidates = candidates.withColumn(
        CURRENT_ROWS,
        F.sum(F.when(is_current, 1).otherwise(0)).over(
            Window.partitionBy(*[F.col(k) for k in keys])
        ),
    )
    # A tie (the same delete staged again and already remembered) goes to the remembered copy,
    # so a delete that wins is new exactly when it is not a remembered one; a tie between a
    # change and its copy in final goes to the copy, so a change applied before is no change.
    winners = latest_change_per_key(
        candidates,
        keys,
        table.sequence_by,
        tiebreak=[F.col(REMEMBERED).desc(), F.col(FROM_CHANGE).asc()],
    ).persist()
    is_delete = F.col(FLAG) == "D"
    output_columns = [c for c in change_columns if c != FLAG]
    tombstone_columns = {*keys, *table.sequence_by, *ARRIVAL}
    # One ranking feeds both tables: the upserts go to final, the new deletes to tombstones
    # (with their other columns null).
    ranked = winners.filter(~is_delete | ~F.col(REMEMBERED)).select(
        *[
            F.col(c) if c in tombstone_columns else F.when(~is_delete, F.col(c)).alias(c)
            for c in output_columns
        ],
        F.when(is_delete, F.lit("tombstones")).otherwise(F.lit("final")).alias(ROUTE),
    )
    if table.partition_column is not None:
        # One task per partition value: one new file per touched partition, not one per task
        # (the new tombstones, partition null, in one more).
        ranked = ranked.repartition(table.partition_column)
    unchanged = (
        final_rows.limit(0) if heal else final_rows.join(small_keys, on=keys, how="left_anti")
    ).select(*output_columns, F.lit("final").alias(ROUTE))
    # Both tables' rows in one frame, written by one Spark job.
    output = unchanged.unionByName(ranked)
    return Plan(touched, output, winners)


def _partition_filters(
    table: TableConfig, touched: set[Any] | None
) -> list[tuple[str, str, Any]] | None:
    if touched is None or table.partition_column is None:
        return None
    values = sorted(v for v in (delta.partition_value_string(t) for t in touched) if v is not None)
    return [(table.partition_column, "in", values)]


def evolve_to_staging(context: StepContext, staging_schema: StructType, report: StepReport) -> None:
    """Give final (and tombstones) the columns and widened types staging has gained."""
    table, paths, spark = context.table, context.paths, context.spark
    changed = delta.evolve_table(spark, paths.final, final_schema(staging_schema))
    if not table.insert_only:
        delta.evolve_table(spark, paths.tombstones, tombstone_schema(staging_schema, table))
    if changed:
        report.counts["schema_changes"] = len(changed)
        print(
            f"warning: table {table.name}: final schema evolved: {', '.join(changed)}",
            file=sys.stderr,
            flush=True,
        )


def apply_changes(context: StepContext, changes: DataFrame, report: StepReport) -> None:
    """Upsert/delete path: rewrite the touched partitions of final, retrying on conflicts."""
    table, paths = context.table, context.paths
    staging_schema = changes.schema
    partition_by = table.partition_by
    delta.ensure_table(paths.final, final_schema(staging_schema), partition_by)
    delta.ensure_table(paths.tombstones, tombstone_schema(staging_schema, table), [])
    evolve_to_staging(context, staging_schema, report)
    broadcast = report.counts["changes"] <= BROADCAST_CHANGES_MAX
    if report.counts["changes"] <= LOCAL_KEYS_MAX:
        changed = changed_keys_on_driver(context, changes, broadcast)
    else:
        changed = changed_keys_in_spark(context, changes, broadcast)
    routes = {
        "final": (paths.final, partition_by, final_schema(staging_schema).fieldNames()),
        "tombstones": (paths.tombstones, [], tombstone_schema(staging_schema, table).fieldNames()),
    }
    tombstones_added = 0
    try:
        if changed.local is not None and changed.lookup_local is not None:
            report.counts["keys"] = changed.local.num_rows
            report.counts["keys_looked_up"] = changed.lookup_local.num_rows
        else:
            report.counts["keys"] = changed.frame.count()  # also caches the keys for the joins
            report.counts["keys_looked_up"] = (
                changed.lookup.count()
                if changed.lookup is not changed.frame
                else report.counts["keys"]
            )

        def attempt_rewrite(attempt: int) -> int | None:
            """One attempt from fresh snapshots; its number when done, None after a lost race."""
            nonlocal tombstones_added
            final = delta.load_snapshot(paths.final)
            tombstones = delta.load_snapshot(paths.tombstones)  # after final: see the run order
            plan = plan_rewrite(context, changes, changed, final, tombstones, attempt)
            try:
                if plan.changes_nothing():
                    # A rerun of an applied interval: nothing to commit, final keeps its version.
                    report.counts.update(
                        partitions_rewritten=0, rows_written=0, final_version=final.version
                    )
                    return attempt
                run_id = delta.new_run_id()
                written = delta.write_routed(plan.output, routes, run_id, table.zorder_by)
            finally:
                plan.release()
            new_final, new_tombstones = written["final"], written["tombstones"]
            if new_tombstones.actions:
                # Before final, so a delete is never applied without being remembered.
                remembered = delta.try_commit(
                    tombstones, new_tombstones, "append", "tombstones", run_id
                )
                if remembered is None:
                    new_final.delete()
                    return None
                tombstones_added += new_tombstones.rows
                if remembered.interfering_versions:
                    # Another run may have remembered the same deletes: keep one copy of each.
                    delta.remove_duplicate_rows(context.spark, paths.tombstones, "tombstones")
            if plan.touched is not None and not plan.touched:
                new_final.delete()
                report.counts.update(
                    partitions_rewritten=0, rows_written=0, final_version=final.version
                )
                return attempt
            delta.inject_fault("overwrite_final:before_commit")
            # Exclusive: the result holds only if final did not change since it was read (an
            # OPTIMIZE or another run creating the same partition would not conflict).
            result = delta.try_commit(
                final,
                new_final,
                "overwrite",
                "overwrite_final",
                run_id,
                _partition_filters(table, plan.touched),
                exclusive=True,
            )
            if result is None:
                return None
            delta.inject_fault("overwrite_final:after_commit")
            report.counts.update(
                partitions_rewritten=len(plan.touched) if plan.touched is not None else 1,
                rows_written=new_final.rows,
                final_version=result.version,
            )
            return attempt

        attempts = delta.with_retries(f"table {table.name}: final", attempt_rewrite)
    finally:
        changed.release()
    report.counts.update(tombstones_added=tombstones_added, attempts=attempts)


def changed_keys_in_spark(context: StepContext, changes: DataFrame, broadcast: bool) -> ChangedKeys:
    """The changed keys as cached Spark frames, for change sets above LOCAL_KEYS_MAX."""
    table = context.table
    keys, column = list(table.keys), table.partition_column
    frame = changes.select(*keys).distinct().persist()
    if column is None:
        return ChangedKeys(frame, None, None, frame, None, broadcast)
    try:
        placed = changes if table.partition_stable else changes.filter(F.col(FLAG) != "D")
        partitions = delta.partition_values_of(placed, column) - {None}
    except Exception:
        frame.unpersist()
        raise
    if not table.partition_stable:
        return ChangedKeys(frame, None, partitions, frame, None, broadcast)
    # A stable key lives in the partition its inserts and updates name: only keys with a
    # delete are looked up (a key-only delete names none; a row image may be partial).
    lookup = changes.filter(F.col(FLAG) == "D").select(*keys).distinct().persist()
    return ChangedKeys(frame, None, partitions, lookup, None, broadcast)


def changed_keys_on_driver(
    context: StepContext, changes: DataFrame, broadcast: bool
) -> ChangedKeys:
    """The changed keys as local relations and as Arrow, and their partitions, from one Spark
    job over the changes.

    For at most LOCAL_KEYS_MAX changes: the keys then reach every join from the driver, with no
    job to cache or broadcast them, and their key ranges are checked there.
    """
    table, spark = context.table, context.spark
    keys, column = list(table.keys), table.partition_column
    wanted = changes.select(*keys, *([column] if column else []), FLAG)
    summary = wanted.toArrow()  # metadata: at most LOCAL_KEYS_MAX rows of keys and flags
    distinct = summary.select(keys).group_by(keys).aggregate([])
    schema = changes.select(*keys).schema
    frame = delta.local_frame(spark, distinct, schema)
    if column is None:
        return ChangedKeys(frame, distinct, None, frame, distinct, broadcast)
    stable = table.partition_stable
    placed = summary if stable else summary.filter(pc.not_equal(summary[FLAG], "D"))
    values = pc.unique(placed[column]).drop_null().to_pylist()
    partitions = {delta.canonical_partition_value(v) for v in values}
    if not stable:
        return ChangedKeys(frame, distinct, partitions, frame, distinct, broadcast)
    # A stable key lives in the partition its inserts and updates name: only keys with a
    # delete are looked up (a key-only delete names none; a row image may be partial).
    deleted = summary.filter(pc.equal(summary[FLAG], "D")).select(keys)
    lookup = deleted.group_by(keys).aggregate([])
    return ChangedKeys(
        frame, distinct, partitions, delta.local_frame(spark, lookup, schema), lookup, broadcast
    )


def append_inserts(context: StepContext, changes: DataFrame, report: StepReport) -> None:
    """Insert-only path: append each (key, sequence) not yet in final; never rewrite old files."""
    table, paths, spark = context.table, context.paths, context.spark
    partition_by = table.partition_by
    delta.ensure_table(paths.final, final_schema(changes.schema), partition_by)
    evolve_to_staging(context, changes.schema, report)
    identity = [*table.keys, *table.sequence_by]
    fresh_candidates = latest_arrival_per_key_and_sequence(
        changes, table.keys, table.sequence_by
    ).drop(FLAG)
    partitions = None
    if table.partition_column:
        partitions = delta.partition_values_of(changes, table.partition_column)

    def attempt_append(attempt: int) -> int | None:
        final = delta.load_snapshot(paths.final)
        existing = delta.read_snapshot(spark, final, partitions=partitions, columns=identity)
        fresh = fresh_candidates.join(existing, on=identity, how="left_anti")
        run_id = delta.new_run_id()
        written = delta.write_files(fresh, paths.final, partition_by, run_id, table.zorder_by)
        report.counts.update(
            rows_written=written.rows, partitions_rewritten=0, final_version=final.version
        )
        if not written.actions:
            return attempt
        delta.inject_fault("overwrite_final:before_commit")
        result = delta.try_commit(final, written, "append", "append_inserts", run_id)
        if result is None:
            return None
        report.counts["final_version"] = result.version
        if result.interfering_versions:
            # A concurrent append may hold the same events: remove duplicates where they can be.
            report.counts["final_version"] = remove_duplicate_events(context, partitions)
        return attempt

    report.counts["attempts"] = delta.with_retries(f"table {table.name}: final", attempt_append)


def remove_duplicate_events(context: StepContext, partitions: set[Any] | None) -> int:
    """Rewrite the given partitions of an insert-only final with one row per (key, sequence)."""
    table, paths, spark = context.table, context.paths, context.spark
    identity = [*table.keys, *table.sequence_by]
    partition_by = table.partition_by

    def attempt(_: int) -> int | None:
        final = delta.load_snapshot(paths.final)
        rows = delta.read_snapshot(spark, final, partitions=partitions)
        duplicates = rows.groupBy(*identity).count().filter(F.col("count") > 1).limit(1).count()
        if duplicates == 0:
            return final.version
        deduplicated = latest_arrival_per_key_and_sequence(rows, table.keys, table.sequence_by)
        run_id = delta.new_run_id()
        written = delta.write_files(
            deduplicated, paths.final, partition_by, run_id, table.zorder_by
        )
        result = delta.try_commit(
            final,
            written,
            "overwrite",
            "deduplicate",
            run_id,
            _partition_filters(table, partitions),
            exclusive=True,
        )
        return None if result is None else result.version

    return delta.with_retries(f"table {table.name}: removing duplicate events", attempt)


def history_seed(context: StepContext, columns: Sequence[str]) -> DataFrame | None:
    """What is known before history starts, as changes (staging's `columns`): every change still
    in staging, final's rows and the remembered deletes (seeding a new history log)."""
    spark, paths = context.spark, context.paths
    parts = []
    for path, flag in ((paths.staging, None), (paths.final, "U"), (paths.tombstones, "D")):
        snapshot = delta.load_snapshot(path)
        if snapshot.exists and snapshot.files:
            rows = delta.read_snapshot(spark, snapshot)
            parts.append(rows.select(*columns) if flag is None else as_changes(rows, columns, flag))
    if not parts:
        return None
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


def run_overwrite_final(context: StepContext, interval: Interval) -> StepReport:
    """Apply the staged changes of the interval's hours to the final table."""
    table, paths = context.table, context.paths
    report = StepReport("overwrite-final", table.name, str(interval))
    staging = delta.load_snapshot(paths.staging)
    batches = interval.batch_ids()
    if not staging.exists or not staging.files_in(batches):
        final = delta.load_snapshot(paths.final)
        report.counts.update(
            changes=0, keys=0, partitions_rewritten=0, rows_written=0, final_version=final.version
        )
        return report
    delta.inject_fault("overwrite_final:before_first_write")
    changes = delta.read_snapshot(context.spark, staging, partitions=batches).persist()
    try:
        files = staging.files_in(batches)
        if all(f.num_records is not None for f in files):  # from the log: no Spark job
            report.counts["changes"] = sum(f.num_records or 0 for f in files)
        else:
            report.counts["changes"] = changes.count()
        if table.insert_only:
            append_inserts(context, changes, report)
        else:
            apply_changes(context, changes, report)
            if table.history:
                seed = None
                if not delta.load_snapshot(paths.history_log).exists:
                    seed = history_seed(context, changes.columns)
                history.update_history(context, changes, seed, report)
    finally:
        changes.unpersist()
    return report


def overwrite_final_step(context: StepContext, args: StepArgs) -> StepReport:
    """`cdc overwrite-final` body."""
    return run_overwrite_final(context, args.interval())


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: overwrite_final TABLE --start TS --end TS."""
    return run_step("overwrite_final", argv)


if __name__ == "__main__":
    sys.exit(main())
