"""read_snapshot restores partition values: from one partition (constants), from several (a CASE
over the file names, or a join of a map of the files when that would cost more or a value or
name needs escaping)."""

from __future__ import annotations

from datetime import date, datetime
from itertools import combinations
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyspark.sql.types import (
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import delta
from spark_jobs.delta import reading

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
    (datetime(2001, 2, 3, 4, 5, 6), date(2001, 2, 3), "it's a \\ here"),
]


def expected(indexes: list[int]) -> list[tuple]:
    return sorted((10 * i + n, *VALUES[i]) for i in indexes for n in range(3))


@pytest.mark.parametrize("case_max", [reading.PARTITION_CASE_MAX, 0], ids=["case", "join"])
def test_partition_values_from_one_partition_and_from_several(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case_max: int
) -> None:
    monkeypatch.setattr(reading, "PARTITION_CASE_MAX", case_max)
    path = tmp_path / "t"
    rows = expected(list(range(len(VALUES))))
    delta.ensure_table(path, SCHEMA, PARTITIONS)
    snapshot = delta.load_snapshot(path)
    run_id = delta.new_run_id()
    written = delta.write_files(spark.createDataFrame(rows, SCHEMA), path, PARTITIONS, run_id)
    delta.commit(snapshot, written, "append", step="test", run_id=run_id)
    snapshot = delta.load_snapshot(path)

    def read(files: list[delta.DataFile]) -> list[tuple]:
        frame = delta.read_snapshot(spark, snapshot, files=files)
        return sorted(tuple(r) for r in frame.collect())

    assert read(snapshot.files) == rows
    # Every single partition, every pair, every three (a value with a quote and a backslash
    # among them or not).
    for size in (1, 2, 3):
        for indexes in combinations(range(len(VALUES)), size):
            names = {VALUES[i][2] for i in indexes}
            files = [
                f
                for f in snapshot.files
                if delta.partition_value_string(f.partition_values["P_NAME"]) in names
            ]
            assert read(files) == expected(list(indexes))
    # Which form the values took: a CASE over the file names only without the quoted value.
    plain = [f for f in snapshot.files if "'" not in str(f.partition_values["P_NAME"])]
    texts = reading.partition_value_texts(plain, PARTITIONS, SCHEMA)
    assert bool(texts) == bool(case_max) and all("CASE WHEN" in t for t in texts.values())
    assert not reading.partition_value_texts(snapshot.files, PARTITIONS, SCHEMA)


def _dictionaries(path: Path, files: list[delta.DataFile]) -> dict[str, bool]:
    """Column -> whether the file's chunks carry a dictionary page."""
    (only,) = files
    metadata = pq.read_metadata(path / only.path)
    chunks = metadata.row_group(0)
    return {
        chunks.column(i).path_in_schema: chunks.column(i).has_dictionary_page
        for i in range(metadata.num_columns)
    }


def test_columns_parquet_wrote_plain_are_written_plain_again(spark, tmp_path: Path) -> None:
    schema = StructType(
        [
            StructField("ID", LongType()),
            StructField("CODE", LongType()),
            StructField("NAME", StringType()),
        ]
    )
    rows = [(i, i % 3, f"name-{i * 7919}") for i in range(2_000)]
    path = tmp_path / "t"
    delta.ensure_table(path, schema, [])
    for run in range(2):
        snapshot = delta.load_snapshot(path)
        plain = delta.plain_columns(path, snapshot.files)
        # The first write tries every dictionary; parquet keeps only CODE's (three values).
        assert plain == ([] if run == 0 else ["ID", "NAME"])
        run_id = delta.new_run_id()
        frame = spark.createDataFrame(rows, schema).coalesce(1)
        written = delta.write_files(frame, path, [], run_id, plain=plain)
        delta.commit(snapshot, written, "overwrite", step="test", run_id=run_id)
        snapshot = delta.load_snapshot(path)
        assert _dictionaries(path, snapshot.files) == {"ID": False, "CODE": True, "NAME": False}
    # The second write, told the plain columns, wrote the same values.
    back = delta.read_snapshot(spark, snapshot).collect()
    assert sorted(tuple(r) for r in back) == rows
    # The setting reaches the writer: a column told plain has no dictionary, whatever its values.
    run_id = delta.new_run_id()
    frame = spark.createDataFrame(rows, schema).coalesce(1)
    written = delta.write_files(frame, path, [], run_id, plain=["CODE"])
    delta.commit(snapshot, written, "overwrite", step="test", run_id=run_id)
    snapshot = delta.load_snapshot(path)
    assert _dictionaries(path, snapshot.files)["CODE"] is False
    # A small file teaches nothing (parquet refuses a dictionary for a few rows of any column).
    small = tmp_path / "small"
    delta.ensure_table(small, schema, [])
    run_id = delta.new_run_id()
    written = delta.write_files(spark.createDataFrame(rows[:5], schema), small, [], run_id)
    delta.commit(delta.load_snapshot(small), written, "append", step="test", run_id=run_id)
    assert delta.plain_columns(small, delta.load_snapshot(small).files) == []
    # Nor do delta-rs's files (OPTIMIZE's): its writer keeps a dictionary until it is 1 MiB.
    other = tmp_path / "other"
    write_deltalake(
        str(other), pa.table({"ID": [r[0] for r in rows], "NAME": [r[2] for r in rows]})
    )
    assert delta.plain_columns(other, delta.load_snapshot(other).files) == []
    # Nor does a file that is gone (vacuumed while the run planned).
    (path / snapshot.files[0].path).unlink()
    assert delta.plain_columns(path, snapshot.files) == []
