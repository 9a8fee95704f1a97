"""Pure DataFrame transforms of the CDC steps: typing and checking change rows, ranking changes.

Spark SQL functions only (no Python UDFs), so executors need nothing but Spark.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdc_pipeline.config import TableConfig

FLAG = "_cdc_flag"
BATCH = "_cdc_batch"
FILE = "_cdc_file"
ROW = "_cdc_row"
REASON = "_cdc_reason"
RAW = "_cdc_raw"
FORMAT_ERROR = "_cdc_format_error"
ARRIVAL = (BATCH, FILE, ROW)
VALID_FLAGS = ("I", "U", "D")
RAW_PREFIX = "__raw_"


def raw_name(column: str) -> str:
    """Name of the column holding a change value as it was read, before typing."""
    return f"{RAW_PREFIX}{column}"


def type_changes(
    raw: DataFrame, table: TableConfig, column_types: dict[str, str], flag_present: bool
) -> DataFrame:
    """Typed change rows plus `_cdc_reason` (null for a good row) and the raw values.

    `raw` holds the source columns as read (strings for csv/json, typed for parquet), the
    flag (or event op) column when present, the arrival columns, and for JSON lines the line
    (`_cdc_raw`) and the reason it could not be read (`_cdc_format_error`). Columns missing
    from the files are null.
    """
    available = set(raw.columns)
    projections: list[Column] = []
    for column, spark_type in column_types.items():
        source = F.col(f"`{column}`") if column in available else F.lit(None)
        projections.append(source.cast("string").alias(raw_name(column)))
        projections.append(source.try_cast(spark_type).alias(column))
    flag_source = table.flag_source
    if flag_present and flag_source in available:
        flag = F.upper(F.trim(F.col(f"`{flag_source}`").cast("string")))
        if table.insert_only:
            flag = F.coalesce(flag, F.lit("I"))  # events often carry no flag: an insert
        raw_flag = F.col(f"`{flag_source}`").cast("string")
    else:
        # An insert-only event table may land without a flag column: every row is an insert.
        flag = F.lit("I")
        raw_flag = F.lit(None).cast("string")
    projections += [flag.alias(FLAG), raw_flag.alias(raw_name(flag_source))]
    for column in (RAW, FORMAT_ERROR):
        value = F.col(column) if column in available else F.lit(None).cast("string")
        projections.append(value.alias(column))
    projections += [F.col(c) for c in ARRIVAL]
    typed = raw.select(*projections)
    if table.partition_column is not None and table.partition_expression is not None:
        typed = typed.withColumn(table.partition_column, F.expr(table.partition_expression))
    return typed.withColumn(REASON, quarantine_reason(table, column_types, typed.columns))


def quarantine_reason(
    table: TableConfig, column_types: dict[str, str], columns: Sequence[str]
) -> Column:
    """Why a typed change row cannot be applied, or null when it can; the first problem wins."""
    checks: list[Column] = [
        F.col(FORMAT_ERROR),
        F.when(
            F.col(FLAG).isNull() | ~F.col(FLAG).isin(*VALID_FLAGS),
            F.concat(
                F.lit(f"unknown flag in {table.flag_source}: '"),
                F.coalesce(F.col(raw_name(table.flag_source)), F.lit("null")),
                F.lit("' (expected I, U or D)"),
            ),
        ),
    ]
    if table.insert_only:
        checks.append(F.when(F.col(FLAG) == "D", F.lit("delete on an insert_only table")))
    for key in table.keys:
        checks.append(F.when(F.col(raw_name(key)).isNull(), F.lit(f"null key column {key}")))
    is_delete = F.col(FLAG) == "D"
    identity = set(table.keys) | set(table.sequence_by)
    for column, spark_type in column_types.items():
        unparsable = F.col(raw_name(column)).isNotNull() & F.col(column).isNull()
        if column not in identity:
            # A delete needs only its key and sequence; its other values are never used.
            unparsable = unparsable & ~is_delete
        checks.append(
            F.when(
                unparsable,
                F.concat(
                    F.lit(f"unparsable value in {column}: '"),
                    F.col(raw_name(column)),
                    F.lit(f"' is not a valid {spark_type}"),
                ),
            )
        )
    for column in table.sequence_by:
        checks.append(F.when(F.col(column).isNull(), F.lit(f"null sequence_by column {column}")))
    if table.partition_column is not None and table.partition_column in columns:
        checks.append(
            F.when(
                F.col(table.partition_column).isNull() & ~is_delete,
                F.lit(f"partition_expression gives null ({table.partition_expression})"),
            )
        )
    return F.coalesce(*checks)


def good_changes(typed: DataFrame, staging_columns: Sequence[str]) -> DataFrame:
    """Rows without a problem, as staging stores them."""
    return typed.filter(F.col(REASON).isNull()).select(*[F.col(c) for c in staging_columns])


def quarantined_changes(
    typed: DataFrame, table: TableConfig, column_types: dict[str, str]
) -> DataFrame:
    """Rows with a problem: their raw values as strings, the reason and where they came from."""
    raw_columns = [*column_types, table.flag_source]
    return typed.filter(F.col(REASON).isNotNull()).select(
        *[F.col(raw_name(c)).alias(c) for c in raw_columns],
        F.col(RAW),
        F.col(REASON),
        *[F.col(c) for c in ARRIVAL],
    )


def arrival_order() -> list[Column]:
    """Latest arrival first: later hour folder, then later file name, then later row."""
    return [F.col(c).desc() for c in ARRIVAL]


def latest_change_per_key(
    changes: DataFrame,
    keys: Sequence[str],
    sequence_by: Sequence[str],
    tiebreak: Sequence[Column] = (),
) -> DataFrame:
    """The latest change of every key: ROW_NUMBER over keys ORDER BY sequence_by DESC, arrival
    DESC (then `tiebreak`, for copies of the same change)."""
    order = [F.col(c).desc() for c in sequence_by] + arrival_order()
    if FLAG in changes.columns:
        # Equal sequence and arrival means the same change seen twice (staged and in final):
        # any copy is right, but the choice is made deterministic.
        order.append(F.col(FLAG).desc())
    order.extend(tiebreak)
    window = Window.partitionBy(*[F.col(k) for k in keys]).orderBy(*order)
    return (
        changes.withColumn("_cdc_rank", F.row_number().over(window))
        .filter(F.col("_cdc_rank") == 1)
        .drop("_cdc_rank")
    )


def latest_arrival_per_key_and_sequence(
    changes: DataFrame, keys: Sequence[str], sequence_by: Sequence[str]
) -> DataFrame:
    """One row per (key, sequence): the latest arrival, for insert-only tables."""
    window = Window.partitionBy(*[F.col(c) for c in [*keys, *sequence_by]]).orderBy(
        *arrival_order()
    )
    return (
        changes.withColumn("_cdc_rank", F.row_number().over(window))
        .filter(F.col("_cdc_rank") == 1)
        .drop("_cdc_rank")
    )
