"""A step reuses the Delta tables it finished with: brought up to date, never stale, never shared
with a snapshot (whose version is what it commits against), and only within the step."""

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs.delta import (
    arrow_table,
    ensure_table,
    finished,
    load_snapshot,
    open_table,
    reusing_tables,
)
from spark_jobs.delta.reading import _step

SCHEMA = StructType([StructField("a", LongType())])


def _append(path: Path, value: int) -> None:
    write_deltalake(str(path), pa.table({"a": [value]}), mode="append")


def _values(path: Path) -> list[int]:
    table = open_table(path)
    assert table is not None
    values = sorted(table.to_pyarrow_table().column("a").to_pylist())
    finished(path, table)
    return values


def test_a_finished_table_is_reused_with_the_commits_made_since(tmp_path: Path) -> None:
    _append(tmp_path, 1)
    with reusing_tables():
        first = open_table(tmp_path)
        assert first is not None
        finished(tmp_path, first)
        _append(tmp_path, 2)  # another writer
        again = open_table(tmp_path)
        assert again is first
        assert (again.version(), sorted(again.to_pyarrow_table().column("a").to_pylist())) == (
            1,
            [1, 2],
        )
        # Taken: the next open (nothing finished since) loads the table anew.
        assert open_table(tmp_path) is not first


def test_nothing_is_reused_outside_a_step_or_after_it(tmp_path: Path) -> None:
    _append(tmp_path, 1)
    table = open_table(tmp_path)
    assert table is not None
    finished(tmp_path, table)
    assert open_table(tmp_path) is not table
    with reusing_tables():
        inside = open_table(tmp_path)
        assert inside is not None
        finished(tmp_path, inside)
    assert getattr(_step, "finished", None) is None
    with reusing_tables():
        assert open_table(tmp_path) is not inside


def test_a_deleted_table_is_not_read_from_the_version_it_had(tmp_path: Path) -> None:
    _append(tmp_path, 1)
    with reusing_tables():
        assert _values(tmp_path) == [1]
        shutil.rmtree(tmp_path)
        assert open_table(tmp_path) is None


def test_a_table_made_again_is_read_anew(tmp_path: Path) -> None:
    for value in (1, 2, 3):
        _append(tmp_path, value)
    with reusing_tables():
        assert _values(tmp_path) == [1, 2, 3]
        shutil.rmtree(tmp_path)
        _append(tmp_path, 7)  # version 0 of a new table: shorter than the one finished with
        assert _values(tmp_path) == [7]
        # As long or longer: brought up to date, it would keep the old table's rows.
        shutil.rmtree(tmp_path)
        for value in (4, 5, 6, 8):
            _append(tmp_path, value)
        assert _values(tmp_path) == [4, 5, 6, 8]


def test_a_snapshots_table_never_moves_under_it(tmp_path: Path) -> None:
    """ensure_table and arrow_table finish with theirs; a snapshot keeps its own, so a later open
    of the same table neither takes it nor brings it up to date."""
    ensure_table(tmp_path, SCHEMA, [])
    with reusing_tables():
        ensure_table(tmp_path, SCHEMA, [])  # exists: finished with
        snapshot = load_snapshot(tmp_path)  # takes it
        assert snapshot.table is not None and snapshot.version == 0
        _append(tmp_path, 5)
        assert arrow_table(tmp_path) is not None  # opens anew, finishes with that one
        assert open_table(tmp_path) is not snapshot.table
        assert snapshot.table.version() == 0
