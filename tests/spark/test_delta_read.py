"""read_snapshot restores partition values, from one partition (constants) or many (a join)."""

from __future__ import annotations

from datetime import date, datetime
from pathlib import Path

import pytest
from pyspark.sql.types import (
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import delta

pytestmark = [pytest.mark.spark, pytest.mark.both_modes]

SCHEMA = StructType(
    [
        StructField("ID", LongType()),
        StructField("P_TS", TimestampType()),
        StructField("P_DAY", DateType()),
        StructField("P_NAME", StringType()),
    ]
)
PARTITIONS = ["P_TS", "P_DAY", "P_NAME"]
# (P_TS, P_DAY, P_NAME) of each partition; ids 10*i .. 10*i+2 live in partition i.
VALUES = [
    (datetime(2024, 1, 1, 0, 0), date(2024, 1, 1), "plain"),
    (datetime(2024, 3, 31, 23, 59, 59, 123456), date(1999, 12, 31), "a b/c=d%e"),
    (None, None, None),
]


def expected(indexes: list[int]) -> list[tuple]:
    return sorted((10 * i + n, *VALUES[i]) for i in indexes for n in range(3))


def test_partition_values_from_one_partition_and_from_several(spark, tmp_path: Path) -> None:
    path = tmp_path / "t"
    rows = expected(list(range(len(VALUES))))
    delta.ensure_table(path, SCHEMA, PARTITIONS)
    snapshot = delta.load_snapshot(path)
    run_id = delta.new_run_id()
    written = delta.write_files(spark.createDataFrame(rows, SCHEMA), path, PARTITIONS, run_id)
    delta.commit(snapshot, written, "append", "test", run_id)
    snapshot = delta.load_snapshot(path)

    def read(files: list[delta.DataFile]) -> list[tuple]:
        frame = delta.read_snapshot(spark, snapshot, files=files)
        return sorted(tuple(r) for r in frame.collect())

    assert read(snapshot.files) == rows
    for index, values in enumerate(VALUES):
        files = [
            f
            for f in snapshot.files
            if delta.partition_value_string(f.partition_values["P_NAME"]) == values[2]
        ]
        assert files, f"no file for partition {values}"
        assert read(files) == expected([index])
