"""The `cdc` command as users run it: exit codes, one summary line, one-line errors."""

from __future__ import annotations

import pytest

from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, table_rows

pytestmark = pytest.mark.slow

TABLE = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def test_validate_prints_one_line_per_problem_and_fails(workspace: Workspace) -> None:
    workspace.config_path.write_text(
        "tables:\n"
        "  - {name: ok, file_format: parquet, keys: [ID], sequence_by: [TS]}\n"
        "  - {name: bad, file_format: csv, keys: [ID], sequence_by: [TS], colums: {ID: int}}\n"
    )
    result = cdc(workspace, "validate")
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "table bad: colums: unknown field (misspelt?)",
    ]
    workspace.config_path.write_text(
        "tables:\n  - {name: ok, file_format: parquet, keys: [ID], sequence_by: [TS]}\n"
    )
    result = cdc(workspace, "validate")
    assert (result.returncode, result.stdout.strip()) == (0, "ok: 1 table(s): ok")


def test_unknown_table_and_bad_timestamp_fail_with_one_line(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    result = cdc(workspace, "stage", "nope", "--start", "2024-01-01", "--end", "2024-01-02")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: stage: table nope: not in the config table (valid tables: t)"
    )
    result = cdc(workspace, "run", "t", "--start", "soon", "--end", "2024-01-02")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: run: 'soon' is not an ISO 8601 timestamp")


def test_vacuum_below_a_week_needs_force(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    result = cdc(workspace, "vacuum", "t", "--retention-hours", "1")
    assert result.returncode == 2
    assert "below 168 h" in result.stderr and "--force" in result.stderr


def test_run_prints_one_summary_line_with_counts(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:00"},
            {"FLAG": "I", "ID": 2, "VALUE": 1, "TS": "2024-01-01 00:00:00"},
            {"FLAG": "U", "ID": 1, "VALUE": 2, "TS": "2024-01-01 00:00:01"},
            {"FLAG": "Q", "ID": 3, "VALUE": 1, "TS": "2024-01-01 00:00:00"},
        ],
    )
    result = cdc(
        workspace, "run", "t", "--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z"
    )
    assert result.returncode == 0, result.stderr
    counts = summary(result)
    assert result.stdout.startswith("run t [2024-01-01T00:00:00Z, 2024-01-01T01:00:00Z): ")
    assert {
        k: counts[k]
        for k in (
            "files",
            "rows_read",
            "staged",
            "quarantined",
            "changes",
            "keys",
            "rows_written",
            "final_version",
        )
    } == {
        "files": "1",
        "rows_read": "4",
        "staged": "3",
        "quarantined": "1",
        "changes": "3",
        "keys": "2",
        "rows_written": "2",
        "final_version": "1",
    }
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE"]) == [(1, 2), (2, 1)]
    for command in (["optimize", "t"], ["reset-staging", "t"], ["vacuum", "t"]):
        done = cdc(workspace, *command)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{command[0]} t: "), done.stdout
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE"]) == [(1, 2), (2, 1)]
