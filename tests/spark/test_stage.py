"""Staging: typing, quarantine of bad rows, insert-only tables."""

from __future__ import annotations

import pytest

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import ConfigError
from spark_jobs.stage import run_stage
from tests.helpers import Workspace, file_paths, interval, table_rows
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark

YEARLY = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "D": "string", "N": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "partition_expression": "year(to_date(D, 'MM/dd/yyyy'))",
    "partition_column": "Y",
}


def test_bad_rows_go_to_quarantine_with_their_reason(spark, workspace: Workspace) -> None:
    table = workspace.configure(YEARLY)["t"]
    good = {"FLAG": "I", "ID": 1, "D": "01/01/2020", "N": 1, "TS": "2024-01-01 00:00:00"}
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            good,
            {**good, "ID": None},
            {**good, "ID": 2, "FLAG": "X"},
            {**good, "ID": 3, "FLAG": None},
            {**good, "ID": 4, "N": "many"},
            {**good, "ID": 5, "TS": None},
            {**good, "ID": 6, "TS": "not a time"},
            {**good, "ID": 7, "D": "31/31/2020"},
            {
                "FLAG": "d",
                "ID": 8,
                "D": None,
                "N": "junk",
                "TS": "2024-01-01 00:00:00",
            },  # a key-only delete is fine
        ],
    )
    stage, _apply = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (stage.counts["rows_read"], stage.counts["staged"], stage.counts["quarantined"]) == (
        9,
        2,
        7,
    )
    assert table_rows(workspace.paths("t").quarantine, ["ID", "_cdc_reason", "_cdc_row"]) == sorted(
        [
            (None, "null key column ID", 1),
            ("2", "unknown flag in FLAG: 'X' (expected I, U or D)", 2),
            ("3", "unknown flag in FLAG: 'null' (expected I, U or D)", 3),
            ("4", "unparsable value in N: 'many' is not a valid int", 4),
            ("5", "null sequence_by column TS", 5),
            ("6", "unparsable value in TS: 'not a time' is not a valid timestamp", 6),
            ("7", "partition_expression gives null (year(to_date(D, 'MM/dd/yyyy')))", 7),
        ],
        key=repr,
    )
    assert table_rows(workspace.paths("t").final, ["ID", "Y"]) == [(1, 2020)]
    # Quarantine rows keep what was read, as text.
    assert ("4", "many", "I") in table_rows(workspace.paths("t").quarantine, ["ID", "N", "FLAG"])


def test_malformed_json_line_is_quarantined_with_the_line(spark, workspace: Workspace) -> None:
    table = workspace.configure({**YEARLY, "file_format": "json"})["t"]
    folder = workspace.landing / "t" / "dt=2024-01-01" / "hr=00"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text(
        '{"FLAG": "I", "ID": 1, "D": "01/01/2020", "N": 1, "TS": "2024-01-01T00:00:00Z"}\n{"FLAG": "I", "ID": 2,\n'
    )
    stage, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (stage.counts["staged"], stage.counts["quarantined"]) == (1, 1)
    assert table_rows(workspace.paths("t").quarantine, ["_cdc_raw", "_cdc_reason"]) == [
        ('{"FLAG": "I", "ID": 2,', "malformed line: not a JSON object")
    ]


def test_csv_columns_are_matched_by_header_name(spark, workspace: Workspace) -> None:
    table = workspace.configure(YEARLY)["t"]
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [{"TS": "2024-01-01 00:00:00", "N": 5, "ID": 1, "D": "01/01/2021", "FLAG": "I"}],
    )
    workspace.land(
        "t", "2024-01-01T00", "b.csv", [{"FLAG": "D", "ID": 2, "TS": "2024-01-01 00:00:00"}]
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert table_rows(workspace.paths("t").final, ["ID", "N", "Y"]) == [(1, 5, 2021)]


def test_bad_partition_expression_is_a_config_error(spark, workspace: Workspace) -> None:
    # Validation refuses an undeclared column now; a row built without it (model_construct)
    # still fails at Spark's analysis, before anything is written.
    valid = workspace.configure(YEARLY)["t"]
    table = TableConfig.model_construct(
        **{**valid.model_dump(), "partition_expression": "year(NO_SUCH_COLUMN)"}
    )
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [{"FLAG": "I", "ID": 1, "D": "x", "N": 1, "TS": "2024-01-01 00:00:00"}],
    )
    with pytest.raises(ConfigError, match=r"^table t: partition_expression: .*NO_SUCH_COLUMN"):
        run_stage(context(spark, workspace, table), interval("2024-01-01T00", "2024-01-01T01"))
    assert not workspace.paths("t").staging.exists()


EVENTS = {
    "name": "ev",
    "file_format": "json",
    "columns": {"EVENT_ID": "string", "EVENT_TIME": "timestamp", "KIND": "string"},
    "keys": ["EVENT_ID"],
    "sequence_by": ["EVENT_TIME"],
    "partition_expression": "to_date(EVENT_TIME)",
    "partition_column": "EVENT_DATE",
    "insert_only": True,
}


def event(id_: str, when: str, kind: str = "click") -> dict:
    return {"EVENT_ID": id_, "EVENT_TIME": when, "KIND": kind}


def test_insert_only_appends_each_key_and_sequence_once(spark, workspace: Workspace) -> None:
    table = workspace.configure(EVENTS)["ev"]
    final = workspace.paths("ev").final
    workspace.land(
        "ev",
        "2024-01-01T23",
        "a.json",
        [
            event("a", "2024-01-01T23:10:00Z"),
            event("b", "2024-01-01T23:20:00Z"),
            event("a", "2024-01-01T23:10:00Z"),
        ],
        file_format="json",
    )
    run(spark, workspace, table, "2024-01-01T23", "2024-01-02T00")
    first_files = file_paths(final)
    workspace.land(
        "ev",
        "2024-01-02T00",
        "a.json",
        [
            event("a", "2024-01-01T23:10:00Z"),  # re-sent
            event("a", "2024-01-02T00:05:00Z"),  # same key, new sequence: a second event
            event("c", "2024-01-02T00:06:00Z", "buy"),
            {"FLAG": "D", **event("b", "2024-01-02T00:07:00Z")},
        ],
        file_format="json",
    )
    stage, apply = run(spark, workspace, table, "2024-01-02T00", "2024-01-02T01")
    assert stage.counts["quarantined"] == 1
    assert apply.counts["rows_written"] == 2
    run(spark, workspace, table, "2024-01-02T00", "2024-01-02T01")  # rerun appends nothing
    from tests.helpers import ts

    assert table_rows(final, ["EVENT_ID", "EVENT_TIME", "KIND", "EVENT_DATE"]) == sorted(
        [
            ("a", ts("2024-01-01T23:10:00Z"), "click", ts("2024-01-01T00:00:00Z").date()),
            ("b", ts("2024-01-01T23:20:00Z"), "click", ts("2024-01-01T00:00:00Z").date()),
            ("a", ts("2024-01-02T00:05:00Z"), "click", ts("2024-01-02T00:00:00Z").date()),
            ("c", ts("2024-01-02T00:06:00Z"), "buy", ts("2024-01-02T00:00:00Z").date()),
        ],
        key=repr,
    )
    assert first_files <= file_paths(final)  # old files never rewritten
    assert table_rows(workspace.paths("ev").quarantine, ["EVENT_ID", "_cdc_reason"]) == [
        ("b", "delete on an insert_only table")
    ]
