"""Parquet footers: driver-side metadata reads (no row data), grouped by schema, against the
declared types."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cdc_pipeline.schema import common_type
from spark_jobs.landing.versions import LandingFile, Refusal
from spark_jobs.runtime.storage import store_for

_NUMERIC = {"tinyint", "smallint", "int", "bigint", "float", "double"}

# The mark of a timestamp column stored in nanoseconds (`timestamp(ns)`, `timestamp_ntz(ns)`).
NANOS = "(ns)"

_TEMPORAL = {"date", "timestamp", "timestamp_ntz"}


def spark_type_of(arrow_type: pa.DataType) -> str:
    """The Spark SQL type name Spark gives a Parquet column of `arrow_type` (close enough to compare
    files: integers, floats, decimals, text, booleans, dates and timestamps, nested types)."""
    if pa.types.is_dictionary(arrow_type):
        return spark_type_of(arrow_type.value_type)
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "ns":
        # pandas' default: Spark reads it only as its count (staging.readers makes it text).
        return spark_type_of(pa.timestamp("us", arrow_type.tz)) + NANOS
    if pa.types.is_unsigned_integer(arrow_type):
        # Spark widens unsigned Parquet integers to the next signed type.
        return {8: "smallint", 16: "int", 32: "bigint"}.get(arrow_type.bit_width, "decimal(20,0)")
    from pyspark.sql.pandas.types import from_arrow_type

    try:
        return str(from_arrow_type(arrow_type).simpleString())
    except Exception:  # an Arrow type Spark's converter does not know: compare it by name
        return str(arrow_type)


def _family(spark_type: str) -> str:
    if spark_type in _NUMERIC or spark_type.startswith("decimal"):
        return "number"
    if spark_type.removesuffix(NANOS) in _TEMPORAL:
        return "time"
    if spark_type.startswith(("struct", "array", "map")):
        return "nested"
    return spark_type  # string, boolean, binary, ...


def fits_declared(found: str, declared: str) -> bool:
    """Whether a Parquet column of type `found` can be read as the declared type (row by row)."""
    if _family(found) == "nested":
        return declared == found
    if found == "string" or declared == "string":
        return True  # text is parsed (or kept) row by row; a bad value is a quarantined row
    return _family(found) == _family(declared)


def probe_parquet(landing_file: LandingFile) -> dict[str, str]:
    """Column -> Spark type from the file's footer (metadata only; never through a link).

    Raises OSError or pyarrow's ArrowException when the footer cannot be read.
    """
    return probe_footer(landing_file)[0]


def probe_footer(landing_file: LandingFile) -> tuple[dict[str, str], dict[str, str] | None]:
    """`probe_parquet`'s types, and the same when each is exactly the type Spark's own schema
    inference gives the column (`exact_types`), else None."""
    with store_for(landing_file.path).open_read(landing_file.path) as handle:
        footer = pq.ParquetFile(handle)
        schema, metadata = footer.schema_arrow, footer.metadata
        parquet_schema = footer.schema
    codecs = {
        metadata.row_group(g).column(c).compression
        for g in range(metadata.num_row_groups)
        for c in range(metadata.num_columns)
    }
    unreadable = sorted(codecs & SPARK_MISSING_CODECS)
    if unreadable:
        raise UnsupportedParquetError(
            f"compressed with {', '.join(unreadable)}, a codec Spark has no reader for; write it "
            "with snappy, zstd or gzip (pyarrow: write_table(..., compression='zstd'))"
        )
    types = {f.name: spark_type_of(f.type) for f in schema}
    return types, exact_types(parquet_schema, types)


def exact_types(parquet_schema: pq.ParquetSchema, types: dict[str, str]) -> dict[str, str] | None:
    """`types` when every column is a flat one whose Spark type follows from its Parquet
    physical and logical type alone, as Spark's inference (`ParquetToSparkSchemaConverter`)
    gives it and as `spark_type_of` read it from Arrow: then a read given these types needs no
    inference (a Spark job over the footers). None for any other column: nested, unsigned,
    binary, a time without zone or in nanoseconds, INT96, names equal but for case, or where
    the two readings differ."""
    columns = [parquet_schema.column(i) for i in range(len(parquet_schema))]
    names = [c.path for c in columns]
    if names != list(types) or len({n.lower() for n in names}) != len(names):
        return None
    for column in columns:
        if column.max_repetition_level != 0 or "." in column.path:
            return None
        if _inferred_type(column) != types[column.path]:
            return None
    return dict(types)


def _inferred_type(column: Any) -> str | None:
    """The Spark type Spark's Parquet schema inference gives a flat column, for the physical and
    logical types whose answer does not depend on a setting; None for the others."""
    physical, logical = column.physical_type, json.loads(column.logical_type.to_json())
    kind = logical.get("Type")
    if kind == "None":
        return _PLAIN.get(physical)
    if kind == "Int" and logical.get("isSigned") and physical in ("INT32", "INT64"):
        return _SIGNED.get(logical.get("bitWidth"))
    if kind == "String" and physical == "BYTE_ARRAY":
        return "string"
    if kind == "Date" and physical == "INT32":
        return "date"
    if kind == "Decimal" and 0 < logical.get("precision", 0) <= 38:
        return f"decimal({logical['precision']},{logical.get('scale', 0)})"
    if kind == "Timestamp" and logical.get("isAdjustedToUTC") and physical == "INT64":
        return "timestamp" if logical.get("timeUnit") in ("milliseconds", "microseconds") else None
    return None


_PLAIN = {
    "INT32": "int",
    "INT64": "bigint",
    "FLOAT": "float",
    "DOUBLE": "double",
    "BOOLEAN": "boolean",
}
_SIGNED = {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}


# Parquet codecs pyarrow writes and Spark's Parquet reader cannot decompress (no codec class).
SPARK_MISSING_CODECS = {"BROTLI"}


class UnsupportedParquetError(ValueError):
    """A Parquet file whose footer reads but whose data Spark cannot read (its codec)."""


@dataclass
class ParquetPlan:
    """Parquet files grouped by footer schema, the run's column types, and refused files."""

    groups: list[list[LandingFile]] = field(default_factory=list)
    column_types: dict[str, str] = field(default_factory=dict)  # the type each column is read as
    nanos: set[str] = field(default_factory=set)  # timestamp columns in nanoseconds in a file
    # Per group: its column types when each is the type Spark's inference gives (`exact_types`):
    # the group is then read with them, without inference; else None.
    exact: list[dict[str, str] | None] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)


def _refusal(landing_file: LandingFile, reason: str) -> Refusal:
    return Refusal(
        landing_file.batch, landing_file.file, landing_file.relative, reason, landing_file
    )


def plan_parquet(
    files: Sequence[LandingFile], declared: dict[str, str] | None, flag_source: str
) -> ParquetPlan:
    """Probe every footer; refuse unreadable files and files whose types contradict the declared
    columns (or, without declared columns, the type most of the run's files give a column; ties
    go to the earlier file); group the others by schema and pick each column's read type."""
    plan = ParquetPlan()
    probed = _probe_all(files, plan)
    schemas = [(landing_file, types) for landing_file, types, _ in probed]
    reference: dict[str, str] = {}
    if declared is not None:
        reference = {**declared, flag_source: "string"}
    else:
        seen: dict[str, list[str]] = {}
        for _, schema in schemas:
            for column, spark_type in schema.items():
                seen.setdefault(column, []).append(spark_type)
        for column, kinds in seen.items():
            # The type most files agree with (widening counts as agreeing); max keeps the first
            # of equal counts: the type of the earliest file.
            reference[column] = max(
                kinds, key=lambda t: sum(common_type(t, other) is not None for other in kinds)
            )
    accepted: list[tuple[LandingFile, dict[str, str]]] = []
    for landing_file, schema in schemas:
        problems = []
        for column, spark_type in schema.items():
            expected = reference.get(column)
            if expected is None or expected == spark_type:
                continue
            fits = (
                fits_declared(spark_type, expected)
                if declared is not None
                else common_type(spark_type, expected) is not None
            )
            if not fits:
                source = "the config declares" if declared is not None else "other files give"
                problems.append(f"{column} is {spark_type} in this file but {source} {expected}")
        if problems:
            plan.refusals.append(
                _refusal(landing_file, "Parquet schema refused: " + "; ".join(problems))
            )
        else:
            accepted.append((landing_file, schema))
    groups: dict[tuple[tuple[str, str], ...], list[LandingFile]] = {}
    found: dict[str, set[str]] = {}
    for landing_file, schema in accepted:
        groups.setdefault(tuple(sorted(schema.items())), []).append(landing_file)
        for column, spark_type in schema.items():
            found.setdefault(column, set()).add(spark_type)
    plan.groups = list(groups.values())
    exact_of = {f: e for f, _, e in probed}
    plan.exact = [_group_exact(group, exact_of) for group in plan.groups]
    plan.column_types = _read_types(found, declared=declared is not None)
    plan.nanos = {c for c, types in found.items() if any(t.endswith(NANOS) for t in types)}
    return plan


def _probe_all(
    files: Sequence[LandingFile], plan: ParquetPlan
) -> list[tuple[LandingFile, dict[str, str], dict[str, str] | None]]:
    """Each readable file with its footer types and exact types (`probe_footer`), in order; the
    others refused."""
    probed = []
    for landing_file in files:
        try:
            probed.append((landing_file, *probe_footer(landing_file)))
        except (OSError, pa.ArrowException, UnsupportedParquetError) as error:
            message = (str(error).strip().splitlines() or [type(error).__name__])[0]
            plan.refusals.append(
                _refusal(
                    landing_file,
                    f"unreadable Parquet file ({landing_file.size} bytes): {message}",
                )
            )
    return probed


def _group_exact(
    group: Sequence[LandingFile], exact_by_file: dict[LandingFile, dict[str, str] | None]
) -> dict[str, str] | None:
    """A group's types when every file's are exact (`exact_types`) and the same, else None."""
    exact = [exact_by_file[f] for f in group]
    first = exact[0]
    return first if first is not None and all(e == first for e in exact) else None


def _read_types(found: dict[str, set[str]], *, declared: bool) -> dict[str, str]:
    """The type each column is read as, from the types the accepted files give it."""
    column_types = {}
    for column, types in found.items():
        ordered = sorted(types)
        if len(ordered) == 1:
            column_types[column] = ordered[0]
        elif declared:
            column_types[column] = "string"  # read as text, typed row by row as declared
        else:
            merged: str | None = ordered[0]
            for other in ordered[1:]:
                merged = common_type(merged, other) if merged else None
            column_types[column] = merged or "string"
    return column_types
