"""Pure DataFrame transforms of the CDC steps: typing and checking change rows, ranking changes.

Spark SQL functions only (no Python UDFs), so executors need nothing but Spark.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

# The stored column names, re-exported: the steps import them from here with the transforms.
from cdc_pipeline.columns import ABSENT as ABSENT
from cdc_pipeline.columns import ARRIVAL as ARRIVAL
from cdc_pipeline.columns import BATCH as BATCH
from cdc_pipeline.columns import FILE as FILE
from cdc_pipeline.columns import FLAG as FLAG
from cdc_pipeline.columns import FORMAT_ERROR as FORMAT_ERROR
from cdc_pipeline.columns import RANK, SOURCE_TS_MS, TECHNICAL_PREFIX
from cdc_pipeline.columns import RAW as RAW
from cdc_pipeline.columns import REASON as REASON
from cdc_pipeline.columns import ROW as ROW
from cdc_pipeline.columns import quoted as quoted
from cdc_pipeline.config import EVENT_FORMATS, TableConfig
from cdc_pipeline.schema import normalize_type

VALID_FLAGS = ("I", "U", "D")
TRUNCATE = "T"  # an event format's truncate: every row ordered before it goes
# The columns an event carries (read frame), and staging's list of the data columns a change
# did not carry (null: it carried every column): such a column keeps the key's previous value.
CARRIED = "__carried"
RAW_PREFIX = "__raw_"
# A JSON row's image keys outside the declared columns (the read frame and the typed rows).
UNDECLARED = "__undeclared"
# The instants Python (datetime), pyarrow's conversions and so the driver-side steps can hold:
# 0001-01-01T00:00:00 and 9999-12-31T23:59:59.999999 UTC, as microseconds and days since the
# epoch. Spark holds far wider values; one of them in staging would fail every later run that
# reads the file statistics or collects keys and partition values.
MIN_MICROS, MAX_MICROS = -62135596800000000, 253402300799999999
MIN_DAYS, MAX_DAYS = -719162, 2932896
OUT_OF_RANGE = "is outside the years 0001 to 9999"
NOT_FINITE = "is not a finite number (NaN and infinities are refused)"
# Debezium's source time (epoch milliseconds) is a time too, for max_sequence_ahead.
EPOCH_MILLIS_COLUMNS = (SOURCE_TS_MS,)
TIME_TYPES = ("date", "timestamp", "timestamp_ntz")
FLOAT_TYPES = ("float", "double")


def persisted(frame: DataFrame) -> DataFrame:
    """`frame` persisted so that only plans built on the returned frame use the cached rows.

    Spark's cache is shared by every session of the application: on a warm Connect server, the
    rows a killed run persisted stay cached (nobody unpersists them), and any later plan equal
    to the cached one, from any run, would be answered from them. A landing file rewritten since
    would then be read with its old content. A filter that is always true but names a new token
    makes each persisted plan unique (the optimizer drops the filter; the cache lookup, which
    compares analysed plans, does not)."""
    # Not `token == token`: Spark warns about a trivially true equality on every such filter.
    return frame.filter(F.lit(uuid.uuid4().hex).isNotNull()).persist()


def unpersist_quietly(frame: DataFrame) -> None:
    """Unpersist `frame` while an error propagates: failing to (the Connect server gone) must
    not replace the error that ended the step."""
    with contextlib.suppress(Exception):
        frame.unpersist()


def raw_name(column: str) -> str:
    """Name of the column holding a change value as it was read, before typing."""
    return f"{RAW_PREFIX}{column}"


def columns_as_json(columns: Sequence[str]) -> Column:
    """The columns as one JSON text: deterministic, null-aware, the same for widened types. Change
    hashes (a snapshot's key and row hash, history's versions and key buckets) are taken of it."""
    return F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns]))


def compared_columns(columns: Sequence[str], skipped: Collection[str | None]) -> list[str]:
    """The columns a change is detected on, sorted: all but `skipped` and the `_cdc_` columns.

    The one rule behind a snapshot's row hash (`extracts.row_hash_columns`) and history's
    default tracked columns (`history.tracked_columns`); each passes the columns it skips."""
    return sorted(c for c in columns if c not in skipped and not c.startswith(TECHNICAL_PREFIX))


def hash_of(columns: Sequence[str]) -> Column:
    """MD5 of the columns as JSON text (`columns_as_json`)."""
    return F.md5(columns_as_json(columns))


def type_changes(
    raw: DataFrame,
    table: TableConfig,
    column_types: dict[str, str],
    *,
    flag_present: bool,
    columns: Sequence[str] | None = None,
) -> DataFrame:
    """Typed change rows plus `_cdc_reason` (null for a good row) and the raw values.

    `raw` holds the source columns as read (strings for csv/json, typed for parquet), the
    flag (or event op) column when present, the arrival columns, and for JSON lines the line
    (`_cdc_raw`) and the reason it could not be read (`_cdc_format_error`). Columns missing
    from the files are null. `columns`: `raw`'s, when known without asking Spark.
    """
    available = set(raw.columns if columns is None else columns)
    projections, names = _value_projections(table, column_types, available)  # names: no request
    flag_source = table.flag_source
    if flag_present and flag_source in available:
        flag = F.upper(F.trim(F.col(quoted(flag_source)).cast("string")))
        if table.insert_only:
            flag = F.coalesce(flag, F.lit("I"))  # events often carry no flag: an insert
        raw_flag = F.col(quoted(flag_source)).cast("string")
    else:
        # An insert-only event table may land without a flag column: every row is an insert.
        flag = F.lit("I")
        raw_flag = F.lit(None).cast("string")
    projections += [flag.alias(FLAG), raw_flag.alias(raw_name(flag_source))]
    names += [FLAG, raw_name(flag_source)]
    if CARRIED in available:
        projections.append(_absent(table, column_types, flag).alias(ABSENT))
        names.append(ABSENT)
    elif table.ignore_null_updates:
        projections.append(_null_as_absent(table, column_types, available, flag).alias(ABSENT))
        names.append(ABSENT)
    for column in (RAW, FORMAT_ERROR):
        value = F.col(column) if column in available else F.lit(None).cast("string")
        projections.append(value.alias(column))
        names.append(column)
    if UNDECLARED in available:
        projections.append(F.col(UNDECLARED))
        names.append(UNDECLARED)
    projections += [F.col(c) for c in ARRIVAL]
    names += ARRIVAL
    typed = raw.select(*projections)
    if table.partition_column is not None and table.partition_expression is not None:
        # Config SQL is data: checked again on what Spark resolves it to, before any write.
        from spark_jobs.rules.expression_check import check_partition_expression

        check_partition_expression(typed, table, names)
        typed = typed.withColumn(table.partition_column, F.expr(table.partition_expression))
        if table.partition_column not in names:  # (withColumn replaces one in place)
            names.append(table.partition_column)
    partition_type = None
    if table.partition_column is not None and table.partition_column in names:
        partition_type = typed.schema[table.partition_column].dataType.simpleString()
    return typed.withColumn(
        REASON,
        quarantine_reason(table, column_types, names, partition_type, datetime.now(UTC)),
    )


def _value_projections(
    table: TableConfig, column_types: dict[str, str], available: set[str]
) -> tuple[list[Column], list[str]]:
    """Each column's value as read (text) and typed, and their names."""
    projections: list[Column] = []
    names: list[str] = []
    for column, spark_type in column_types.items():
        source = F.col(quoted(column)) if column in available else F.lit(None)
        projections.append(source.cast("string").alias(raw_name(column)))
        projections.append(source.try_cast(spark_type).alias(column))
        names += [raw_name(column), column]
    for column in [*table.keys, *table.sequence_by]:
        if column not in column_types:
            # A batch of only malformed lines gives no column types at all: the rows are
            # quarantined for their line, and the identity checks need the columns to exist.
            projections.append(F.lit(None).cast("string").alias(raw_name(column)))
            projections.append(F.lit(None).cast("string").alias(column))
            names += [raw_name(column), column]
    return projections, names


def fillable(columns: Sequence[str], keys: Sequence[str]) -> list[str]:
    """The columns a change may leave out (and that then keep their value): data columns, not
    keys, not technical."""
    return [c for c in columns if c not in keys and not c.startswith(TECHNICAL_PREFIX)]


def absent_list() -> Column:
    """`_cdc_absent` as an array (empty when the change carried every column)."""
    return F.coalesce(F.col(ABSENT), F.array().cast("array<string>"))


def _absent(table: TableConfig, column_types: dict[str, str], flag: Column) -> Column:
    """The data columns an insert or update did not carry (an unchanged TOASTed value wal2json
    leaves out, a Debezium placeholder), as a sorted array; null when it carried them all.

    Every column staging has counts, not only the batch's: an hour whose updates all leave out
    a column still keeps its values."""
    names = sorted(fillable(list(column_types), table.keys))
    if not names:
        return F.lit(None).cast("array<string>")
    missing = F.filter(
        F.array(*[F.lit(n) for n in names]),
        lambda n: ~F.array_contains(F.col(CARRIED), n),
    )
    return F.when(flag.isin("I", "U") & (F.size(missing) > 0), missing).cast("array<string>")


def _null_as_absent(
    table: TableConfig, column_types: dict[str, str], available: set[str], flag: Column
) -> Column:
    """`ignore_null_updates`: the data columns an insert or update holds null in (or its file
    lacks), as a sorted array; null when it has a value in each."""
    names = sorted(fillable(list(column_types), table.keys))
    nulls = [
        F.when(F.col(quoted(n)).isNull(), F.lit(n)) if n in available else F.lit(n) for n in names
    ]
    if not nulls:
        return F.lit(None).cast("array<string>")
    missing = F.filter(F.array(*nulls), lambda n: n.isNotNull())
    return F.when(flag.isin("I", "U") & (F.size(missing) > 0), missing).cast("array<string>")


def _outside_years(value: Column, spark_type: str) -> Column:
    """True when a date or timestamp lies outside 0001-01-01 .. 9999-12-31T23:59:59.999999."""
    if spark_type == "date":
        days = F.unix_date(value)
        return (days < MIN_DAYS) | (days > MAX_DAYS)
    micros = F.unix_micros(value.cast("timestamp"))
    return (micros < MIN_MICROS) | (micros > MAX_MICROS)


def _not_finite(value: Column, spark_type: str) -> Column | None:
    """True when a float or double is NaN or infinite (`1e999`, `NaN`, `Infinity`, or a value
    beyond a float's range): final never holds a value no comparison or sum can use. None for
    other types (an integer or decimal too large for its type is already an unparsable value)."""
    if normalize_type(spark_type) not in FLOAT_TYPES:
        return None
    return F.isnan(value) | (F.abs(value) == F.lit(float("inf")))


def _rounded(column: str, spark_type: str) -> Column | None:
    """True when a decimal column's typed value is not its raw value (the cast rounded away
    digits past the scale: `1.005` into decimal(10,2) is 1.01); None for other types. Compared
    at scale 18: digits past the 18th decimal are not seen."""
    if not normalize_type(spark_type).startswith("decimal"):
        return None
    wide = "decimal(38,18)"
    return F.col(raw_name(column)).try_cast(wide) != F.col(column).cast(wide)


def _ahead_of(value: Column, spark_type: str, column: str, limit: datetime) -> Column | None:
    """True when a sequence value lies after `limit` (None: the column is not a time)."""
    if column in EPOCH_MILLIS_COLUMNS:
        return value > F.lit(int(limit.timestamp() * 1000))
    if spark_type in TIME_TYPES:
        return value.cast("timestamp") > F.lit(limit)
    return None


def _value_reason(problem: str, column: str, tail: str) -> Column:
    """`<problem> in <column>: '<raw value>' <tail>`: a quarantine reason quoting the raw text."""
    raw = F.make_valid_utf8(F.col(raw_name(column)))
    return F.concat(F.lit(f"{problem} in {column}: '"), raw, F.lit(f"' {tail}"))


# A partition value's folder is `<column>=<value>`, its characters escaped (up to 3 bytes each
# for / = % and the like): 200 bytes of value keep the folder name under the usual 255 bytes.
MAX_PARTITION_VALUE_BYTES = 200
# The folder name Hive-style partitioning writes for a null value (and reads back as null).
HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"


# A text sequence value that is an ISO-8601 time with a UTC offset other than zero: text order is
# time order only within one offset (a DST change, or two writers, mixes them), so such a value is
# refused rather than compared wrongly. A timestamp column compares instants.
OFFSET_TIME = (
    r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?\s*[+-](?!00(:?00)?$)\d{2}(:?\d{2})?$"
)
OFFSET_TIME_REASON = (
    "is a time with a UTC offset in a text sequence_by column: text order is not time order "
    "across offsets; declare the column as timestamp in columns (or send UTC times)"
)


def quarantine_reason(
    table: TableConfig,
    column_types: dict[str, str],
    columns: Sequence[str],
    partition_type: str | None = None,
    now: datetime | None = None,
) -> Column:
    """Why a typed change row cannot be applied, or null when it can; the first problem wins.

    `partition_type` is the partition column's type (its values are range-checked when it is a
    date or timestamp); `now` is when the stage runs, for `max_sequence_ahead` (default: now).
    """
    checks = _flag_and_key_checks(table)
    is_delete = F.col(FLAG).isin("D", TRUNCATE)  # a truncate carries no values at all
    identity = set(table.keys) | set(table.sequence_by)
    for column, spark_type in column_types.items():
        # A delete needs only its key and sequence; its other values are never used.
        used = F.lit(True) if column in identity else ~is_delete
        checks += _value_checks(column, spark_type, used)
    for column, spark_type in column_types.items():
        if spark_type in TIME_TYPES:
            # Also for a delete: its values are staged with it.
            checks.append(
                F.when(
                    _outside_years(F.col(column), spark_type),
                    _value_reason("value out of range", column, OUT_OF_RANGE),
                )
            )
    checks += _sequence_checks(table, column_types, now)
    if table.partition_column is not None and table.partition_column in columns:
        checks += _partition_checks(table, table.partition_column, partition_type, is_delete)
    return F.coalesce(*checks)


def _value_checks(column: str, spark_type: str, used: Column) -> list[Column]:
    """Why a value cannot be stored as sent: not valid UTF-8 text, not finite, unparsable, rounded,
    underflowing to zero, or a time truncated or shifted (`used`: the row needs the value)."""
    value, raw = F.col(column), F.col(raw_name(column))
    checks = []
    if normalize_type(spark_type) == "string":
        # A Parquet binary read as a string keeps its bytes: final must stay readable as UTF-8.
        invalid = ~F.is_valid_utf8(value)
        checks.append(F.when(invalid, _value_reason("invalid text", column, NOT_UTF8)))
    not_finite = _not_finite(value, spark_type)
    if not_finite is not None:
        # Also for a delete: its values are staged with it.
        checks.append(F.when(not_finite, _value_reason("value out of range", column, NOT_FINITE)))
    unparsable = raw.isNotNull() & value.isNull() & used
    checks.append(
        F.when(
            unparsable, _value_reason("unparsable value", column, f"is not a valid {spark_type}")
        )
    )
    rounded = _rounded(column, spark_type)
    if rounded is not None:
        reason = f"has more decimal places than {spark_type} holds (never rounded)"
        checks.append(F.when(rounded & used, _value_reason("value out of range", column, reason)))
    if normalize_type(spark_type) in FLOAT_TYPES:
        underflow = (value == 0) & F.regexp_extract(raw, UNSIGNED_MANTISSA, 1).rlike("[1-9]")
        reason = f"is too small for a {spark_type} (never rounded to zero)"
        checks.append(F.when(underflow & used, _value_reason("value out of range", column, reason)))
    for problem, reason in _time_losses(column, spark_type):
        lost = problem & value.isNotNull() & used
        checks.append(F.when(lost, _value_reason("value out of range", column, reason)))
    return checks


# A number's digits before its exponent: underflow is a zero typed from digits that are not.
UNSIGNED_MANTISSA = r"^\s*[+-]?([0-9.]*)"
NOT_UTF8 = "is not valid UTF-8 text (its bytes that are not are U+FFFD here)"
# A time's fraction past the microsecond that is not zero: Spark would truncate it.
SUB_MICROSECOND = r"\d:\d{2}[.,]\d{6}\d*[1-9]"
# The text after a date (a time of day), and the zone after a time of day.
AFTER_DATE = r"^\s*[+-]?\d+-\d{1,2}-\d{1,2}(.*?)\s*$"
MIDNIGHT_UTC = r"^([T ]00:00(:00([.,]0*)?)?\s*(Z|UTC|[+-]00(:?00)?)?)?$"
AFTER_TIME = r"\d:\d{2}(?::\d{2}(?:[.,]\d*)?)?\s*(\S.*?)?\s*$"
UTC_ZONE = r"^(Z|UTC|GMT|[+-]00(:?00)?)?$"


def _time_losses(column: str, spark_type: str) -> list[tuple[Column, str]]:
    """(problem, reason) for a time Spark would truncate or shift on the way in: digits past the
    microsecond, a time of day sent to a date, a UTC offset sent to a timestamp_ntz."""
    raw = F.col(raw_name(column))
    kind = normalize_type(spark_type)
    losses = []
    if kind in ("timestamp", "timestamp_ntz"):
        losses.append(
            (
                raw.rlike(SUB_MICROSECOND),
                f"is more precise than a {kind} holds (microseconds; never truncated)",
            )
        )
    if kind == "date":
        time_of_day = F.regexp_extract(raw, AFTER_DATE, 1)
        losses.append(
            (
                raw.rlike(AFTER_DATE) & ~time_of_day.rlike(MIDNIGHT_UTC),
                "has a time of day, which a date does not hold (never dropped); declare the "
                "column as timestamp",
            )
        )
    if kind == "timestamp_ntz":
        zone = F.regexp_extract(raw, AFTER_TIME, 1)
        losses.append(
            (
                raw.rlike(AFTER_TIME) & ~zone.rlike(UTC_ZONE),
                "has a UTC offset or time zone, which a timestamp_ntz does not hold (never "
                "dropped); declare the column as timestamp, or send times without one",
            )
        )
    return losses


def _sequence_checks(
    table: TableConfig, column_types: dict[str, str], now: datetime | None
) -> list[Column]:
    """A null sequence value, a text time with an offset, one too far ahead of the stage run."""
    checks: list[Column] = []
    for column in table.sequence_by:
        checks.append(F.when(F.col(column).isNull(), F.lit(f"null sequence_by column {column}")))
        if column_types.get(column) == "string":
            checks.append(
                F.when(
                    F.col(column).rlike(OFFSET_TIME),
                    _value_reason("ambiguous sequence value", column, OFFSET_TIME_REASON),
                )
            )
    if table.max_sequence_ahead is not None:
        staged_at = now or datetime.now(UTC)
        # A literal, not current_timestamp(): every action over the rows sees the same limit.
        limit = staged_at + table.max_sequence_ahead.delta
        for column in table.sequence_by:
            ahead = _ahead_of(F.col(column), column_types.get(column, ""), column, limit)
            if ahead is not None:
                checks.append(
                    F.when(
                        ahead,
                        _value_reason(
                            "sequence value too far ahead",
                            column,
                            f"is more than max_sequence_ahead {table.max_sequence_ahead} after the stage "
                            f"run at {staged_at:%Y-%m-%d %H:%M:%S} UTC",
                        ),
                    )
                )
    return checks


def _flag_and_key_checks(table: TableConfig) -> list[Column]:
    """The line's format error, an unknown flag, a delete on an insert-only table, a null key
    (a truncate has none)."""
    flags = [*VALID_FLAGS, TRUNCATE] if table.change_format in EVENT_FORMATS else VALID_FLAGS
    is_truncate = F.col(FLAG) == TRUNCATE
    checks: list[Column] = [
        F.col(FORMAT_ERROR),
        F.when(
            F.col(FLAG).isNull() | ~F.col(FLAG).isin(*flags),
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
        null_key = F.col(raw_name(key)).isNull() & ~is_truncate
        checks.append(F.when(null_key, F.lit(f"null key column {key}")))
    return checks


def _partition_checks(
    table: TableConfig, column: str, partition_type: str | None, is_delete: Column
) -> list[Column]:
    """Why a change's partition value cannot be written: null, empty, too long, out of range."""
    checks: list[Column] = []
    partition = F.col(column)
    checks.append(
        F.when(
            partition.isNull() & ~is_delete,
            F.lit(f"partition_expression gives null ({table.partition_expression})"),
        )
    )
    text = partition.cast("string")
    checks.append(
        F.when(
            (text == "") & ~is_delete,
            F.lit(
                f"partition_expression gives an empty string ({table.partition_expression}): "
                "a partition folder cannot hold it (Hive-style partitions read it back as "
                "null); make it give a value, for example coalesce(nullif(X, ''), 'none')"
            ),
        )
    )
    checks.append(
        F.when(
            (text == HIVE_DEFAULT_PARTITION) & ~is_delete,
            F.lit(
                f"partition_expression gives {HIVE_DEFAULT_PARTITION} "
                f"({table.partition_expression}): Hive-style partitions read that folder name "
                "back as null; make it give another value"
            ),
        )
    )
    checks.append(
        F.when(
            (F.octet_length(text) > MAX_PARTITION_VALUE_BYTES) & ~is_delete,
            F.lit(
                f"partition_expression gives a value longer than {MAX_PARTITION_VALUE_BYTES} "
                f"bytes ({table.partition_expression}): a partition folder name is at most "
                "255 bytes; make it give a shorter value, for example substring(X, 1, 100)"
            ),
        )
    )
    if partition_type in TIME_TYPES:
        checks.append(
            F.when(
                _outside_years(partition, partition_type),
                F.concat(
                    F.lit(f"value out of range in {table.partition_column}: '"),
                    partition.cast("string"),
                    F.lit(f"' {OUT_OF_RANGE} ({table.partition_expression})"),
                ),
            )
        )
    return checks


def good_changes(typed: DataFrame, staging_columns: Sequence[str]) -> DataFrame:
    """Rows without a problem, as staging stores them."""
    return typed.filter(F.col(REASON).isNull()).select(*[F.col(c) for c in staging_columns])


def quarantined_changes(
    typed: DataFrame, table: TableConfig, column_types: dict[str, str]
) -> DataFrame:
    """Rows with a problem: their raw values as strings, the reason and where they came from."""
    raw_columns = [*column_types, table.flag_source]
    # Quarantine is read by users too: text that is not UTF-8 is kept with U+FFFD for its bytes.
    return typed.filter(F.col(REASON).isNotNull()).select(
        *[F.make_valid_utf8(F.col(raw_name(c))).alias(c) for c in raw_columns],
        F.col(RAW),
        F.col(REASON),
        *[F.col(c) for c in ARRIVAL],
    )


def arrival_order() -> list[Column]:
    """Latest arrival first: later hour folder, then later file name, then later row."""
    return [F.col(c).desc() for c in ARRIVAL]


def ranking_columns(columns: Sequence[str], sequence_by: Sequence[str]) -> list[str]:
    """The columns a key's changes are ordered by, each latest (descending) first: sequence_by,
    arrival, the flag (when `columns` hold it). One rule for the Column and the SQL text forms."""
    order = [*sequence_by, *ARRIVAL]
    if FLAG in columns:
        # Equal sequence and arrival means the same change seen twice (staged and in final):
        # any copy is right, but the choice is made deterministic.
        order.append(FLAG)
    return order


def ranking_order(
    columns: Sequence[str], sequence_by: Sequence[str], tiebreak: Sequence[Column] = ()
) -> list[Column]:
    """The order of a key's changes, latest first: `ranking_columns`, then `tiebreak`."""
    return [F.col(quoted(c)).desc() for c in ranking_columns(columns, sequence_by)] + list(tiebreak)


def latest_change_per_key(
    changes: DataFrame,
    keys: Sequence[str],
    sequence_by: Sequence[str],
    tiebreak: Sequence[Column] = (),
    columns: Sequence[str] | None = None,
) -> DataFrame:
    """The latest change of every key: ROW_NUMBER over keys ORDER BY sequence_by DESC, arrival
    DESC (then `tiebreak`, for copies of the same change). `columns`: the frame's, when known
    without asking Spark."""
    order = ranking_order(changes.columns if columns is None else columns, sequence_by, tiebreak)
    window = Window.partitionBy(*[F.col(k) for k in keys]).orderBy(*order)
    return changes.withColumn(RANK, F.row_number().over(window)).filter(F.col(RANK) == 1).drop(RANK)


def latest_arrival_per_key_and_sequence(
    changes: DataFrame, keys: Sequence[str], sequence_by: Sequence[str]
) -> DataFrame:
    """One row per (key, sequence): the latest arrival, for insert-only tables."""
    window = Window.partitionBy(*[F.col(c) for c in [*keys, *sequence_by]]).orderBy(
        *arrival_order()
    )
    return changes.withColumn(RANK, F.row_number().over(window)).filter(F.col(RANK) == 1).drop(RANK)
