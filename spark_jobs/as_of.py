"""Step `as-of`: the table as it was at a point of its sequence, from the history table.

    SELECT * FROM history
    WHERE _cdc_valid_from <= :at AND (_cdc_valid_to > :at OR _cdc_valid_to IS NULL)

A version's bounds are values of the first `sequence_by` column, so `--at` is read as that
column's type: an ISO timestamp or date for timestamp and date columns, a number for numeric
ones (an ISO timestamp is turned into epoch milliseconds for `_cdc_source_ts_ms`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC
from decimal import Decimal, InvalidOperation
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from cdc_pipeline.columns import SOURCE_TS_MS
from cdc_pipeline.config import TableConfig
from cdc_pipeline.counts import AsOfCounts
from cdc_pipeline.errors import ConfigError, InputError, UsageError
from cdc_pipeline.intervals import parse_timestamp
from cdc_pipeline.paths import Location
from spark_jobs import delta
from spark_jobs.overwrite.history import BUCKET, VALID_FROM, VALID_TO, VERSION_COLUMNS
from spark_jobs.rules.transforms import ARRIVAL, persisted
from spark_jobs.runtime.args import StepArgs
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.entry import run_step
from spark_jobs.runtime.report import StepReport

DEFAULT_SAMPLE_ROWS = 20


def at_value(text: str, kind: DataType, column: str) -> Any:
    """`--at` as a value comparable with the sequence column `column` of type `kind`."""
    text = text.strip()
    try:
        if isinstance(kind, TimestampType | TimestampNTZType):
            moment = parse_timestamp(text)
            return moment if isinstance(kind, TimestampType) else moment.replace(tzinfo=None)
        if isinstance(kind, DateType):
            return parse_timestamp(text).date()
        if isinstance(kind, IntegralType):
            if text.lstrip("-").isdigit():
                return int(text)
            if column == SOURCE_TS_MS:
                return int(parse_timestamp(text).astimezone(UTC).timestamp() * 1000)
            raise ValueError("not a whole number")
        if isinstance(kind, DecimalType):
            return Decimal(text)
        if isinstance(kind, FloatType | DoubleType):
            return float(text)
        if isinstance(kind, StringType):
            return text
    except (ValueError, InvalidOperation, UsageError) as error:
        raise UsageError(
            f"--at {text!r}: the history's versions are bounded by {column} "
            f"({kind.simpleString()}); give a value of that type ({error})"
        ) from None
    raise UsageError(f"--at: {column} ({kind.simpleString()}) cannot bound an as-of query")


def as_of_frame(context: StepContext, at: str) -> DataFrame:
    """The rows of the table valid at `at`: final's columns, without the arrival columns."""
    spark, table, paths = context.spark, context.table, context.paths
    if not table.history:
        raise ConfigError(
            f"table {table.name}: history: as-of reads the history table; set history: true"
        )
    snapshot = delta.load_snapshot(paths.history)
    if snapshot.schema is None:
        raise InputError(
            f"table {table.name}: no history table at {paths.history} yet; run an interval first"
        )
    moment = at_value(at, snapshot.schema[VALID_FROM].dataType, table.sequence_by[0])
    versions = delta.read_snapshot(spark, snapshot)
    valid = versions.filter(
        (F.col(VALID_FROM) <= F.lit(moment))
        & (F.col(VALID_TO).isNull() | (F.col(VALID_TO) > F.lit(moment)))
    )
    hidden = {*VERSION_COLUMNS, BUCKET, *ARRIVAL}
    return valid.select(*[c for c in versions.columns if c not in hidden])


def write_output(frame: DataFrame, path: Location, table: TableConfig) -> int:
    """Replace the Delta table at `path` by `frame` (created when missing); returns its version."""
    partition_by = table.partition_by
    delta.ensure_table(path, frame.schema, partition_by)
    snapshot = delta.load_snapshot(path)
    run_id = delta.new_run_id()
    written = delta.write_files(frame, path, snapshot.partition_columns, run_id)
    result = delta.commit(
        snapshot, written, "overwrite", step="as_of", run_id=run_id, schema=frame.schema
    )
    return result.version


def run_as_of(
    context: StepContext, at: str, output: Location | None, limit: int
) -> StepReport[AsOfCounts]:
    """Write the table as of `at` to `output`, or print a sample of it."""
    table = context.table
    report = StepReport("as-of", table.name, f"at {at}", AsOfCounts())
    frame = persisted(as_of_frame(context, at))
    try:
        report.result.rows = frame.count()
        if output is not None:
            report.result.output = str(output)
            report.result.output_version = write_output(frame, output, table)
            return report
        # Spark renders the values (timestamps in the session's UTC), the driver prints them.
        as_text = frame.orderBy(*table.keys).select(
            *[F.col(f"`{c}`").cast("string").alias(c) for c in frame.columns]
        )
        sample = as_text.limit(limit).collect()  # metadata: the printed sample, <= limit rows
        print("\t".join(frame.columns))
        for row in sample:
            print("\t".join("" if v is None else v for v in row))
        report.result.printed = len(sample)
    finally:
        frame.unpersist()
    return report


def as_of_step(context: StepContext, args: StepArgs) -> StepReport[AsOfCounts]:
    """`cdc as-of` body."""
    if args.at is None:
        raise UsageError("--at is required")
    return run_as_of(context, args.at, args.output, args.limit or DEFAULT_SAMPLE_ROWS)


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: as_of TABLE --at TS [--output PATH] [--limit N]."""
    return run_step("as_of", argv)


if __name__ == "__main__":
    sys.exit(main())
