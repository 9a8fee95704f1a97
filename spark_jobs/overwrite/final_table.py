"""The final and tombstones tables as overwrite-final writes them: their columns (from
staging's), their schema evolution to staging's, and the partition filter of a rewrite."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pyspark.sql.types import StructType

from cdc_pipeline.config import TableConfig
from cdc_pipeline.counts import OverwriteCounts
from spark_jobs import delta
from spark_jobs.rules.transforms import ABSENT, ARRIVAL, FLAG
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.notices import warn
from spark_jobs.runtime.report import StepReport

# Up to this many rows read in all, one task does a run's ranking (overwrite-final's changes and
# the rows of the files it reads; the insert-only path's changes and final's identities): no
# shuffle by key before it and none by partition after it, two Spark jobs fewer each.
ONE_TASK_ROWS = 1_000_000
# Up to this many, one task also writes what the run rewrites (the rows kept of the files
# replaced, beside the ranked ones): Spark's task overhead, not the rows, is a small run's
# write (overwrite-final of 300 changes: 0.64 against 0.77 server CPU-s), while a larger one
# is faster written by every core.
ONE_WRITER_ROWS = 100_000


def rows_in(rows: int, files: Iterable[delta.DataFile]) -> int | None:
    """`rows` and the rows of `files` by the files' own counts; None when a file has none."""
    counts = [f.num_records for f in files]
    return None if None in counts else rows + sum(n or 0 for n in counts)


def fits_one_task(rows: int, files: Iterable[delta.DataFile], limit: int = ONE_TASK_ROWS) -> bool:
    """Whether `rows` and the rows of `files` (by the files' own counts; a file without one
    never fits) are at most `limit` in all."""
    total = rows_in(rows, files)
    return total is not None and total <= limit


def final_schema(staging_schema: StructType) -> StructType:
    """Final's columns: staging's without the flag and the absent list (data, partition and
    arrival columns): final's rows carry every value."""
    return StructType([f for f in staging_schema.fields if f.name not in (FLAG, ABSENT)])


def tombstone_schema(staging_schema: StructType, table: TableConfig) -> StructType:
    """Tombstones' columns: key, sequence and arrival of a delete."""
    names = [*table.keys, *table.sequence_by, *ARRIVAL]
    return StructType([staging_schema[n] for n in names])


def evolve_to_staging(
    context: StepContext, staging_schema: StructType, report: StepReport[OverwriteCounts]
) -> None:
    """Give final (and tombstones) the columns and widened types staging has gained."""
    table, paths, spark = context.table, context.paths, context.spark
    changed = delta.evolve_table(spark, paths.final, final_schema(staging_schema))
    if not table.insert_only:
        delta.evolve_table(spark, paths.tombstones, tombstone_schema(staging_schema, table))
    if changed:
        report.result.schema_changes = len(changed)
        warn(f"table {table.name}: final schema evolved: {', '.join(changed)}")


def partition_filters(
    table: TableConfig, touched: set[Any] | None
) -> list[tuple[str, str, Any]] | None:
    """The delta-rs filter of the touched partitions a rewrite replaces (None: the whole table)."""
    if touched is None or table.partition_column is None:
        return None
    values = sorted(v for v in (delta.partition_value_string(t) for t in touched) if v is not None)
    return [(table.partition_column, "in", values)]
