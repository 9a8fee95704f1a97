"""`cdc check`: each invariant broken on purpose gives its exact breach line; a good table is ok.

The good table is built once by the real steps; each test copies it and breaks one invariant by
writing the Delta tables directly with deltalake, as a buggy writer would. Also here: a rerun
of an applied interval commits nothing to any table, history included (flat and snapshot
tables), and the table stays ok.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_pipeline.config import TableConfig
from spark_jobs.check import CHECK_FILE, exit_code, main, run_check
from spark_jobs.reset_staging import run_reset_staging
from spark_jobs.stage import run_stage
from tests.helpers import Workspace, interval, table_rows, ts
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark
ARRIVAL = ("_cdc_batch", "_cdc_file", "_cdc_row")
COMMITTED = ("final", "tombstones", "history_log", "history")  # the tables overwrite-final writes
HISTORY = ["ID", "VALUE", "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]

ROW = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "P": "int", "VALUE": "string", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "partition_expression": "P",
    "partition_column": "P_PART",
    "history": True,
}


def land_story(ws: Workspace) -> None:
    """Hour 0 inserts 1-4 in partitions 1 and 2; hour 1 moves 2 to partition 3, deletes 3."""
    ws.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            {"FLAG": "I", "ID": i, "P": 1 + i % 2, "VALUE": f"v{i}", "TS": "2024-01-01 00:00:01"}
            for i in (1, 2, 3, 4)
        ],
    )
    ws.land(
        "t",
        "2024-01-01T01",
        "b.csv",
        [
            {"FLAG": "U", "ID": 2, "P": 3, "VALUE": "moved", "TS": "2024-01-01 01:00:01"},
            {"FLAG": "D", "ID": 3, "TS": "2024-01-01 01:00:02"},
        ],
    )


# The story's history: 2's move opens a version, 3's delete closes its only one.
STORY_HISTORY = sorted(
    [
        (1, "v1", ts("2024-01-01T00:00:01Z"), None, True, False),
        (2, "v2", ts("2024-01-01T00:00:01Z"), ts("2024-01-01T01:00:01Z"), False, False),
        (2, "moved", ts("2024-01-01T01:00:01Z"), None, True, False),
        (3, "v3", ts("2024-01-01T00:00:01Z"), ts("2024-01-01T01:00:02Z"), False, True),
        (4, "v4", ts("2024-01-01T00:00:01Z"), None, True, False),
    ],
    key=repr,
)


@pytest.fixture(scope="module")
def good_warehouse(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The story applied by stage + overwrite-final, hour by hour: final holds 1, 2, 4."""
    ws = Workspace(tmp_path_factory.mktemp("good"))
    table = ws.configure(ROW)["t"]
    land_story(ws)
    run(spark, ws, table, "2024-01-01T00", "2024-01-01T01")
    run(spark, ws, table, "2024-01-01T01", "2024-01-01T02")
    assert table_rows(ws.paths("t").final, ["ID", "P_PART"]) == [(1, 2), (2, 3), (4, 1)]
    return ws.warehouse


@pytest.fixture
def table(workspace: Workspace, good_warehouse: Path) -> TableConfig:
    """A copy of the good table in this test's workspace."""
    shutil.copytree(good_warehouse, workspace.warehouse)
    land_story(workspace)
    return workspace.configure(ROW)["t"]


def check(spark: Any, ws: Workspace, table: TableConfig) -> tuple[str, int]:
    """The check line and exit code of the table."""
    (result,) = run_check(spark, [table], ws.warehouse)
    return result.line(), exit_code([result])


def version(path: Path) -> int:
    return DeltaTable(str(path)).version()


def append(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows straight to a Delta table (what a writer breaking an invariant would do)."""
    target = DeltaTable(str(path))
    schema = target.to_pyarrow_table().schema
    partitions = list(target.metadata().partition_columns) or None
    write_deltalake(
        str(path), pa.Table.from_pylist(rows, schema), mode="append", partition_by=partitions
    )


def final_row(ws: Workspace, key: int) -> dict[str, Any]:
    rows = DeltaTable(str(ws.paths("t").final)).to_pyarrow_table().to_pylist()
    return next(r for r in rows if r["ID"] == key)


def test_a_good_table_is_ok_and_the_check_file_says_so(
    spark: Any, workspace: Workspace, table: TableConfig
) -> None:
    paths = workspace.paths("t")
    versions = {n: version(getattr(paths, n)) for n in ("final", "staging", "tombstones")}
    line, code = check(spark, workspace, table)
    assert code == 0
    assert line.startswith("check t: ok keys=3 tombstones=1 versions=")
    assert f"final@{versions['final']}" in line and f"staging@{versions['staging']}" in line
    written = json.loads((paths.table_root / CHECK_FILE).read_text())
    assert written["ok"] is True and written["breaches"] == []
    assert written["versions"]["final"] == versions["final"]
    assert written["versions"]["tombstones"] == versions["tombstones"]
    assert written["checked_at"].endswith("Z") and written["seconds"] > 0
    # After a reset, staging is final plus tombstones: still ok.
    run_reset_staging(context(spark, workspace, table))
    assert check(spark, workspace, table)[1] == 0


def test_a_duplicated_key_in_final(spark: Any, workspace: Workspace, table: TableConfig) -> None:
    final = workspace.paths("t").final
    append(final, [final_row(workspace, 4)])
    line, code = check(spark, workspace, table)
    assert (line, code) == (
        f"check t: BREACH duplicate keys in final: 1 key, e.g. ID=4 (version {version(final)})",
        1,
    )
    written = json.loads((workspace.paths("t").table_root / CHECK_FILE).read_text())
    assert written["ok"] is False
    assert written["breaches"] == [line.removeprefix("check t: BREACH ")]


def test_a_key_in_two_partitions(spark: Any, workspace: Workspace, table: TableConfig) -> None:
    final = workspace.paths("t").final
    append(final, [{**final_row(workspace, 1), "P": 5, "P_PART": 5}])
    assert check(spark, workspace, table) == (
        f"check t: BREACH keys in two partitions of final: 1 key, e.g. ID=1 "
        f"(version {version(final)})",
        1,
    )


def test_a_live_key_with_a_later_tombstone(
    spark: Any, workspace: Workspace, table: TableConfig
) -> None:
    paths = workspace.paths("t")
    row = final_row(workspace, 1)
    later = row["TS"].replace(hour=5)
    append(paths.tombstones, [{"ID": 1, "TS": later, **{c: row[c] for c in ARRIVAL}}])
    assert check(spark, workspace, table) == (
        "check t: BREACH live keys in final with a later delete in tombstones: 1 key, e.g. ID=1 "
        f"(final version {version(paths.final)}, tombstones version {version(paths.tombstones)})",
        1,
    )


def test_history_current_rows_differ_from_final(
    spark: Any, workspace: Workspace, table: TableConfig
) -> None:
    paths = workspace.paths("t")
    current = [
        r
        for r in DeltaTable(str(paths.history)).to_pyarrow_table().to_pylist()
        if r["ID"] == 4 and r["_cdc_is_current"]
    ]
    append(paths.history, [{**current[0], "ID": 99}])
    assert check(spark, workspace, table) == (
        "check t: BREACH history's current rows differ from final: 1 row only in history, "
        f"0 rows only in final, e.g. ID=99 (history version {version(paths.history)}, "
        f"final version {version(paths.final)})",
        1,
    )


@pytest.mark.parametrize("name", ["final", "staging", "tombstones", "history", "ledger"])
def test_a_missing_data_file(
    spark: Any, workspace: Workspace, table: TableConfig, name: str
) -> None:
    path = getattr(workspace.paths("t"), name)
    files = sorted(DeltaTable(str(path)).file_uris())
    Path(files[0]).unlink()
    relative = Path(files[0]).relative_to(path)
    assert check(spark, workspace, table) == (
        f"check t: BREACH missing data files in {name}: 1 file, e.g. {relative} "
        f"(version {version(path)})",
        1,
    )


def unapplied_idents(ws: Workspace, name: str) -> set[tuple[str, str]]:
    """(batch, file) of the staged file versions the applied table does not mark."""
    paths = ws.paths(name)
    staged = DeltaTable(str(paths.staging)).to_pyarrow_table(columns=list(ARRIVAL[:2]))
    marked = DeltaTable(str(paths.applied)).to_pyarrow_table(columns=["batch", "file"])
    return {(r["_cdc_batch"], r["_cdc_file"]) for r in staged.to_pylist()} - {
        (r["batch"], r["file"]) for r in marked.to_pylist()
    }


def mark_applied(ws: Workspace, name: str, ident: tuple[str, str]) -> None:
    """Mark a file version applied without applying it (what a run losing a change would do)."""
    paths = ws.paths(name)
    mark = {"batch": ident[0], "file": ident[1], "rows": 1, "landed_mtime_ns": 0}
    mark |= {"applied_at": datetime.now(UTC), "run_id": "lost", "final_version": 0}
    append(paths.applied, [mark])


def test_a_change_waiting_for_overwrite_final_is_not_a_breach_a_lost_one_is(
    spark: Any, workspace: Workspace, table: TableConfig
) -> None:
    workspace.land(
        "t",
        "2024-01-01T02",
        "c.csv",
        [{"FLAG": "U", "ID": 4, "P": 1, "VALUE": "new", "TS": "2024-01-01 02:00:01"}],
    )
    # Staged, not applied yet: what a check sees between a run's stage and its overwrite-final,
    # or another run's, in an overlapping backfill. The next overwrite-final applies it.
    run_stage(context(spark, workspace, table), interval("2024-01-01T02", "2024-01-01T03"))
    line, code = check(spark, workspace, table)
    assert (line.startswith("check t: ok keys=3 tombstones=1 versions="), code) == (True, 0), line
    # The file marked applied while final lacks its change: lost.
    (waiting,) = unapplied_idents(workspace, "t")
    mark_applied(workspace, "t", waiting)
    paths = workspace.paths("t")
    assert check(spark, workspace, table) == (
        "check t: BREACH staging has changes of applied files later than final and tombstones "
        f"(lost): 1 key, e.g. ID=4 (staging version {version(paths.staging)}, applied version "
        f"{version(paths.applied)})",
        1,
    )
    # Without the wrong marks (the applied table removed) the next run applies every staged
    # file again, which changes nothing already applied, and repairs the table.
    shutil.rmtree(paths.applied)
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert table_rows(paths.final, ["ID", "VALUE"]) == [(1, "v1"), (2, "moved"), (4, "new")]
    assert check(spark, workspace, table)[1] == 0


def test_a_table_staged_and_never_applied_is_ok(spark: Any, workspace: Workspace) -> None:
    # No overwrite-final yet, so no applied marks: every staged change waits (an overlapping
    # backfill's first runs), none is lost.
    table = workspace.configure(ROW)["t"]
    land_story(workspace)
    run_stage(context(spark, workspace, table), interval("2024-01-01T00", "2024-01-01T02"))
    assert not workspace.paths("t").applied.exists()
    line, code = check(spark, workspace, table)
    assert (line.startswith("check t: ok keys=0 versions=staging@"), code) == (True, 0), line


def test_an_unknown_table_is_a_bad_config(workspace: Workspace, table: TableConfig) -> None:
    assert main(["nope", "--config", str(workspace.config_path)]) == 2


def test_a_rerun_of_an_applied_interval_commits_nothing(
    spark: Any, workspace: Workspace, table: TableConfig
) -> None:
    paths = workspace.paths("t")
    before = {n: version(getattr(paths, n)) for n in COMMITTED}
    rows = table_rows(paths.final)
    history = table_rows(paths.history, HISTORY)
    assert history == STORY_HISTORY
    for start, end in (("2024-01-01T01", "2024-01-01T02"), ("2024-01-01T00", "2024-01-01T01")):
        staged, applied = run(spark, workspace, table, start, end)
        assert (staged.counts["new_files"], applied.counts["rows_written"]) == (0, 0)
        assert applied.counts["final_version"] == before["final"]
        assert applied.counts["history_version"] == before["history"]
        assert applied.counts["history_rows_written"] == 0
    assert {n: version(getattr(paths, n)) for n in COMMITTED} == before
    assert table_rows(paths.final) == rows
    assert table_rows(paths.history, HISTORY) == STORY_HISTORY
    assert check(spark, workspace, table)[1] == 0


def test_a_rerun_of_an_applied_extract_commits_nothing(spark: Any, workspace: Workspace) -> None:
    table = workspace.configure(
        {
            "name": "s",
            "change_format": "snapshot",
            "file_format": "csv",
            "columns": {"ID": "bigint", "VALUE": "string"},
            "keys": ["ID"],
            "history": True,
        }
    )["s"]
    extracts = {0: [(1, "a"), (2, "b"), (3, "c")], 1: [(1, "a"), (2, "B"), (4, "d")]}
    for hour, rows in extracts.items():
        workspace.land(
            "s", f"2024-01-01T0{hour}", "x.csv", [{"ID": i, "VALUE": v} for i, v in rows]
        )
        run(spark, workspace, table, f"2024-01-01T0{hour}", f"2024-01-01T0{hour + 1}")
    paths = workspace.paths("s")
    before = {n: version(getattr(paths, n)) for n in COMMITTED}
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert applied.counts["final_version"] == before["final"]
    assert applied.counts["history_version"] == before["history"]
    assert {n: version(getattr(paths, n)) for n in COMMITTED} == before
    assert table_rows(paths.final, ["ID", "VALUE"]) == [(1, "a"), (2, "B"), (4, "d")]
    hour = [ts(f"2024-01-01T0{h}:00:00Z") for h in (0, 1)]
    assert table_rows(paths.history, ["ID", "VALUE", *HISTORY[2:]]) == sorted(
        [
            (1, "a", hour[0], None, True, False),
            (2, "b", hour[0], hour[1], False, False),
            (2, "B", hour[1], None, True, False),
            (3, "c", hour[0], hour[1], False, True),
            (4, "d", hour[1], None, True, False),
        ],
        key=repr,
    )
    assert check(spark, workspace, table)[1] == 0


def test_an_insert_only_table_counts_events_and_names_a_repeated_or_moved_one(
    spark: Any, workspace: Workspace
) -> None:
    table = workspace.configure(
        {
            "name": "e",
            "file_format": "csv",
            "columns": {"ID": "bigint", "SEQ": "int", "P": "int"},
            "keys": ["ID"],
            "sequence_by": ["SEQ"],
            "insert_only": True,
            "partition_expression": "P",
            "partition_column": "P_PART",
        }
    )["e"]
    events = [{"ID": 1, "SEQ": 1, "P": 1}, {"ID": 1, "SEQ": 2, "P": 1}, {"ID": 2, "SEQ": 1, "P": 2}]
    workspace.land("e", "2024-01-01T00", "a.csv", [{"FLAG": "I", **e} for e in events])
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    line, code = check(spark, workspace, table)
    assert line.startswith("check e: ok keys=3 versions=final@") and code == 0
    final = workspace.paths("e").final
    rows = DeltaTable(str(final)).to_pyarrow_table().to_pylist()
    event = {(r["ID"], r["SEQ"]): r for r in rows}
    append(final, [event[(1, 2)]])
    assert check(spark, workspace, table) == (
        f"check e: BREACH duplicate events in final: 1 event, e.g. ID=1,SEQ=2 "
        f"(version {version(final)})",
        1,
    )
    append(final, [{**event[(2, 1)], "P": 3, "P_PART": 3}])
    assert check(spark, workspace, table) == (
        f"check e: BREACH duplicate events in final: 1 event, e.g. ID=1,SEQ=2 "
        f"(version {version(final)}); keys in two partitions of final: 1 key, e.g. ID=2,SEQ=1 "
        f"(version {version(final)})",
        1,
    )
    # An event staged and not applied yet is no breach; once its file is marked applied, it is.
    workspace.land("e", "2024-01-01T01", "b.csv", [{"FLAG": "I", "ID": 3, "SEQ": 1, "P": 1}])
    run_stage(context(spark, workspace, table), interval("2024-01-01T01", "2024-01-01T02"))
    breached = check(spark, workspace, table)
    assert breached[0].count("BREACH") == 1 and "staging" not in breached[0]
    (waiting,) = unapplied_idents(workspace, "e")
    mark_applied(workspace, "e", waiting)
    staging = workspace.paths("e").staging
    assert check(spark, workspace, table)[0] == (
        f"{breached[0]}; staging has events of applied files not in final (lost): 1 event, "
        f"e.g. ID=3,SEQ=1 (staging version {version(staging)})"
    )
