"""wal2json (format-version 2) lines: `action` I, U, D with `columns` and `identity`; an update
whose identity key differs from its new key is a primary-key change. `_cdc_lsn` is the line's
`lsn` as a number and `_cdc_position` its zero-padded text ('' when absent); the column types
come from PostgreSQL's type names."""

from __future__ import annotations

import re

from pyspark.sql import Column
from pyspark.sql import functions as F

from cdc_pipeline.columns import (
    LSN,
    POSITION,
)
from cdc_pipeline.config import TableConfig
from spark_jobs.formats.json_lines import (
    change_struct,
    classified,
    line_error,
    named_map,
    no_changes,
    present_at,
    text_at,
    truncate_change,
    update_changes,
)

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


def postgres_type(name: str) -> str:
    """Spark SQL type of a PostgreSQL type name such as `numeric(12,2)` or `character varying(20)`."""
    text = name.strip().lower()
    numeric = re.match(r"^(?:numeric|decimal)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$", text)
    if numeric:
        return f"decimal({numeric.group(1)},{numeric.group(2) or 0})"
    base = re.sub(r"\(.*?\)", "", text).strip()
    base = " ".join(base.split())
    return POSTGRES_TYPES.get(base, "string")


def _wal2json_image(v: Column, path: str) -> tuple[Column, Column, Column]:
    """(name -> value, name -> type, malformed) of a wal2json `columns` or `identity` array.

    `malformed` is true when the path holds something other than an array of objects with
    distinct names; the maps are then null.
    """
    entries = F.try_variant_get(v, path, "array<variant>")
    image = named_map(
        F.transform(
            entries,
            lambda c: F.struct(
                F.try_variant_get(c, "$.name", "string").alias("k"),
                F.variant_get(c, "$.value", "variant").alias("v"),
            ),
        )
    )
    types = named_map(
        F.transform(
            entries,
            lambda c: F.struct(
                F.try_variant_get(c, "$.name", "string").alias("k"),
                F.try_variant_get(c, "$.type", "string").alias("v"),
            ),
        )
    )
    return image, types, present_at(v, path) & image.isNull()


def lsn_number(text: Column) -> Column:
    """A PostgreSQL LSN 'X/Y' (hex) as a number."""
    parts = F.split(text, "/")
    high = F.conv(parts[0], 16, 10).cast("bigint")
    low = F.conv(parts[1], 16, 10).cast("bigint")
    return F.when(F.size(parts) == 2, high * F.lit(4294967296) + low)


def parse_wal2json(
    table: TableConfig, v: Column
) -> tuple[Column, Column, Column, dict[str, Column]]:
    is_object = F.coalesce(F.schema_of_variant(v).startswith("OBJECT"), F.lit(False))
    action = text_at(v, "$.action")
    new_image, new_types, new_malformed = _wal2json_image(v, "$.columns")
    old_image, old_types, old_malformed = _wal2json_image(v, "$.identity")
    truncate = (action == "T") & F.lit(table.apply_truncates)
    kind = classified(
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
        line_error(v, is_object)
        .when(
            action.isNull() & present_at(v, "$.action"),
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
        F.when(action == "I", F.array(change_struct("I", *new)))
        .when(action == "U", update_changes(*old, *new, table.keys))
        .when(action == "D", F.array(change_struct("D", *old)))
        .when(truncate, F.array(truncate_change()))
        .otherwise(no_changes())
    )
