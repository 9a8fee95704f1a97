"""A small stage run's per-file counts, taken on the driver from the rows it already holds,
equal the Spark aggregate they replace (`staging.rows._per_file`), value for value."""

from __future__ import annotations

from datetime import date, datetime

import pytest
from pyspark.sql.types import (
    ArrayType,
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_jobs import delta
from spark_jobs.formats.json_lines import ChangeRead
from spark_jobs.rules.transforms import BATCH, FILE, REASON, UNDECLARED
from spark_jobs.staging.rows import NEWEST, _per_file, per_file_on_driver
from tests.helpers import Workspace

pytestmark = pytest.mark.spark

SEQUENCES = {
    "timestamp": (TimestampType(), [datetime(2024, 1, 1, 0, 10, 0, 5), datetime(999, 3, 1, 23)]),
    "timestamp_ntz": (TimestampNTZType(), [datetime(2024, 5, 6, 7, 8, 9), datetime(1, 1, 1)]),
    "date": (DateType(), [date(2024, 2, 29), date(1970, 1, 1)]),
    "bigint": (LongType(), [7, 3]),
}


@pytest.mark.parametrize("kind", sorted(SEQUENCES))
def test_the_driver_counts_equal_the_spark_aggregate(
    spark, workspace: Workspace, kind: str
) -> None:
    spark_type, (late, early) = SEQUENCES[kind]
    table = workspace.configure(
        {
            "name": "t",
            "file_format": "json",
            "columns": {"ID": "bigint", "S": kind},
            "keys": ["ID"],
            "sequence_by": ["S"],
        }
    )["t"]
    schema = StructType(
        [
            StructField("ID", LongType()),
            StructField("S", spark_type),
            StructField(REASON, StringType()),
            StructField(UNDECLARED, ArrayType(StringType())),
            StructField(BATCH, StringType()),
            StructField(FILE, StringType()),
        ]
    )
    rows = [
        # a.json: two good rows (the later sequence wins), a bad one with a later sequence
        (1, early, None, ["x", "y"], "2024-01-01T00", "a.json"),
        (2, late, None, ["y"], "2024-01-01T00", "a.json"),
        (3, None, "null sequence", None, "2024-01-01T00", "a.json"),
        # b.json: only bad rows (no newest change), no undeclared keys
        (4, late, "bad value", [], "2024-01-01T00", "b.json"),
        # the same name in another hour: its own file
        (5, None, None, ["z", "x", "z"], "2024-01-01T01", "a.json"),
    ]
    typed = spark.createDataFrame(rows, schema)
    arrow, _ = delta.arrow_and_schema(typed)
    types = {"ID": "bigint", "S": kind}
    for carries in (True, False):
        read = ChangeRead(typed, dict(types), carries_undeclared=carries)
        spark_counts = _per_file(table, typed.coalesce(1), types, read)
        driver_counts = per_file_on_driver(table, arrow, types, read)
        assert driver_counts is not None
        assert _normalised(driver_counts) == _normalised(spark_counts)
    newest = {(r[BATCH], r[FILE]): r[NEWEST] for r in driver_counts}
    if kind == "bigint":
        assert set(newest.values()) == {None}
    else:
        assert newest[("2024-01-01T00", "b.json")] is None
        assert newest[("2024-01-01T01", "a.json")] is None
        assert newest[("2024-01-01T00", "a.json")] is not None


def _normalised(counts: list[dict]) -> list[dict]:
    """The counts in one order, each file's undeclared keys as a sorted list."""
    out = []
    for row in counts:
        row = dict(row)
        if UNDECLARED in row:
            row[UNDECLARED] = sorted(row[UNDECLARED] or [])
        out.append(row)
    return sorted(out, key=lambda r: (r[BATCH], r[FILE]))
