"""The `cdc` command as users run it: exit codes, one summary line, one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, table_rows, ts

pytestmark = [pytest.mark.cli, pytest.mark.slow]

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
    assert result.returncode == 2  # a bad config, as the README says
    assert result.stdout.splitlines() == [
        f"{workspace.config_path}:3: table bad: colums: unknown field; did you mean `columns`?",
        f"{workspace.config_path}:3: table bad: columns: required for file_format csv (CSV "
        "values carry no types)",
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
    # overwrite-final's interval only labels its summary: optional, but both or neither.
    result = cdc(workspace, "overwrite-final", "t", "--start", "2024-01-01")
    assert (result.returncode, result.stderr.strip()) == (
        2,
        "error: overwrite-final: --start and --end go together: give both or neither",
    )


def test_a_uri_the_steps_cannot_use_is_refused_not_made_a_local_folder(
    workspace: Workspace, tmp_path: Path
) -> None:
    workspace.configure(TABLE)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for variable, uri, why in [
        ("CDC_WAREHOUSE", "gs://lake/wh", "the steps read and write local folders and s3://"),
        ("CDC_LANDING", "abfss://in@lake.dfs.core.windows.net/x", "the steps read and write"),
        ("CDC_WAREHOUSE", "s3://", "no bucket"),
    ]:
        result = cdc(
            workspace,
            "run",
            "t",
            "--start",
            "2024-01-01",
            "--end",
            "2024-01-02",
            cwd=str(cwd),
            **{variable: uri},
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"error: {variable}={uri}: {why}"), result.stderr
        assert result.stdout == ""
    assert list(cwd.iterdir()) == []  # no folder named "gs:" or "s3:"


def test_vacuum_below_a_week_needs_force(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    result = cdc(workspace, "vacuum", "t", "--retention-hours", "1")
    assert result.returncode == 2
    assert "below 168 h" in result.stderr and "--force" in result.stderr


@pytest.mark.classic_only  # the CLI as a user first runs it: a Spark driver of its own
def test_run_prints_one_summary_line_with_counts(
    any_workspace: Workspace, connect_server: Any
) -> None:
    workspace = any_workspace
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
    # The view's row and the alert's reasons read the same tables (local or on S3).
    from cdc_airflow.alerts import quarantine_reasons
    from cdc_airflow.view.status import table_status

    (config,) = workspace.configure(TABLE).values()
    row = table_status(config, [], paths=workspace.paths("t"))
    assert (row.problem, row.final_rows, row.staging_rows, row.quarantined_rows) == (None, 2, 3, 1)
    assert [count for _, count in row.top_reasons] == [1]
    newest = row.commits[0]
    assert (newest.version, newest.operation, newest.rows_added) == (1, "overwrite_final", 2)
    (reason,) = quarantine_reasons(workspace.paths("t").quarantine, 1)
    assert reason.startswith("1 x ") and "Q" in reason
    # The maintenance commands as Airflow's tasks run them, clients of the Connect server (each
    # classic process would start a JVM of its own: about 20 s each on 2 cores).
    for command in (["optimize", "t"], ["reset-staging", "t"], ["vacuum", "t"]):
        done = cdc(workspace, *command, CDC_SPARK_REMOTE=connect_server.url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"{command[0]} t: "), done.stdout
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE"]) == [(1, 2), (2, 1)]
    # overwrite-final without an interval applies what is staged and not applied yet.
    workspace.land(
        "t",
        "2024-01-01T01",
        "b.csv",
        [{"FLAG": "D", "ID": 2, "VALUE": None, "TS": "2024-01-01 01:00"}],
    )
    remote = {"CDC_SPARK_REMOTE": connect_server.url}
    staged = cdc(
        workspace, "stage", "t", "--start", "2024-01-01T01", "--end", "2024-01-01T02", **remote
    )
    assert staged.returncode == 0, staged.stderr
    applied = cdc(workspace, "overwrite-final", "t", **remote)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith("overwrite-final t: changes=1 "), applied.stdout
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE"]) == [(1, 2)]


def test_as_of_prints_and_writes_the_table_at_a_time(any_workspace: Workspace) -> None:
    workspace = any_workspace
    workspace.configure({**TABLE, "history": True})
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            {"ID": 1, "VALUE": 10, "TS": "2024-01-01T00:10:00Z", "FLAG": "I"},
            {"ID": 2, "VALUE": 20, "TS": "2024-01-01T00:10:00Z", "FLAG": "I"},
            {"ID": 1, "VALUE": 11, "TS": "2024-01-01T00:30:00Z", "FLAG": "U"},
            {"ID": 2, "VALUE": None, "TS": "2024-01-01T00:40:00Z", "FLAG": "D"},
        ],
    )
    ran = cdc(
        workspace, "run", "t", "--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z"
    )
    assert ran.returncode == 0, ran.stderr
    assert summary(ran)["history_rows_written"] == "3"
    printed = cdc(workspace, "as-of", "t", "--at", "2024-01-01T00:35:00Z")
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert lines[:3] == [
        "ID\tVALUE\tTS",
        "1\t11\t2024-01-01 00:30:00",
        "2\t20\t2024-01-01 00:10:00",
    ]
    assert lines[3].startswith("as-of t at 2024-01-01T00:35:00Z: rows=2 printed=2")
    target = workspace.warehouse.parent / "t_at_0020"
    written = cdc(workspace, "as-of", "t", "--at", "2024-01-01T00:20:00Z", "--output", str(target))
    assert written.returncode == 0, written.stderr
    assert table_rows(target) == [
        (1, 10, ts("2024-01-01T00:10:00Z")),
        (2, 20, ts("2024-01-01T00:10:00Z")),
    ]
    bad = cdc(workspace, "as-of", "t", "--at", "yesterday")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith("error: as-of: --at 'yesterday'")


@pytest.mark.classic_only
def test_a_damaged_delta_log_fails_with_one_line_naming_the_table(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    workspace.land(
        "t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "VALUE": 1, "TS": "2024-01-01"}]
    )
    staging = workspace.paths("t").staging
    (staging / "_delta_log").mkdir(parents=True)
    (staging / "_delta_log" / "00000000000000000000.json").write_text('{"commitInfo": {')
    result = cdc(workspace, "run", "t", "--start", "2024-01-01", "--end", "2024-01-01T01:00:00Z")
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]  # after the JVM's own start-up warning
    assert line.startswith(f"error: run t: the Delta table {staging} cannot be read (")
    assert "version 0, _delta_log/00000000000000000000.json is damaged" in line


def test_every_command_prints_one_json_object_with_json(workspace: Workspace) -> None:
    import json

    workspace.configure(TABLE)
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 1, "TS": "2024-01-01 00:00:00"},
            {"FLAG": "Q", "ID": 2, "VALUE": 1, "TS": "2024-01-01 00:00:00"},
        ],
    )
    hour = ["--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z"]
    result = cdc(workspace, "run", "t", *hour, "--json")
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    document = json.loads(line)
    assert (document["command"], document["ok"], document["exit_code"]) == ("run", True, 0)
    counts = document["summary"]["counts"]
    assert (counts["staged"], counts["quarantined"], counts["files_applied"]) == (1, 1, 1)
    assert document["summary"]["table"] == "t"
    # Before the command too; a failure keeps its exit code and says why in the object.
    failed = cdc(workspace, "--json", "run", "nope", *hour)
    assert failed.returncode == 2
    failure = json.loads(failed.stdout)
    assert (failure["ok"], failure["exit_code"]) == (False, 2)
    assert failure["error"].startswith("run: table nope: not in the config table")
    checked = json.loads(cdc(workspace, "check", "t", "--json").stdout)
    assert [t["table"] for t in checked["tables"]] == ["t"] and checked["ok"] is True
    version = cdc(workspace, "--version")
    assert version.returncode == 0 and version.stdout.strip() == "cdc 0.1.0"
