"""A landed Parquet file is read with the types its footer gives (no inference job) only when
they are exactly the types Spark's own inference gives: checked here against Spark, file by
file, for every kind of Parquet column a writer may land."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs import landing
from spark_jobs.landing.probe import probe_footer
from spark_jobs.staging import readers

pytestmark = pytest.mark.spark

WHEN = dt.datetime(2024, 3, 1, 12, 30, 15, 123456)

# name -> (Arrow array, write options, whether the footer's types are exact)
CASES = {
    "integers": (
        {
            "i8": pa.array([1], pa.int8()),
            "i16": pa.array([1], pa.int16()),
            "i32": pa.array([1], pa.int32()),
            "i64": pa.array([1], pa.int64()),
        },
        {},
        True,
    ),
    "floats_booleans_text": (
        {
            "f": pa.array([1.5], pa.float32()),
            "d": pa.array([2.5], pa.float64()),
            "b": pa.array([True]),
            "s": pa.array(["x"]),
            "ls": pa.array(["x"], pa.large_string()),
        },
        {},
        True,
    ),
    "dictionary_text": ({"s": pa.array(["x", "y", "x"]).dictionary_encode()}, {}, True),
    "dates_and_decimals": (
        {
            "day": pa.array([dt.date(2024, 2, 29)]),
            "d52": pa.array([Decimal("123.45")], pa.decimal128(5, 2)),
            "d184": pa.array([Decimal("12345678901234.5678")], pa.decimal128(18, 4)),
            "d3810": pa.array([Decimal("1.5")], pa.decimal128(38, 10)),
        },
        {},
        True,
    ),
    "utc_times": (
        {
            "us": pa.array([WHEN], pa.timestamp("us", "UTC")),
            "ms": pa.array([WHEN], pa.timestamp("ms", "UTC")),
            "zoned": pa.array([WHEN], pa.timestamp("us", "Europe/Paris")),
        },
        {},
        True,
    ),
    "required_columns": (
        pa.table(
            {"id": pa.array([1], pa.int64()), "s": pa.array(["x"])},
            schema=pa.schema([pa.field("id", pa.int64(), False), pa.field("s", pa.string())]),
        ),
        {},
        True,
    ),
    # Not exact: Spark's answer depends on a setting, differs, or the type is not flat.
    "naive_time": ({"t": pa.array([WHEN], pa.timestamp("us"))}, {}, False),
    "nanoseconds": ({"t": pa.array([WHEN], pa.timestamp("ns", "UTC"))}, {}, False),
    "int96": ({"t": pa.array([WHEN], pa.timestamp("us", "UTC"))}, {"int96": True}, False),
    "parquet_1_0_times": (
        {"t": pa.array([WHEN], pa.timestamp("ms", "UTC"))},
        {"version": "1.0"},
        True,
    ),
    "unsigned": ({"u": pa.array([1], pa.uint32())}, {}, False),
    "binary": ({"b": pa.array([b"x"])}, {}, False),
    "nested": ({"st": pa.array([{"a": 1}]), "li": pa.array([[1, 2]])}, {}, False),
    "time_of_day": ({"t": pa.array([dt.time(1, 2)], pa.time64("us"))}, {}, False),
    "wide_decimal": ({"d": pa.array([Decimal("1.5")], pa.decimal256(40, 2))}, {}, False),
    "names_equal_but_for_case": (
        {"a": pa.array([1], pa.int64()), "A": pa.array([2], pa.int64())},
        {},
        False,
    ),
}


def _write(path: Path, data: dict | pa.Table, options: dict) -> None:
    table = data if isinstance(data, pa.Table) else pa.table(data)
    kwargs = {}
    if options.get("int96"):
        kwargs["use_deprecated_int96_timestamps"] = True
    if "version" in options:
        kwargs["version"] = options["version"]
    pq.write_table(table, path, **kwargs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_exact_footer_types_are_the_types_spark_infers(spark, tmp_path: Path, case: str) -> None:
    data, options, expect_exact = CASES[case]
    path = tmp_path / "dt=2024-01-01" / "hr=00" / f"{case}.parquet"
    path.parent.mkdir(parents=True)
    _write(path, data, options)
    landed = landing.LandingFile("2024-01-01T00", path, path.name, path.stat().st_size, 0)
    types, exact = probe_footer(landed)
    if not expect_exact:
        assert exact is None, f"{case}: {exact}"
        return
    assert exact is not None, f"{case}: {types}"
    inferred = spark.read.parquet(landing.spark_path(path)).schema
    assert exact == {f.name: f.dataType.simpleString() for f in inferred.fields}
    # Read with them, the rows are the rows Spark's inference reads.
    given = readers._parquet_reader(spark, exact)
    assert given.parquet(landing.spark_path(path)).collect() == (
        spark.read.parquet(landing.spark_path(path)).collect()
    )
