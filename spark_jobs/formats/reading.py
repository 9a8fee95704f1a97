"""JSON-lines files read into change rows (`read_json_changes`): every line parsed once, by its
table's format (`PARSERS`), checked, exploded into changes, and its values typed from the
declared columns, else the format's types, else the JSON values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.columns import (
    TECHNICAL_PREFIX,
)
from cdc_pipeline.config import COLUMN_PATTERN, EVENT_FORMATS, TableConfig
from cdc_pipeline.schema import common_type
from spark_jobs.formats.debezium import LOGICAL_TYPES, connect_type, parse_debezium
from spark_jobs.formats.flat import parse_flat
from spark_jobs.formats.json_lines import (
    CHANGES,
    IMAGE,
    KIND,
    LINE,
    NOT_UTF8,
    OP,
    PARSED,
    STRICT,
    STRUCTURE,
    TYPES,
    ChangeRead,
    strict_reason,
    structure,
    variant_type,
)
from spark_jobs.formats.wal2json import parse_wal2json, postgres_type
from spark_jobs.rules.transforms import ARRIVAL, CARRIED, FORMAT_ERROR, RAW, UNDECLARED, persisted

PARSERS = {
    "flat": parse_flat,
    "snapshot": parse_flat,  # a full extract: flat rows without a flag
    "debezium": parse_debezium,
    "wal2json": parse_wal2json,
}


def read_json_changes(
    spark: SparkSession, table: TableConfig, lines: DataFrame, tombstones: int | None = None
) -> ChangeRead:
    """Change rows of JSON-lines files: `lines` holds `value` (one line) and the arrival columns.

    `tombstones`: a Kafka read's null values, counted before and not in `lines` (None: a Kafka
    table's lines hold them, and a pass counts them)."""
    parsed, format_columns = _parsed_lines(table, lines)
    once = _rows_read_once(table, tombstones)
    if not once:
        parsed = persisted(parsed)  # several passes: parse the lines once
    ignored = _skipped_counts(table, parsed, tombstones)
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
            *([_numbers_written().alias(NUMBERS)] if _exact_text_columns(table) else []),
            *[F.col(name) for name in format_columns],
            *[F.col(c) for c in ARRIVAL],
        )
    )
    names, batch_types, conversions, undeclared = _batch_columns(table, rows)
    exprs = _frame_columns(
        table, names, conversions, format_columns, carries_undeclared=undeclared is None
    )
    frame = rows.select(*[column.alias(name) for name, column in exprs.items()])
    batch_types.update(table.format_columns)
    cached = None if once else parsed
    return ChangeRead(
        frame, batch_types, ignored, undeclared or [], undeclared is None, cached, list(exprs)
    )


def _frame_columns(
    table: TableConfig,
    names: list[str],
    conversions: dict[str, str | None],
    format_columns: Iterable[str],
    *,
    carries_undeclared: bool,
) -> dict[str, Column]:
    """`read_json_changes`' frame, name -> value, in its order: the names are known without
    asking Spark (`ChangeRead.columns`)."""
    exact = _exact_text_columns(table)
    return {
        **{n: _value(n, conversions.get(n), exact=n in exact) for n in names},
        **{n: F.col(n) for n in format_columns},
        table.flag_source: F.col(OP),
        **({CARRIED: F.col(CARRIED)} if table.change_format in EVENT_FORMATS else {}),
        **({UNDECLARED: undeclared_keys(table)} if carries_undeclared else {}),
        RAW: F.col(RAW),
        FORMAT_ERROR: F.col(FORMAT_ERROR),
        **{c: F.col(c) for c in ARRIVAL},
    }


def _parsed_lines(table: TableConfig, lines: DataFrame) -> tuple[DataFrame, dict[str, Column]]:
    """Each non-blank line parsed: its kind, format error, changes and format columns (and the
    format columns' expressions)."""
    line = F.col(LINE)
    lines = lines.filter(F.trim(line) != "")
    lines = lines.select(
        "*", F.try_parse_json(line).alias(PARSED), structure(line).alias(STRUCTURE)
    )
    v = F.col(PARSED)
    lines = lines.select("*", strict_reason(v, F.col(STRUCTURE)).alias(STRICT))
    kind, error, changes, format_columns = PARSERS[table.change_format](table, v)
    # Spark keeps a text line's bytes as they are; JSON parsing would turn bytes that are not
    # UTF-8 into U+FFFD silently, so such a line is quarantined instead (its raw text made valid).
    utf8 = F.is_valid_utf8(line)
    strict = F.col(STRICT)
    kind = F.when(~utf8 | strict.isNotNull(), F.lit("malformed")).otherwise(kind)
    error = F.when(~utf8, F.lit(NOT_UTF8)).when(strict.isNotNull(), strict).otherwise(error)
    parsed = lines.select(
        line,
        *[F.col(c) for c in ARRIVAL],
        kind.alias(KIND),
        error.alias(FORMAT_ERROR),
        changes.alias(CHANGES),
        *[expr.alias(name) for name, expr in format_columns.items()],
    )
    return parsed, format_columns


def _rows_read_once(table: TableConfig, tombstones: int | None) -> bool:
    """Flat lines with declared columns: the rows are the only pass over the parsed lines (no
    survey of the images, no count of skipped lines), which staging's typed rows then hold."""
    return (
        table.columns is not None
        and table.change_format not in EVENT_FORMATS
        # a Kafka table counts its tombstones, in a pass unless the read counted them
        and (table.source != "kafka" or tombstones is not None)
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


def _skipped_counts(
    table: TableConfig, parsed: DataFrame, tombstones: int | None
) -> dict[str, int]:
    """The lines an event format (or a Kafka topic) skips, by kind (flat lines have none: no
    Spark job); `tombstones` counted before the lines, if they were."""
    if table.change_format not in EVENT_FORMATS:
        if table.source != "kafka":
            return {}
        if tombstones is not None:  # flat messages from Kafka, their tombstones counted
            return {"tombstones_skipped": tombstones}
    counts = parsed.groupBy(KIND).count().collect()  # metadata: a count per kind
    kinds = {r[KIND]: int(r["count"]) for r in counts}
    tombstones_skipped = kinds.get("tombstone", 0) + (tombstones or 0)
    if table.change_format not in EVENT_FORMATS:  # flat messages from Kafka
        return {"tombstones_skipped": tombstones_skipped}
    ignored = {
        "transaction_markers": kinds.get("transaction", 0),
        "tombstones_skipped": tombstones_skipped,
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


NUMBERS = "__numbers"

# Each top-level field's number as written on the line, name -> text (the first of a name sent
# twice): the line split at its quotes (escapes removed first) alternates text outside strings
# and string contents; the depth of the brackets outside strings finds the names at the
# object's own level, and the text after one its number.
NUMBERS_WRITTEN = r"""aggregate(
  split(regexp_replace({line}, '\\\\.', ''), '"', -1),
  named_struct('inside', false, 'depth', 0, 'name', CAST(NULL AS STRING),
    'found', CAST(map() AS map<string,string>)),
  (acc, part) -> named_struct(
    'inside', NOT acc.inside,
    'depth', CASE WHEN acc.inside THEN acc.depth ELSE acc.depth
      + length(regexp_replace(part, '[^\\[{{]', '')) - length(regexp_replace(part, '[^\\]}}]', ''))
      END,
    'name', CASE WHEN acc.inside AND acc.depth = 1 THEN part END,
    'found', CASE WHEN NOT acc.inside AND acc.name IS NOT NULL
        AND NOT map_contains_key(acc.found, acc.name)
        AND regexp_extract(part, '^\\s*:\\s*(-?[0-9][0-9.eE+-]*)', 1) != ''
      THEN map_concat(acc.found,
        map(acc.name, regexp_extract(part, '^\\s*:\\s*(-?[0-9][0-9.eE+-]*)', 1)))
      ELSE acc.found END),
  acc -> acc.found)"""


def _is_number(value: Column) -> Column:
    """A JSON value the parse holds as a double or decimal (its text may differ from the line's)."""
    kind = F.schema_of_variant(value)
    return kind.startswith("DECIMAL") | kind.isin("DOUBLE", "FLOAT")


def _numbers_written() -> Column:
    """A change row's `NUMBERS_WRITTEN`, only when its image holds a number that needs it (one
    expression for every column: its analysis is a fixed cost of each read)."""
    image = F.col(f"__change.{IMAGE}")
    needed = F.exists(F.map_values(image), _is_number)
    return F.when(needed, F.expr(NUMBERS_WRITTEN.format(line=LINE)))


def _value(name: str, conversion: str | None, *, exact: bool = False) -> Column:
    """A column's value as text (JSON text for nested values), converted when its type says so;
    `exact`: a number as the line wrote it."""
    text = F.variant_get(F.col(IMAGE)[name], "$", "string")
    if exact:
        written = F.col(NUMBERS)[name]
        return F.when(_is_number(F.col(IMAGE)[name]), F.coalesce(written, text)).otherwise(text)
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
