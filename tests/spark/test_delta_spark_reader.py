"""Spark's own Delta reader (delta-spark, the jars `make install` fetches) agrees with delta-rs on
every committed version of every table a history of runs, reruns, late files, optimize,
reset-staging and vacuum leaves; a delta-spark write (its OPTIMIZE) followed by one of our runs
keeps final exact."""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from cdc_pipeline.paths import TablePaths
from spark_jobs.optimize import run_optimize
from spark_jobs.overwrite import catalog
from spark_jobs.reset_staging import run_reset_staging
from spark_jobs.runtime.session import project_jars
from spark_jobs.vacuum import run_vacuum
from tests.helpers import Workspace, table_rows
from tests.spark.steps import context, run

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not project_jars(), reason="Delta jars not fetched: run make install"),
]

TABLE = {
    "name": "d",
    "file_format": "csv",
    "columns": {"ID": "bigint", "REGION": "string", "AMOUNT": "decimal(10,2)", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "partition_expression": "REGION",
    "partition_column": "P",
    "history": True,
    "history_buckets": 2,
}


def change(flag: str, id_: int, region: str | None, amount: str | None, ts: str) -> dict[str, Any]:
    return {"FLAG": flag, "ID": id_, "REGION": region, "AMOUNT": amount, "TS": f"2024-01-01 {ts}"}


def normalized(value: Any) -> Any:
    """One form for both readers: datetimes as UTC, decimals and the rest as they are."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    return value


def rows_by_delta_rs(path: Path, version: int) -> list[tuple[Any, ...]]:
    table = DeltaTable(str(path), version=version).to_pyarrow_table()
    names = sorted(table.column_names)
    return sorted((tuple(normalized(r[n]) for n in names) for r in table.to_pylist()), key=repr)


def rows_by_spark(spark: Any, path: Path, version: int) -> list[tuple[Any, ...]]:
    frame = spark.read.format("delta").option("versionAsOf", version).load(str(path))
    names = sorted(frame.columns)
    return sorted(
        (tuple(normalized(r[n]) for n in names) for r in frame.select(*names).collect()),
        key=repr,
    )


def test_spark_reads_every_committed_version_as_delta_rs_does(
    spark: Any, workspace: Workspace
) -> None:
    table = workspace.configure(TABLE)["d"]
    paths = workspace.paths("d")
    ctx = context(spark, workspace, table)
    land = workspace.land
    land(
        "d",
        "2024-01-01T00",
        "a.csv",
        [change("I", i, "eu" if i % 2 else "us", "1.00", "00:10:00") for i in range(1, 5)],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    land(
        "d",
        "2024-01-01T01",
        "a.csv",
        [change("U", 1, "us", "2.50", "01:10:00"), change("D", 2, None, None, "01:20:00")],
    )
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    # Late, into hour 00's folder: an older update that loses, and a new key.
    land(
        "d",
        "2024-01-01T00",
        "late.csv",
        [change("U", 3, "us", "9.99", "00:05:00"), change("I", 5, "eu", "5.00", "00:50:00")],
    )
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")  # a rerun: nothing new
    run_optimize(ctx)
    run_reset_staging(ctx)
    land("d", "2024-01-01T03", "a.csv", [change("U", 4, "eu", "4.40", "03:10:00")])
    run(spark, workspace, table, "2024-01-01T03", "2024-01-01T04")
    run_vacuum(ctx, None, force=False)
    # A delta-spark write on final, then one of our runs on top of it.
    spark.sql(f"OPTIMIZE delta.`{paths.final}`").collect()
    land(
        "d",
        "2024-01-01T04",
        "a.csv",
        [change("U", 5, "us", "5.50", "04:10:00"), change("D", 3, None, None, "04:20:00")],
    )
    run(spark, workspace, table, "2024-01-01T04", "2024-01-01T05")
    assert table_rows(paths.final, ["ID", "REGION", "AMOUNT", "P"]) == [
        (1, "us", Decimal("2.50"), "us"),
        (4, "eu", Decimal("4.40"), "eu"),
        (5, "us", Decimal("5.50"), "us"),
    ]
    # Registered in the session's catalog (overwrite-final does it on a Connect server, whose
    # catalog outlives the run): users query the table by name.
    if not catalog.outlives_this_process(spark):
        assert catalog.register_tables(spark, table, paths) == ["cdc.d", "cdc.d_history"]
    assert sorted(tuple(r) for r in spark.table("cdc.d").select("ID", "P").collect()) == [
        (1, "us"),
        (4, "eu"),
        (5, "us"),
    ]
    assert (
        spark.table("cdc.d_history").count()
        == DeltaTable(str(paths.history)).to_pyarrow_table().num_rows
    )
    checked = {}
    for name in ("final", "staging", "tombstones", "history"):
        path = getattr(paths, name)
        latest = DeltaTable(str(path)).version()
        for version in range(latest + 1):
            assert rows_by_spark(spark, path, version) == rows_by_delta_rs(path, version), (
                f"{name} at version {version}"
            )
        checked[name] = latest + 1
    assert checked["final"] >= 6 and checked["history"] >= 4, checked
    # The tables keep a protocol both writers can write: no table feature delta-rs lacks.
    protocol = DeltaTable(str(paths.final)).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)


def test_a_name_whose_folder_is_gone_is_registered_again_at_the_new_folder(
    spark, workspace: Workspace
) -> None:
    """A catalog name whose Delta folder was deleted (a warehouse moved or rebuilt) made every
    later registration fail: Spark cannot even say whether such a table exists."""
    table = workspace.configure({**TABLE, "name": "gone", "history": False})["gone"]
    old = TablePaths("gone", workspace.landing, workspace.root / "old-warehouse")
    new = workspace.paths("gone")
    for paths, rows in ((old, 3), (new, 5)):
        spark.range(rows).write.format("delta").save(str(paths.final))
    try:
        catalog.register_tables(spark, table, old)
        assert spark.table("cdc.gone").count() == 3
        shutil.rmtree(old.final)
        assert catalog.register_tables(spark, table, new) == ["cdc.gone"]
        assert spark.table("cdc.gone").count() == 5
        # Registered where it lives: the catalog's entry says so, nothing is registered again.
        assert catalog.register_tables(spark, table, new) == []
    finally:
        spark.sql("DROP TABLE IF EXISTS cdc.gone")


def test_a_database_not_there_yet_is_created_with_the_first_table(
    spark, workspace: Workspace
) -> None:
    """The catalog is asked first whether the table is registered; a database it does not
    have yet means it is not, and is created before the table is."""
    database = f"cdc_{uuid.uuid4().hex[:8]}"
    config = {**TABLE, "name": "fresh", "history": False, "database": database}
    table = workspace.configure(config)["fresh"]
    paths = workspace.paths("fresh")
    spark.range(4).write.format("delta").save(str(paths.final))
    try:
        assert catalog.register_tables(spark, table, paths) == [f"{database}.fresh"]
        assert spark.table(f"{database}.fresh").count() == 4
        assert catalog.register_tables(spark, table, paths) == []
    finally:
        spark.sql(f"DROP DATABASE IF EXISTS `{database}` CASCADE")
