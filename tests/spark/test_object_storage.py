"""Object storage for real: a moto S3 server (tests/s3.py), delta-rs committing `s3://` tables
with the AWS variables of the environment, and the steps' Spark session reading and writing the
same `s3://` URIs through S3A with the settings it derives from those variables
(spark_jobs/runtime/object_store.py): every version delta-rs committed reads the same in Spark,
a delta-spark commit on S3 reads the same in delta-rs, and concurrent delta-rs writers on S3
commit exactly once each (conditional writes: the choice for S3 in docs/operations.md)."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from spark_jobs.runtime.session import build_spark_session, project_jars

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not project_jars(), reason="Spark jars not fetched: run make install"),
]


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    names = sorted(table.column_names)
    return sorted(tuple(r[n] for n in names) for r in table.to_pylist())


def spark_rows(frame: Any) -> list[tuple[Any, ...]]:
    names = sorted(frame.columns)
    return sorted(tuple(r[n] for n in names) for r in frame.select(*names).collect())


@pytest.fixture
def s3_env(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return s3_server


def test_spark_and_delta_rs_read_and_write_the_same_s3_tables(spark: Any, s3_env: Any) -> None:
    bucket = s3_env.create_bucket()
    uri = f"s3://{bucket}/orders/final"
    write_deltalake(uri, pa.table({"ID": [1, 2, 3], "V": ["a", "b", "c"]}))
    write_deltalake(uri, pa.table({"ID": [4], "V": ["d"]}), mode="append")
    DeltaTable(uri).delete("ID = 2")
    assert DeltaTable(uri).version() == 2
    # The steps' session with this environment's settings (classic: the same session again).
    session = build_spark_session("object-storage-test")
    session.conf.set("spark.databricks.delta.snapshotPartitions", "2")  # a 5-commit log
    for version in range(3):
        expected = rows(DeltaTable(uri, version=version).to_pyarrow_table())
        frame = session.read.format("delta").option("versionAsOf", version).load(uri)
        assert spark_rows(frame) == expected, version
    assert spark_rows(session.read.format("delta").load(uri)) == [(1, "a"), (3, "c"), (4, "d")]
    # Spark writes there too: Parquet (what a step's write is) and a delta-spark commit that
    # delta-rs then reads and appends after.
    session.range(5).selectExpr("id AS ID", "'p' AS V").write.parquet(f"s3://{bucket}/tmp/p")
    assert spark_rows(session.read.parquet(f"s3://{bucket}/tmp/p")) == [(i, "p") for i in range(5)]
    session.createDataFrame([(5, "e")], "ID long, V string").write.format("delta").mode(
        "append"
    ).save(uri)
    write_deltalake(uri, pa.table({"ID": [6], "V": ["f"]}), mode="append")
    table = DeltaTable(uri)
    assert table.version() == 4
    assert rows(table.to_pyarrow_table()) == [(1, "a"), (3, "c"), (4, "d"), (5, "e"), (6, "f")]


def _append(uri: str, writer: int, count: int, errors: str) -> None:
    # Every one of the 32 commits may lose a race to another writer: enough retries that a
    # writer never gives up (delta-rs's default is 15), which is not what the test is about.
    # An error is written where the test reads it (a spawned child's stderr is not captured).
    try:
        for n in range(count):
            write_deltalake(
                uri,
                pa.table({"W": [writer], "N": [n]}),
                mode="append",
                commit_properties=CommitProperties(max_commit_retries=100),
            )
    except BaseException:
        Path(errors).write_text(traceback.format_exc())
        raise


def test_concurrent_delta_rs_writers_on_s3_commit_exactly_once(s3_env: Any, tmp_path: Path) -> None:
    uri = f"s3://{s3_env.create_bucket()}/race"
    write_deltalake(uri, pa.table({"W": [-1], "N": [-1]}))
    writers, count = 4, 8
    context = multiprocessing.get_context("spawn")  # delta-rs's runtime does not survive fork
    errors = [tmp_path / f"writer-{w}.err" for w in range(writers)]
    processes = [
        context.Process(target=_append, args=(uri, w, count, str(errors[w])))
        for w in range(writers)
    ]
    for process in processes:
        process.start()
    for w, process in enumerate(processes):
        process.join(timeout=300)
        error = errors[w].read_text() if errors[w].exists() else "no error written"
        assert process.exitcode == 0, f"writer {w}: exit code {process.exitcode}: {error}"
    table = DeltaTable(uri)
    # The rows first: a lost commit shows as a missing (N, W), one applied twice as a repeat.
    expected = [(-1, -1)] + [(n, w) for w in range(writers) for n in range(count)]
    assert rows(table.to_pyarrow_table()) == sorted(expected)
    assert table.version() == writers * count  # one commit each, none overwritten
