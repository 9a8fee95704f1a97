"""JSON change formats read into one shape: flat FLAG rows, Debezium events, wal2json v2 lines.

Every line is parsed once with Spark SQL's `try_parse_json` (a VARIANT), so a line that is not
JSON is kept and quarantined, not lost. Each line becomes zero, one or two change rows:

- flat: the object is the row image; its flag column says I, U or D.
- debezium (with or without the `schema`/`payload` wrapper): `op` c and r insert, u updates,
  d deletes with the `before` image (or, without one, a top-level `key` object). A `u` whose
  `before` key differs from its `after` key is a primary-key change: a D of the old key and a
  U of the new one, from the same line, so the same run applies both. The sequence columns come
  from `source`: `_cdc_source_ts_ms`, `_cdc_lsn` (PostgreSQL), `_cdc_binlog_file`,
  `_cdc_binlog_pos` and `_cdc_binlog_row` (MySQL), and `_cdc_position`, a text that sorts in the
  connector's order (zero-padded LSN, or binlog file:pos:row).
- wal2json (format-version 2): `action` I, U, D with `columns` and `identity`; an update whose
  identity key differs from its new key is a primary-key change as above. `_cdc_lsn` is the
  line's `lsn` as a number and `_cdc_position` its zero-padded text ('' when absent).

Transaction markers (Debezium BEGIN/END, wal2json B/C), Kafka tombstones (a `null` line) and
unknown actions are counted and skipped.

A line of any shape never fails the batch: every value is read with `try_variant_get` (null
when it has another shape), maps are built only from distinct, non-null names, and a line that
is not valid UTF-8, not JSON, not an object, or whose fields have the wrong shape becomes a
quarantine row with the line in `_cdc_raw` and the reason. The column types come from `columns` when declared,
else from the format (Debezium's schema, wal2json's types), else from the JSON values.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.columns import (
    BINLOG_FILE,
    BINLOG_POS,
    BINLOG_ROW,
    LSN,
    POSITION,
    SOURCE_TS_MS,
    TECHNICAL_PREFIX,
)
from cdc_pipeline.config import COLUMN_PATTERN, EVENT_FORMATS, TableConfig
from cdc_pipeline.schema import common_type, normalize_type
from spark_jobs.rules.transforms import ARRIVAL, CARRIED, FORMAT_ERROR, RAW, UNDECLARED, persisted

KIND = "__kind"
CHANGES = "__changes"
OP = "__op"
IMAGE = "__image"
TYPES = "__types"
LINE = "value"
NOT_UTF8 = "malformed line: not valid UTF-8 text (its bytes that are not are U+FFFD in _cdc_raw)"

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
# PostgreSQL type names as wal2json writes them -> Spark SQL types (others: string).
POSTGRES_TYPES = {
    "smallint": "smallint",
    "int2": "smallint",
    "integer": "int",
    "int": "int",
    "int4": "int",
    "bigint": "bigint",
    "int8": "bigint",
    "real": "float",
    "float4": "float",
    "double precision": "double",
    "float8": "double",
    "boolean": "boolean",
    "bool": "boolean",
    "date": "date",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamp",
    "timestamp": "timestamp",
    "timestamptz": "timestamp",
    "numeric": "decimal(38,18)",
    "decimal": "decimal(38,18)",
}


# Debezium `source` fields read into format columns: path -> Spark type.
SOURCE_FIELDS = {
    "$.source.ts_ms": "bigint",
    "$.source.lsn": "bigint",
    "$.source.file": "string",
    "$.source.pos": "bigint",
    "$.source.row": "int",
}


@dataclass
class ChangeRead:
    """Change rows as read: string values per column, the op, format columns, arrival."""

    frame: DataFrame
    batch_types: dict[str, str | None]  # column -> type the files give (None: only nulls)
    ignored: dict[str, int] = field(default_factory=dict)
    undeclared: list[str] = field(default_factory=list)
    # The rows carry their keys outside the declared columns (`UNDECLARED`): `undeclared` is
    # known once a pass over the rows has gathered them.
    carries_undeclared: bool = False
    cached: DataFrame | None = None  # the parsed lines, held while the batch is processed

    def release(self) -> None:
        """Drop the cached parse once the step is done with the rows."""
        if self.cached is not None:
            self.cached.unpersist()


def postgres_type(name: str) -> str:
    """Spark SQL type of a PostgreSQL type name such as `numeric(12,2)` or `character varying(20)`."""
    text = name.strip().lower()
    numeric = re.match(r"^(?:numeric|decimal)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$", text)
    if numeric:
        return f"decimal({numeric.group(1)},{numeric.group(2) or 0})"
    base = re.sub(r"\(.*?\)", "", text).strip()
    base = " ".join(base.split())
    return POSTGRES_TYPES.get(base, "string")


def connect_type(description: str) -> str:
    """Spark SQL type of a Debezium schema field described as `type` or `type/logical name`."""
    physical, _, logical = description.partition("/")
    if logical in LOGICAL_TYPES:
        return LOGICAL_TYPES[logical][0]
    if logical == "org.apache.kafka.connect.data.Decimal":
        return "string"  # base64 bytes; use decimal.handling.mode=string or declare the column
    return CONNECT_TYPES.get(physical, "string")


def variant_type(description: str | None) -> str | None:
    """Spark SQL type for the values of a column from `schema_of_variant_agg` (None: all null)."""
    if description is None or description.upper() == "VOID":
        return None
    upper = description.upper()
    if upper.startswith(("OBJECT", "ARRAY", "VARIANT")):
        return "string"  # nested values are kept as JSON text
    if upper.startswith("DECIMAL"):
        return "double"  # JSON numbers with a fraction, as Spark's JSON reader infers them
    return normalize_type(description)


def _key_text(image: Column, keys: Sequence[str]) -> Column:
    """The key of an image as one comparable text (null when the image has no key at all)."""
    parts = [F.variant_get(image[k], "$", "string") for k in keys]
    present = reduce(lambda a, b: a | b, [p.isNotNull() for p in parts])
    return F.when(present, F.to_json(F.array(*parts)))


def _update(
    old_image: Column, old_types: Column, new_image: Column, new_types: Column, keys: Sequence[str]
) -> Column:
    """An update's changes: a U of the new image, preceded by a D of the old key when it differs."""
    old_key, new_key = _key_text(old_image, keys), _key_text(new_image, keys)
    key_changed = old_image.isNotNull() & old_key.isNotNull() & (old_key != new_key)
    return F.when(
        key_changed,
        F.array(_change("D", old_image, old_types), _change("U", new_image, new_types)),
    ).otherwise(F.array(_change("U", new_image, new_types)))


# Spark's JSON parser (Jackson) refuses nesting deeper than this, even in a field the config
# ignores: such a line is quarantined, saying so rather than "not JSON".
MAX_JSON_DEPTH = 1000
TOO_DEEP = f"malformed line: nested deeper than {MAX_JSON_DEPTH} levels (Spark's JSON parser limit)"


def _too_deep(v: Column) -> Column:
    """True for an unparsed line that opens more than MAX_JSON_DEPTH arrays or objects."""
    opened = F.length(F.regexp_replace(F.col(LINE), r"[^\[{]", ""))
    return v.isNull() & (opened > MAX_JSON_DEPTH)


def _line_error(v: Column, is_object: Column) -> Column:
    """The reason a line is not a JSON object (start of a format's error chain)."""
    return (
        F.when(_too_deep(v), F.lit(TOO_DEEP))
        .when(v.isNull(), F.lit("malformed line: not JSON"))
        .when(~is_object, F.lit("malformed line: not a JSON object"))
    )


# A line's structure: escapes removed, then every string emptied, so brackets and values show.
NO_ESCAPES = r"\\."
STRINGS = r'"[^"]*"'
# A closing bracket followed by anything a JSON value never has there: a second value, text.
AFTER_CLOSE = r"[}\]]\s*[^,}\]\s]"
NON_NUMBER = r"(?<![\w.])[+-]?(NaN|Infinity|INF)(?!\w)"
LONE_SURROGATE = (
    r"(?i)\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})"
    r"|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}"
)
TRAILING = "malformed line: text after its JSON value (one JSON value per line)"
NAN_LITERAL = "malformed line: NaN or Infinity, which is not a JSON number (send null or text)"
SURROGATE = "malformed line: a \\u escape is a lone UTF-16 surrogate, not a character"
DUPLICATE = "malformed line: a field is named more than once in one object"


def _strict_reason(v: Column) -> Column:
    """Why a line is not exactly one JSON value, beyond Spark's parse (null when it is): Spark
    reads the first value of `{..}{..}` and drops the rest; an unparsed line says what in it is
    not JSON (a NaN literal, a lone surrogate, a repeated field) rather than "not JSON"."""
    line = F.col(LINE)
    structure = F.regexp_replace(F.regexp_replace(line, NO_ESCAPES, ""), STRINGS, '""')

    def count(characters: str) -> Column:
        return F.length(F.regexp_replace(structure, f"[^{characters}]", ""))

    unbalanced = (count("{") != count("}")) | (count(r"\[") != count(r"\]"))
    keys = F.expr(f"json_object_keys({LINE})")
    return (
        F.when(v.isNotNull() & (structure.rlike(AFTER_CLOSE) | unbalanced), F.lit(TRAILING))
        .when(v.isNotNull() | _too_deep(v), F.lit(None))
        .when(line.rlike(LONE_SURROGATE), F.lit(SURROGATE))
        .when(structure.rlike(NON_NUMBER), F.lit(NAN_LITERAL))
        .when(F.size(keys) != F.size(F.array_distinct(keys)), F.lit(DUPLICATE))
    )


def _change(op: str | Column, image: Column, types: Column) -> Column:
    return F.struct(
        (F.lit(op) if isinstance(op, str) else op).alias(OP),
        image.alias(IMAGE),
        types.alias(TYPES),
    )


IMAGE_TYPE = "map<string,variant>"


def _no_changes() -> Column:
    return F.array().cast(
        f"array<struct<{OP}:string,{IMAGE}:{IMAGE_TYPE},{TYPES}:map<string,string>>>"
    )


def _truncate() -> Column:
    """A truncate: no image; it removes every row whose change is ordered before it."""
    return _change("T", F.create_map().cast(IMAGE_TYPE), F.lit(None).cast("map<string,string>"))


def _without_placeholder(image: Column, placeholder: str) -> Column:
    """An image without the values Debezium could not read (its `unavailable.value.placeholder`:
    an unchanged TOASTed value), so they count as not carried; as text, as the base64 of a
    bytea column, or as the only element of an array."""
    texts = [placeholder, base64.b64encode(placeholder.encode()).decode()]
    return F.map_filter(
        image,
        lambda _, v: (
            ~F.coalesce(
                F.variant_get(v, "$", "string").isin(*texts)
                | (F.to_json(v) == json.dumps([placeholder])),
                F.lit(False),
            )
        ),
    )


def _image(variant: Column, path: str) -> Column:
    """The object at `path` as name -> value; null when absent or not an object (never fails)."""
    return F.try_variant_get(variant, path, "map<string,variant>")


def _present(variant: Column, path: str) -> Column:
    """True when `path` holds a value other than JSON null."""
    value = F.variant_get(variant, path, "variant")
    return F.coalesce(value.isNotNull() & ~F.is_variant_null(value), F.lit(False))


def _not_object(variant: Column, path: str) -> Column:
    """True when `path` holds a value that is not a JSON object (absent or null: False)."""
    value = F.variant_get(variant, path, "variant")
    return _present(variant, path) & ~F.schema_of_variant(value).startswith("OBJECT")


def _wrong_type(variant: Column, path: str, spark_type: str) -> Column:
    """True when `path` holds a value that cannot be read as `spark_type` (1e30 as a bigint)."""
    return _present(variant, path) & F.try_variant_get(variant, path, spark_type).isNull()


def _text(variant: Column, path: str) -> Column:
    """The JSON string at `path`; null when absent or another kind of value (an object op)."""
    value = F.variant_get(variant, path, "variant")
    return F.when(F.schema_of_variant(value) == "STRING", F.variant_get(value, "$", "string"))


def _named_map(entries: Column) -> Column:
    """map_from_entries of (`k`, `v`) structs, null when a name is null or repeated: Spark fails
    the whole job on either (NULL_MAP_KEY, DUPLICATED_MAP_KEY), so they must never reach it."""
    names = F.transform(entries, lambda e: e["k"])
    valid = ~F.exists(names, lambda n: n.isNull()) & (
        F.size(F.array_distinct(names)) == F.size(names)
    )
    return F.when(valid, F.map_from_entries(entries))


def _classified(kind_cases: list[tuple[Column, str]], default: str) -> Column:
    result = F.lit(default)
    for condition, kind in reversed(kind_cases):
        result = F.when(condition, F.lit(kind)).otherwise(result)
    return result


def _parse_flat(table: TableConfig, v: Column) -> tuple[Column, Column, Column, dict[str, Column]]:
    is_object = F.coalesce(F.schema_of_variant(v).startswith("OBJECT"), F.lit(False))
    # A Kafka message with a null value (a tombstone, for log compaction) is no change.
    tombstone = [(F.is_variant_null(v), "tombstone")] if table.source == "kafka" else []
    kind = _classified([*tombstone, (v.isNull() | ~is_object, "malformed")], "event")
    error = F.when(_too_deep(v), F.lit(TOO_DEEP)).when(
        kind == "malformed", F.lit("malformed line: not a JSON object")
    )
    image = _image(v, "$")
    flag = F.variant_get(image[table.flag_column], "$", "string")
    changes = F.array(_change(flag, image, F.lit(None).cast("map<string,string>")))
    return kind, error, changes, {}


def _debezium_types(v: Column, image_field: str) -> Column:
    """name -> 'type[/logical]' of the `image_field` struct in the line's Debezium schema."""
    fields = F.try_variant_get(v, "$.schema.fields", "array<variant>")
    entry = F.filter(
        fields, lambda f: F.try_variant_get(f, "$.field", "string") == F.lit(image_field)
    )[0]
    members = F.try_variant_get(entry, "$.fields", "array<variant>")
    # A schema Spark cannot read as name -> type gives no types: the values' own types are used.
    return _named_map(
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


def _parse_debezium(
    table: TableConfig, v: Column
) -> tuple[Column, Column, Column, dict[str, Column]]:
    payload = F.coalesce(F.variant_get(v, "$.payload", "variant"), v)
    is_object = F.coalesce(F.schema_of_variant(payload).startswith("OBJECT"), F.lit(False))
    op = _text(payload, "$.op")
    status = F.try_variant_get(payload, "$.status", "string")
    before = _image(payload, "$.before")
    after = _without_placeholder(_image(payload, "$.after"), table.unavailable_value)
    key = F.coalesce(_image(v, "$.key"), _image(payload, "$.key"))
    truncate = (op == "t") & F.lit(table.apply_truncates)
    kind = _classified(
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
        _line_error(v, is_object)
        .when(
            op.isNull() & _present(payload, "$.op"),
            F.lit("malformed Debezium event: op is not a JSON string"),
        )
        .when(op.isNull(), F.lit("malformed Debezium event: no op field"))
        .when(
            op.isin("c", "r", "u") & _not_object(payload, "$.after"),
            F.lit("malformed Debezium event: after is not a JSON object"),
        )
        .when(
            op.isin("u", "d") & _not_object(payload, "$.before"),
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
            op.isin("c", "r", "u", "d") & _not_object(payload, "$.source"),
            F.lit("malformed Debezium event: source is not a JSON object"),
        )
    )
    for path, spark_type in SOURCE_FIELDS.items():
        error = error.when(
            op.isin("c", "r", "u", "d", "t") & _wrong_type(payload, path, spark_type),
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
        F.when(op.isin("c", "r"), F.array(_change("I", *after)))
        .when(op == "u", _update(*before, *after, table.keys))
        .when(
            op == "d",
            F.array(
                _change(
                    "D",
                    F.coalesce(before_image, key),
                    F.when(before_image.isNotNull(), before_types),
                )
            ),
        )
        .when(truncate, F.array(_truncate()))
        .otherwise(_no_changes())
    )


def _wal2json_image(v: Column, path: str) -> tuple[Column, Column, Column]:
    """(name -> value, name -> type, malformed) of a wal2json `columns` or `identity` array.

    `malformed` is true when the path holds something other than an array of objects with
    distinct names; the maps are then null.
    """
    entries = F.try_variant_get(v, path, "array<variant>")
    image = _named_map(
        F.transform(
            entries,
            lambda c: F.struct(
                F.try_variant_get(c, "$.name", "string").alias("k"),
                F.variant_get(c, "$.value", "variant").alias("v"),
            ),
        )
    )
    types = _named_map(
        F.transform(
            entries,
            lambda c: F.struct(
                F.try_variant_get(c, "$.name", "string").alias("k"),
                F.try_variant_get(c, "$.type", "string").alias("v"),
            ),
        )
    )
    return image, types, _present(v, path) & image.isNull()


def lsn_number(text: Column) -> Column:
    """A PostgreSQL LSN 'X/Y' (hex) as a number."""
    parts = F.split(text, "/")
    high = F.conv(parts[0], 16, 10).cast("bigint")
    low = F.conv(parts[1], 16, 10).cast("bigint")
    return F.when(F.size(parts) == 2, high * F.lit(4294967296) + low)


def _parse_wal2json(
    table: TableConfig, v: Column
) -> tuple[Column, Column, Column, dict[str, Column]]:
    is_object = F.coalesce(F.schema_of_variant(v).startswith("OBJECT"), F.lit(False))
    action = _text(v, "$.action")
    new_image, new_types, new_malformed = _wal2json_image(v, "$.columns")
    old_image, old_types, old_malformed = _wal2json_image(v, "$.identity")
    truncate = (action == "T") & F.lit(table.apply_truncates)
    kind = _classified(
        [
            (v.isNull() | ~is_object, "malformed"),
            (action.isin("B", "C"), "transaction"),
            (action.isNull(), "malformed"),
            (truncate, "event"),
            (action == "T", "truncate"),
            (~action.isin("I", "U", "D"), "ignored"),
        ],
        "event",
    )
    error = (
        _line_error(v, is_object)
        .when(
            action.isNull() & _present(v, "$.action"),
            F.lit("malformed wal2json line: action is not a JSON string"),
        )
        .when(action.isNull(), F.lit("malformed wal2json line: no action field"))
        .when(
            action.isin("I", "U") & new_malformed,
            F.lit(
                "malformed wal2json line: columns is not an array of objects with distinct names"
            ),
        )
        .when(
            action.isin("U", "D") & old_malformed,
            F.lit(
                "malformed wal2json line: identity is not an array of objects with distinct names"
            ),
        )
        .when(
            action.isin("I", "U") & new_image.isNull(),
            F.concat(F.lit("malformed wal2json line: action "), action, F.lit(" without columns")),
        )
        .when(
            (action == "D") & old_image.isNull(),
            F.lit("malformed wal2json line: action D without identity"),
        )
    )
    kind = F.when((kind == "event") & error.isNotNull(), F.lit("malformed")).otherwise(kind)
    changes = _wal2json_changes(
        table, action, truncate, (new_image, new_types), (old_image, old_types)
    )
    lsn_text = F.try_variant_get(v, "$.lsn", "string")
    lsn = lsn_number(lsn_text)
    columns = {
        LSN: lsn,
        POSITION: F.coalesce(F.lpad(lsn.cast("string"), 20, "0"), F.lit("")),
    }
    return kind, error, changes, columns


def _wal2json_changes(
    table: TableConfig,
    action: Column,
    truncate: Column,
    new: tuple[Column, Column],
    old: tuple[Column, Column],
) -> Column:
    """A wal2json line's changes from its (image, types) of `columns` and of `identity`."""
    return (
        F.when(action == "I", F.array(_change("I", *new)))
        .when(action == "U", _update(*old, *new, table.keys))
        .when(action == "D", F.array(_change("D", *old)))
        .when(truncate, F.array(_truncate()))
        .otherwise(_no_changes())
    )


PARSERS = {
    "flat": _parse_flat,
    "snapshot": _parse_flat,  # a full extract: flat rows without a flag
    "debezium": _parse_debezium,
    "wal2json": _parse_wal2json,
}


def read_json_changes(spark: SparkSession, table: TableConfig, lines: DataFrame) -> ChangeRead:
    """Change rows of JSON-lines files: `lines` holds `value` (one line) and the arrival columns."""
    v = F.try_parse_json(F.col(LINE))
    kind, error, changes, format_columns = PARSERS[table.change_format](table, v)
    # Spark keeps a text line's bytes as they are; JSON parsing would turn bytes that are not
    # UTF-8 into U+FFFD silently, so such a line is quarantined instead (its raw text made valid).
    utf8 = F.is_valid_utf8(F.col(LINE))
    strict = _strict_reason(v)
    kind = F.when(~utf8 | strict.isNotNull(), F.lit("malformed")).otherwise(kind)
    error = F.when(~utf8, F.lit(NOT_UTF8)).when(strict.isNotNull(), strict).otherwise(error)
    parsed = lines.filter(F.trim(F.col(LINE)) != "").select(
        F.col(LINE),
        *[F.col(c) for c in ARRIVAL],
        kind.alias(KIND),
        error.alias(FORMAT_ERROR),
        changes.alias(CHANGES),
        *[expr.alias(name) for name, expr in format_columns.items()],
    )
    if not _rows_read_once(table):
        parsed = persisted(parsed)  # several passes: parse the lines once
    ignored = _skipped_counts(table, parsed)
    # An event line gives a row per change; a malformed line one row (no image) with its text.
    malformed = F.col(KIND) == "malformed"
    rows = (
        parsed.filter(F.col(KIND).isin("event", "malformed"))
        .select(
            "*",
            F.posexplode_outer(F.when(~malformed, F.col(CHANGES))).alias("__at", "__change"),
        )
        .filter(malformed | F.col("__at").isNotNull())
        .select(
            F.col(f"__change.{OP}").alias(OP),
            F.col(f"__change.{IMAGE}").alias(IMAGE),
            F.col(f"__change.{TYPES}").alias(TYPES),
            F.map_keys(F.col(f"__change.{IMAGE}")).alias(CARRIED),
            F.when(malformed, F.make_valid_utf8(F.col(LINE))).alias(RAW),
            F.when(malformed, F.col(FORMAT_ERROR)).alias(FORMAT_ERROR),
            *([F.col(LINE).alias(SOURCE_LINE)] if _exact_text_columns(table) else []),
            *[F.col(name) for name in format_columns],
            *[F.col(c) for c in ARRIVAL],
        )
    )
    names, batch_types, conversions, undeclared = _batch_columns(table, rows)
    exact = _exact_text_columns(table)
    projection = [
        _value(name, conversions.get(name), exact=name in exact).alias(name) for name in names
    ]
    frame = rows.select(
        *projection,
        *[F.col(name) for name in format_columns],
        F.col(OP).alias(table.flag_source),
        *([F.col(CARRIED)] if table.change_format in EVENT_FORMATS else []),
        *([undeclared_keys(table).alias(UNDECLARED)] if undeclared is None else []),
        F.col(RAW),
        F.col(FORMAT_ERROR),
        *[F.col(c) for c in ARRIVAL],
    )
    batch_types.update(table.format_columns)
    cached = None if _rows_read_once(table) else parsed
    return ChangeRead(frame, batch_types, ignored, undeclared or [], undeclared is None, cached)


def _rows_read_once(table: TableConfig) -> bool:
    """Flat lines with declared columns: the rows are the only pass over the parsed lines (no
    survey of the images, no count of skipped lines), which staging's typed rows then hold."""
    return (
        table.columns is not None
        and table.change_format not in EVENT_FORMATS
        and table.source != "kafka"  # a Kafka table counts its tombstones
    )


def _batch_columns(
    table: TableConfig, rows: DataFrame
) -> tuple[list[str], dict[str, str | None], dict[str, str | None], list[str] | None]:
    """(column names, their types in the batch, value conversions, the keys outside the declared
    columns) of the rows' images.

    With declared `columns` and a format that converts no value (all but Debezium's logical
    types) a survey of the images (a Spark pass of its own) would only name the undeclared keys:
    it is skipped, and None says so; each row then carries its undeclared keys (`UNDECLARED`)
    and staging's per-file counts gather them in their pass."""
    if table.columns is not None and table.change_format != "debezium":
        return list(table.columns), dict(table.columns), {}, None
    found = _column_types(rows, table.change_format)
    skip = _not_columns(table)
    found = {name: kind for name, kind in found.items() if name not in skip}
    if table.columns is not None:
        names = list(table.columns)
        undeclared = undeclared_names(set(found) - set(names))
        batch_types: dict[str, str | None] = dict(table.columns)
    else:
        taken = {*skip, *table.format_columns}
        usable, undeclared = column_names(found, taken, table.keys)
        keys_first = [k for k in table.keys if k in usable]
        names = keys_first + sorted(n for n in usable if n not in keys_first)
        batch_types = {name: found[name][0] for name in names}
    conversions = {name: found[name][1] for name in names if name in found}
    return names, batch_types, conversions, undeclared


def _not_columns(table: TableConfig) -> set[str]:
    """Image keys that are not data columns: a flat line's flag."""
    return {table.flag_column} if table.change_format == "flat" else set()


def undeclared_keys(table: TableConfig) -> Column:
    """A row's image keys outside the declared columns (null for a line that was not read)."""
    known = [*(table.columns or {}), *_not_columns(table)]
    return F.filter(F.map_keys(F.col(IMAGE)), lambda key: ~key.isin(known))


def undeclared_names(keys: Iterable[str]) -> list[str]:
    """Keys outside the declared columns, all ignored, as the warning names them: the names,
    then a count of the odd ones."""
    extra, unusable = column_names(set(keys), set())
    return extra + unusable


def _skipped_counts(table: TableConfig, parsed: DataFrame) -> dict[str, int]:
    """The lines an event format (or a Kafka topic) skips, by kind (flat lines have none: no
    Spark job)."""
    if table.change_format not in EVENT_FORMATS and table.source != "kafka":
        return {}
    counts = parsed.groupBy(KIND).count().collect()  # metadata: a count per kind
    kinds = {r[KIND]: int(r["count"]) for r in counts}
    if table.change_format not in EVENT_FORMATS:  # flat messages from Kafka
        return {"tombstones_skipped": kinds.get("tombstone", 0)}
    ignored = {
        "transaction_markers": kinds.get("transaction", 0),
        "tombstones_skipped": kinds.get("tombstone", 0),
        "unknown_events_skipped": kinds.get("ignored", 0),
    }
    if not table.apply_truncates:
        ignored["truncates_skipped"] = kinds.get("truncate", 0)
    return ignored


def column_names(
    found: Iterable[str], taken: set[str], first: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """(names that can be columns, the others as the warning names them).

    A JSON key becomes a column only when it is an identifier that neither starts with `_cdc_`
    (the technical columns) nor equals another column ignoring case (Spark resolves names
    ignoring case: both would fail the batch as ambiguous; the names in `first`, the keys, win
    such a clash). A key that is not an identifier is
    counted, not printed: a warning never repeats what a file holds.
    """
    usable: list[str] = []
    ignored: list[str] = []
    seen = {name.lower() for name in taken}
    odd = 0
    for name in sorted(found, key=lambda n: (n not in first, n)):
        lowered = name.lower()
        if not re.match(COLUMN_PATTERN, name) or len(name) > 128:
            odd += 1
        elif lowered.startswith(TECHNICAL_PREFIX) or lowered in seen:
            ignored.append(name)
        else:
            usable.append(name)
            seen.add(lowered)
    if odd:
        ignored.append(f"<{odd} key(s) that are not column names>")
    return usable, ignored


def _exact_text_columns(table: TableConfig) -> set[str]:
    """The declared columns of a flat line's object: a JSON number sent to one is typed from its
    source text (the parse holds it as a double or a trimmed decimal: `1.10` as 1.1, `1e-400`
    as 0, `-0.0` as 0), so a string column keeps it and a bad value is quarantined as sent."""
    if table.columns is None or table.change_format not in ("flat", "snapshot"):
        return set()
    return set(table.columns)


SOURCE_LINE = "__line"
# A top-level field's number as written on the line: the line split at its quotes (escapes
# removed first) alternates text outside strings and string contents; the depth of the
# brackets outside strings finds the field name at the object's own level, and the text after
# it the number.
NUMBER_TEXT = r"""aggregate(
  split(regexp_replace({line}, '\\\\.', ''), '"', -1),
  named_struct('inside', false, 'depth', 0, 'named', false, 'text', CAST(NULL AS STRING)),
  (acc, part) -> named_struct(
    'inside', NOT acc.inside,
    'depth', CASE WHEN acc.inside THEN acc.depth ELSE acc.depth
      + length(regexp_replace(part, '[^\\[{{]', '')) - length(regexp_replace(part, '[^\\]}}]', ''))
      END,
    'named', acc.inside AND acc.depth = 1 AND part = '{name}',
    'text', CASE WHEN NOT acc.inside AND acc.named AND acc.text IS NULL
      THEN nullif(regexp_extract(part, '^\\s*:\\s*(-?[0-9][0-9.eE+-]*)', 1), '')
      ELSE acc.text END),
  acc -> acc.text)"""


def _value(name: str, conversion: str | None, *, exact: bool = False) -> Column:
    """A column's value as text (JSON text for nested values), converted when its type says so;
    `exact`: a number as the line wrote it."""
    text = F.variant_get(F.col(IMAGE)[name], "$", "string")
    if exact:
        kind = F.schema_of_variant(F.col(IMAGE)[name])
        number = kind.startswith("DECIMAL") | kind.isin("DOUBLE", "FLOAT")
        written = F.expr(NUMBER_TEXT.format(line=SOURCE_LINE, name=name))
        return F.when(number, F.coalesce(written, text)).otherwise(text)
    if conversion is None:
        return text
    return F.expr(conversion.format(v=f"variant_get({IMAGE}['{name}'], '$', 'string')")).cast(
        "string"
    )


def _column_types(read: DataFrame, change_format: str) -> dict[str, tuple[str | None, str | None]]:
    """column -> (Spark type, conversion SQL) over every image of the batch (a small result)."""
    entries = read.select(F.explode(F.map_entries(F.col(IMAGE))).alias("e"), F.col(TYPES)).select(
        F.col("e.key").alias("name"),
        F.col("e.value").alias("value"),
        F.col(TYPES)[F.col("e.key")].alias("declared"),
    )
    rows = (
        entries.groupBy("name")
        .agg(
            F.collect_set("declared").alias("declared"),
            F.schema_of_variant_agg("value").alias("inferred"),
        )
        .collect()  # metadata: one row per column
    )
    result: dict[str, tuple[str | None, str | None]] = {}
    for row in rows:
        declared = sorted(row["declared"] or [])
        conversion = None
        if declared:
            types = []
            for description in declared:
                if change_format == "debezium":
                    types.append(connect_type(description))
                    logical = description.partition("/")[2]
                    if logical in LOGICAL_TYPES:
                        conversion = LOGICAL_TYPES[logical][1]
                else:
                    types.append(postgres_type(description))
            spark_type: str | None = types[0]
            for other in types[1:]:
                spark_type = common_type(spark_type, other) if spark_type else None
            result[row["name"]] = (spark_type or "string", conversion)
        else:
            result[row["name"]] = (variant_type(row["inferred"]), None)
    return result
