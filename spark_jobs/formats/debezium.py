"""Debezium events, with or without the `schema`/`payload` wrapper: `op` c and r insert, u
updates, d deletes with the `before` image (or, without one, a top-level `key` object). A `u`
whose `before` key differs from its `after` key is a primary-key change: a D of the old key and
a U of the new one, from the same line. The sequence columns come from `source`; the column
types from Debezium's schema (Kafka Connect types and logical types)."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.columns import (
    BINLOG_FILE,
    BINLOG_POS,
    BINLOG_ROW,
    LSN,
    POSITION,
    SOURCE_TS_MS,
)
from cdc_pipeline.config import TableConfig
from spark_jobs.formats.json_lines import (
    change_struct,
    classified,
    image_at,
    line_error,
    named_map,
    no_changes,
    not_object,
    present_at,
    text_at,
    truncate_change,
    update_changes,
    without_placeholder,
    wrong_type,
)

# Kafka Connect types of Debezium's schema -> Spark SQL types.
CONNECT_TYPES = {
    "int8": "tinyint",
    "int16": "smallint",
    "int32": "int",
    "int64": "bigint",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "string",  # base64 text; declare a type in columns to convert it
}

# Milliseconds since the epoch as a timestamp. timestamp_millis fails the job on a value whose
# microseconds overflow a long; try_multiply makes that a null (an unparsable value) instead.
MILLIS = "timestamp_micros(try_multiply(try_cast({v} AS BIGINT), 1000))"

# Debezium / Kafka Connect logical types: Spark type and the SQL turning the JSON value into it.
LOGICAL_TYPES = {
    "io.debezium.time.Date": ("date", "date_add(DATE'1970-01-01', try_cast({v} AS INT))"),
    "org.apache.kafka.connect.data.Date": (
        "date",
        "date_add(DATE'1970-01-01', try_cast({v} AS INT))",
    ),
    "io.debezium.time.Timestamp": ("timestamp", MILLIS),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", MILLIS),
    "io.debezium.time.MicroTimestamp": (
        "timestamp",
        "timestamp_micros(try_cast({v} AS BIGINT))",
    ),
    "io.debezium.time.NanoTimestamp": (
        "timestamp",
        "timestamp_micros(try_cast({v} AS BIGINT) DIV 1000)",
    ),
    "io.debezium.time.ZonedTimestamp": ("timestamp", None),
}

# Debezium `source` fields read into format columns: path -> Spark type.
SOURCE_FIELDS = {
    "$.source.ts_ms": "bigint",
    "$.source.lsn": "bigint",
    "$.source.file": "string",
    "$.source.pos": "bigint",
    "$.source.row": "int",
}


def connect_type(description: str) -> str:
    """Spark SQL type of a Debezium schema field described as `type` or `type/logical name`."""
    physical, _, logical = description.partition("/")
    if logical in LOGICAL_TYPES:
        return LOGICAL_TYPES[logical][0]
    if logical == "org.apache.kafka.connect.data.Decimal":
        return "string"  # base64 bytes; use decimal.handling.mode=string or declare the column
    return CONNECT_TYPES.get(physical, "string")


def _debezium_types(v: Column, image_field: str) -> Column:
    """name -> 'type[/logical]' of the `image_field` struct in the line's Debezium schema."""
    fields = F.try_variant_get(v, "$.schema.fields", "array<variant>")
    entry = F.filter(
        fields, lambda f: F.try_variant_get(f, "$.field", "string") == F.lit(image_field)
    )[0]
    members = F.try_variant_get(entry, "$.fields", "array<variant>")
    # A schema Spark cannot read as name -> type gives no types: the values' own types are used.
    return named_map(
        F.transform(
            members,
            lambda m: F.struct(
                F.try_variant_get(m, "$.field", "string").alias("k"),
                F.concat_ws(
                    "/",
                    F.try_variant_get(m, "$.type", "string"),
                    F.try_variant_get(m, "$.name", "string"),
                ).alias("v"),
            ),
        )
    )


def parse_debezium(
    table: TableConfig, v: Column
) -> tuple[Column, Column, Column, dict[str, Column]]:
    payload = F.coalesce(F.variant_get(v, "$.payload", "variant"), v)
    is_object = F.coalesce(F.schema_of_variant(payload).startswith("OBJECT"), F.lit(False))
    op = text_at(payload, "$.op")
    status = F.try_variant_get(payload, "$.status", "string")
    before = image_at(payload, "$.before")
    after = without_placeholder(image_at(payload, "$.after"), table.unavailable_value)
    key = F.coalesce(image_at(v, "$.key"), image_at(payload, "$.key"))
    truncate = (op == "t") & F.lit(table.apply_truncates)
    kind = classified(
        [
            (v.isNull(), "malformed"),
            (F.is_variant_null(payload), "tombstone"),
            (~is_object, "malformed"),
            (status.isin("BEGIN", "END") & op.isNull(), "transaction"),
            (op.isNull(), "malformed"),
            (truncate, "event"),
            (op == "t", "truncate"),
            (~op.isin("c", "r", "u", "d"), "ignored"),
        ],
        "event",
    )
    error = (
        line_error(v, is_object)
        .when(
            op.isNull() & present_at(payload, "$.op"),
            F.lit("malformed Debezium event: op is not a JSON string"),
        )
        .when(op.isNull(), F.lit("malformed Debezium event: no op field"))
        .when(
            op.isin("c", "r", "u") & not_object(payload, "$.after"),
            F.lit("malformed Debezium event: after is not a JSON object"),
        )
        .when(
            op.isin("u", "d") & not_object(payload, "$.before"),
            F.lit("malformed Debezium event: before is not a JSON object"),
        )
        .when(
            op.isin("c", "r", "u") & after.isNull(),
            F.concat(
                F.lit("malformed Debezium event: op '"), op, F.lit("' without an after image")
            ),
        )
        .when(
            (op == "d") & before.isNull() & key.isNull(),
            F.lit("malformed Debezium event: delete without a before image or a key"),
        )
        .when(
            op.isin("c", "r", "u", "d") & not_object(payload, "$.source"),
            F.lit("malformed Debezium event: source is not a JSON object"),
        )
    )
    for path, spark_type in SOURCE_FIELDS.items():
        error = error.when(
            op.isin("c", "r", "u", "d", "t") & wrong_type(payload, path, spark_type),
            F.lit(f"malformed Debezium event: {path[2:]} is not a valid {spark_type}"),
        )
    kind = F.when((kind == "event") & error.isNotNull(), F.lit("malformed")).otherwise(kind)
    after_types = _debezium_types(v, "after")
    before_types = _debezium_types(v, "before")
    changes = _debezium_changes(
        table, op, truncate, (before, before_types), (after, after_types), key
    )
    source_ts, lsn, binlog_file, binlog_pos, binlog_row = (
        F.try_variant_get(payload, path, spark_type) for path, spark_type in SOURCE_FIELDS.items()
    )
    position = (
        F.when(lsn.isNotNull(), F.lpad(lsn.cast("string"), 20, "0"))
        .when(
            binlog_file.isNotNull(),
            F.concat_ws(
                ":",
                binlog_file,
                F.lpad(F.coalesce(binlog_pos, F.lit(0)).cast("string"), 20, "0"),
                F.lpad(F.coalesce(binlog_row, F.lit(0)).cast("string"), 10, "0"),
            ),
        )
        .otherwise(F.lit(""))
    )
    columns = {
        SOURCE_TS_MS: source_ts,
        LSN: lsn,
        BINLOG_FILE: binlog_file,
        BINLOG_POS: binlog_pos,
        BINLOG_ROW: binlog_row,
        POSITION: position,
    }
    return kind, error, changes, columns


def _debezium_changes(
    table: TableConfig,
    op: Column,
    truncate: Column,
    before: tuple[Column, Column],
    after: tuple[Column, Column],
    key: Column,
) -> Column:
    """A Debezium event's changes: c/r an insert of `after`, u an update (a key change: a
    delete of the old key too), d a delete of `before` (or of `key`), t a truncate."""
    before_image, before_types = before
    return (
        F.when(op.isin("c", "r"), F.array(change_struct("I", *after)))
        .when(op == "u", update_changes(*before, *after, table.keys))
        .when(
            op == "d",
            F.array(
                change_struct(
                    "D",
                    F.coalesce(before_image, key),
                    F.when(before_image.isNotNull(), before_types),
                )
            ),
        )
        .when(truncate, F.array(truncate_change()))
        .otherwise(no_changes())
    )
