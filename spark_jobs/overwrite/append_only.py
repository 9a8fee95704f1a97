"""Overwrite-final's insert-only path: append the events final does not hold yet, never
rewriting old files; after a concurrent append, remove the duplicate events it may have left."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.counts import OverwriteCounts, count
from spark_jobs import delta
from spark_jobs.overwrite.final_table import (
    ONE_TASK_ROWS,
    evolve_to_staging,
    final_schema,
    fits_one_task,
    partition_filters,
)
from spark_jobs.rules.transforms import FLAG, latest_arrival_per_key_and_sequence
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.report import StepReport


def append_inserts(
    context: StepContext, changes: DataFrame, report: StepReport[OverwriteCounts]
) -> None:
    """Insert-only path: append each (key, sequence) not yet in final; never rewrite old files."""
    table, paths, spark = context.table, context.paths, context.spark
    partition_by = table.partition_by
    delta.ensure_table(paths.final, final_schema(changes.schema), partition_by)
    evolve_to_staging(context, changes.schema, report)
    identity = [*table.keys, *table.sequence_by]
    changes_count = count(report.result.changes)
    few = changes_count <= ONE_TASK_ROWS
    partitions = None
    if table.partition_column:
        # Few changes: their partitions from one task (a distinct over one partition is no
        # shuffle: two Spark jobs fewer).
        placed = changes.coalesce(1) if few else changes
        partitions = delta.partition_values_of(placed, table.partition_column)

    def attempt_append(attempt: int) -> int | None:
        final = delta.load_snapshot(paths.final)
        existing = delta.read_snapshot(spark, final, partitions=partitions, columns=identity)
        # Few changes and few rows of final to compare them with: one task picks each event's
        # latest arrival (no shuffle by key before the join).
        one_task = fits_one_task(changes_count, final.files_in(partitions))
        fresh_candidates = latest_arrival_per_key_and_sequence(
            changes.coalesce(1) if one_task else changes, table.keys, table.sequence_by
        ).drop(FLAG)
        fresh = fresh_candidates.join(existing, on=identity, how="left_anti")
        run_id = delta.new_run_id()
        plain = delta.plain_columns(paths.final, final.files)
        written = delta.write_files(
            fresh, paths.final, partition_by, run_id, table.zorder_by, plain
        )
        report.result.rewrote(0, written.rows, final.version)
        if not written.actions:
            return attempt
        delta.inject_fault("overwrite_final:before_commit")
        result = delta.try_commit(final, written, "append", step="append_inserts", run_id=run_id)
        if result is None:
            return None
        report.result.final_version = result.version
        if result.interfering_versions:
            # A concurrent append may hold the same events: remove duplicates where they can be.
            report.result.final_version = remove_duplicate_events(context, partitions)
        return attempt

    report.result.attempts = delta.with_retries(f"table {table.name}: final", attempt_append)


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
            step="deduplicate",
            run_id=run_id,
            partition_filters=partition_filters(table, partitions),
            exclusive=True,
        )
        return None if result is None else result.version

    return delta.with_retries(f"table {table.name}: removing duplicate events", attempt)
