"""Schema evolution when columns is omitted: added columns, widened types, refused batches."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdc_pipeline.errors import InputError
from spark_jobs import delta
from spark_jobs.stage import run_stage
from tests.helpers import Workspace, interval, table_rows
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark

EVOLVING = {
    "name": "s",
    "file_format": "parquet",
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "partition_expression": "ID % 2",
    "partition_column": "B",
}


def land_parquet(workspace: Workspace, hour: int, schema: pa.Schema, rows: list[dict]) -> Path:
    folder = workspace.landing / "s" / f"dt=2024-01-01/hr={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "changes.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema), path)
    return path


def at(hour: int) -> datetime:
    return datetime(2024, 1, 1, hour, tzinfo=UTC)


def physical_types(table: Path, column: str) -> set[str]:
    """The Parquet type of `column` in every data file of the table's current version."""
    snapshot = delta.load_snapshot(table)
    return {str(pq.read_schema(table / f.path).field(column).type) for f in snapshot.files}


def test_added_column_and_widened_type_reach_staging_and_final(spark, workspace: Workspace) -> None:
    table = workspace.configure(EVOLVING)["s"]
    paths = workspace.paths("s")
    v1 = pa.schema(
        [
            ("FLAG", pa.string()),
            ("ID", pa.int32()),
            ("V", pa.int32()),
            ("TS", pa.timestamp("us", "UTC")),
        ]
    )
    land_parquet(
        workspace,
        0,
        v1,
        [
            {"FLAG": "I", "ID": 1, "V": 1, "TS": at(0)},
            {"FLAG": "I", "ID": 2, "V": 2, "TS": at(0)},
        ],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert physical_types(paths.final, "V") == {"int32"}
    # The source widened V to bigint and added NOTE.
    v2 = pa.schema(
        [
            ("FLAG", pa.string()),
            ("ID", pa.int32()),
            ("V", pa.int64()),
            ("NOTE", pa.string()),
            ("TS", pa.timestamp("us", "UTC")),
        ]
    )
    land_parquet(
        workspace, 1, v2, [{"FLAG": "U", "ID": 1, "V": 10_000_000_000, "NOTE": "big", "TS": at(1)}]
    )
    staged, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert (staged.counts["columns_added"], staged.counts["columns_widened"]) == (1, 1)
    assert applied.counts["schema_changes"] == 2
    assert table_rows(paths.final, ["ID", "V", "NOTE", "B"]) == [
        (1, 10_000_000_000, "big", 1),
        (2, 2, None, 0),
    ]
    types = {
        f.name: f.dataType.simpleString() for f in delta.load_snapshot(paths.final).schema.fields
    }
    assert (types["V"], types["NOTE"]) == ("bigint", "string")
    # Every file of final and staging matches the widened schema, untouched partitions too.
    assert physical_types(paths.final, "V") == {"int64"}
    assert physical_types(paths.staging, "V") == {"int64"}
    # A later batch with the old, narrower type is simply stored in the wider column.
    land_parquet(workspace, 2, v1, [{"FLAG": "U", "ID": 2, "V": 20, "TS": at(2)}])
    staged, _ = run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert "columns_added" not in staged.counts
    assert table_rows(paths.final, ["ID", "V", "NOTE"]) == [
        (1, 10_000_000_000, "big"),
        (2, 20, None),
    ]


def test_incompatible_type_quarantines_the_batch_and_leaves_tables_untouched(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(EVOLVING)["s"]
    paths = workspace.paths("s")
    v1 = pa.schema(
        [
            ("FLAG", pa.string()),
            ("ID", pa.int64()),
            ("V", pa.int64()),
            ("TS", pa.timestamp("us", "UTC")),
        ]
    )
    land_parquet(workspace, 0, v1, [{"FLAG": "I", "ID": 1, "V": 1, "TS": at(0)}])
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    versions = (
        delta.load_snapshot(paths.staging).version,
        delta.load_snapshot(paths.final).version,
    )
    bad = pa.schema(
        [
            ("FLAG", pa.string()),
            ("ID", pa.int64()),
            ("V", pa.string()),
            ("TS", pa.timestamp("us", "UTC")),
        ]
    )
    land_parquet(
        workspace,
        1,
        bad,
        [
            {"FLAG": "U", "ID": 1, "V": "one", "TS": at(1)},
            {"FLAG": "I", "ID": 3, "V": "3", "TS": at(1)},
        ],
    )
    with pytest.raises(InputError) as refused:
        run_stage(context(spark, workspace, table), interval("2024-01-01T01", "2024-01-01T02"))
    assert str(refused.value) == (
        "table s: [2024-01-01T01:00:00Z, 2024-01-01T02:00:00Z): schema change refused: V changes "
        "from bigint to string, which is not a widening. The batch's rows are in quarantine "
        "(2 new); staging and final are unchanged. Declare the column types in the config row's "
        "columns, then rerun the interval"
    )
    assert (
        delta.load_snapshot(paths.staging).version,
        delta.load_snapshot(paths.final).version,
    ) == versions
    reason = "schema change refused: V changes from bigint to string, which is not a widening"
    assert table_rows(paths.quarantine, ["ID", "V", "_cdc_reason"]) == [
        ("1", "one", reason),
        ("3", "3", reason),
    ]
    assert table_rows(paths.final, ["ID", "V"]) == [(1, 1)]
    # Not recorded as staged: a rerun refuses again, and adds no second copy to quarantine.
    with pytest.raises(InputError):
        run_stage(context(spark, workspace, table), interval("2024-01-01T01", "2024-01-01T02"))
    assert len(table_rows(paths.quarantine)) == 2


JSON_TABLE = {"name": "j", "file_format": "json", "keys": ["ID"], "sequence_by": ["SEQ"]}


def test_json_rows_give_the_schema_and_a_new_column_is_added(spark, workspace: Workspace) -> None:
    table = workspace.configure(JSON_TABLE)["j"]
    paths = workspace.paths("j")
    workspace.land(
        "j",
        "2024-01-01T00",
        "a.json",
        [
            {"FLAG": "I", "ID": 1, "SEQ": 1, "NAME": "Anna", "SCORE": 1.5},
            {"FLAG": "I", "ID": 2, "SEQ": 1, "NAME": "Elsa", "SCORE": 2},
        ],
        file_format="json",
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    types = {
        f.name: f.dataType.simpleString() for f in delta.load_snapshot(paths.final).schema.fields
    }
    assert {k: types[k] for k in ("ID", "SEQ", "NAME", "SCORE")} == {
        "ID": "bigint",
        "SEQ": "bigint",
        "NAME": "string",
        "SCORE": "double",
    }
    workspace.land(
        "j",
        "2024-01-01T01",
        "a.json",
        [
            {"FLAG": "U", "ID": 1, "SEQ": 2, "NAME": "Anna", "SCORE": 3, "CITY": "Arendelle"},
        ],
        file_format="json",
    )
    staged, _ = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert staged.counts["columns_added"] == 1
    assert table_rows(paths.final, ["ID", "NAME", "SCORE", "CITY"]) == [
        (1, "Anna", 3.0, "Arendelle"),
        (2, "Elsa", 2.0, None),
    ]


def test_quarantine_policy_refuses_any_change(spark, workspace: Workspace) -> None:
    table = workspace.configure({**JSON_TABLE, "on_schema_change": "quarantine"})["j"]
    paths = workspace.paths("j")
    workspace.land(
        "j", "2024-01-01T00", "a.json", [{"FLAG": "I", "ID": 1, "SEQ": 1}], file_format="json"
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    workspace.land(
        "j",
        "2024-01-01T01",
        "a.json",
        [{"FLAG": "U", "ID": 1, "SEQ": 2, "X": 1}],
        file_format="json",
    )
    with pytest.raises(
        InputError, match="on_schema_change is quarantine and the batch would add X bigint"
    ):
        run_stage(context(spark, workspace, table), interval("2024-01-01T01", "2024-01-01T02"))
    assert table_rows(paths.final, ["ID", "SEQ"]) == [(1, 1)]


def test_undeclared_columns_are_ignored_with_a_warning(spark, workspace: Workspace, capfd) -> None:
    declared = {**JSON_TABLE, "columns": {"ID": "bigint", "SEQ": "bigint", "NAME": "string"}}
    table = workspace.configure(declared)["j"]
    workspace.land(
        "j",
        "2024-01-01T00",
        "a.json",
        [
            {"FLAG": "I", "ID": 1, "SEQ": 1, "NAME": "Olaf", "EXTRA": "x", "MORE": 2},
        ],
        file_format="json",
    )
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert staged.counts["undeclared_columns_ignored"] == 2
    assert "columns not in the config row are ignored: EXTRA, MORE" in capfd.readouterr().err
    final = workspace.paths("j").final
    assert table_rows(final) == [(1, 1, "Olaf")]


def test_undeclared_keys_of_every_file_are_named_once(spark, workspace: Workspace, capfd) -> None:
    """With declared columns the undeclared keys are gathered by the per-file counts' pass: keys
    from two files and a malformed line, named once each, and no trace of them in the tables."""
    declared = {**JSON_TABLE, "columns": {"ID": "bigint", "SEQ": "bigint", "NAME": "string"}}
    table = workspace.configure(declared)["j"]
    rows_a = [
        {"FLAG": "I", "ID": 1, "SEQ": 1, "NAME": "a", "MORE": 2},
        {"FLAG": "I", "ID": 2, "SEQ": 1, "NAME": "b", "MORE": 3},
    ]
    rows_b = [{"FLAG": "U", "ID": 1, "SEQ": 2, "NAME": "c", "EXTRA": "x", "a b": 1, "_cdc_x": 3}]
    workspace.land("j", "2024-01-01T00", "a.json", rows_a, file_format="json")
    path = workspace.land("j", "2024-01-01T00", "b.json", rows_b, file_format="json")
    path.write_text(path.read_text() + "{not json\n")
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    counts = staged.counts
    assert (counts["staged"], counts["quarantined"], counts["undeclared_columns_ignored"]) == (
        3,
        1,
        4,
    )
    err = capfd.readouterr().err
    names = "EXTRA, MORE, _cdc_x, <1 key(s) that are not column names>"
    assert err.count(f"columns not in the config row are ignored: {names}") == 1
    paths = workspace.paths("j")
    assert table_rows(paths.final) == [(1, 2, "c"), (2, 1, "b")]
    for path in (paths.staging, paths.quarantine):
        assert not [c for c in delta.load_snapshot(path).schema.names if "undeclared" in c]


def test_a_widening_rewrite_raced_by_an_optimize_keeps_each_row_once(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Widening a type rewrites the whole table; an OPTIMIZE committing between that read and
    the commit leaves its compacted copy beside the rewrite (delta-rs lets the overwrite
    commit), so the rewrite sees it in the log and removes the duplicate rows."""
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from spark_jobs.optimize import optimize_table

    path = tmp_path / "t"
    narrow = StructType([StructField("ID", LongType()), StructField("N", IntegerType())])
    delta.ensure_table(path, narrow, [])
    for rows in ([(1, 10), (2, 20)], [(3, 30)]):
        delta.append_with_retries(spark.createDataFrame(rows, narrow), path, "test")
    assert len(delta.load_snapshot(path).files) >= 2
    optimized: list[tuple[int, int, int]] = []
    real_commit = delta.commit

    def optimize_then_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not optimized:
            optimized.append(optimize_table(path))
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(delta.committing, "commit", optimize_then_commit)
    wide = StructType([StructField("ID", LongType()), StructField("N", LongType())])
    assert delta.evolve_table(spark, path, wide) == ["widen N int -> bigint"]
    ((before, after, _),) = optimized
    assert after < before
    assert table_rows(path) == [(1, 10), (2, 20), (3, 30)]
    assert physical_types(path, "N") == {"int64"}
