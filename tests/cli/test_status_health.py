"""`cdc status` gives each table one health state with its reasons: unknown before anything is
applied (never ok), error for a table whose Delta log is damaged (named), warn for a file
outside the late-arrival window, error for a breached check; no Spark is started."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from cdc_pipeline.columns import CHECK_FILE
from tests.cli.cdc import cdc
from tests.helpers import Workspace

pytestmark = [pytest.mark.cli]

ROW = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def status(workspace: Workspace) -> dict[str, Any]:
    result = cdc(workspace, "status", "t", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    document: dict[str, Any] = json.loads(result.stdout)["tables"][0]
    return document


def test_a_table_that_applied_nothing_is_unknown(workspace: Workspace) -> None:
    workspace.configure(ROW)
    document = status(workspace)
    assert (document["health"], document["reasons"]) == ("unknown", ["nothing applied yet"])


def test_a_damaged_log_is_an_error_naming_the_table(workspace: Workspace) -> None:
    workspace.configure(ROW)
    staging = workspace.paths("t").staging
    write_deltalake(str(staging), pa.table({"ID": [1]}))
    (staging / "_delta_log" / "00000000000000000000.json").write_text('{"commitInfo":{"trunc')
    document = status(workspace)
    assert document["health"] == "error"
    [reason] = document["reasons"]
    assert reason.startswith(f"unreadable: the Delta table {staging} cannot be read (")
    assert "version 0, _delta_log/00000000000000000000.json is damaged" in reason


def test_files_outside_the_window_warn_and_a_breached_check_is_an_error(
    workspace: Workspace,
) -> None:
    workspace.configure({**ROW, "late_arrival_window": "1h"})
    workspace.land("t", "2024-01-01T00", "old.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    document = status(workspace)
    assert document["health"] == "warn"
    command = "cdc run t --start 2024-01-01T00:00:00Z --end 2024-01-01T01:00:00Z"
    assert document["reasons"] == [
        "1 file(s) outside the late-arrival window, never applied: `cdc status` lists them; "
        f"`{command}` over their hour applies them"
    ]
    [listed] = document["outside_files"]
    assert (listed["path"], listed["hour"], listed["apply_with"]) == (
        "dt=2024-01-01/hr=00/old.csv",
        "2024-01-01T00:00:00Z",
        command,
    )
    shown = cdc(workspace, "status", "t")
    assert shown.stdout.startswith("status t: health=warn measured_at=")
    assert len(shown.stdout.splitlines()) == 1  # one key=value line per table
    why, listed_line = shown.stderr.splitlines()[-2:]
    assert why == f"status t: warn: {document['reasons'][0]}"
    assert listed_line.startswith(
        "  outside window: dt=2024-01-01/hr=00/old.csv (hour 2024-01-01T00"
    )
    assert listed_line.endswith(f"h old): {command}")
    check = workspace.paths("t").table_root / CHECK_FILE
    check.parent.mkdir(parents=True, exist_ok=True)
    check.write_text(json.dumps({"checked_at": "x", "ok": False, "breaches": ["key 1 twice"]}))
    document = status(workspace)
    assert (document["health"], document["reasons"][0]) == (
        "error",
        "check breached: key 1 twice",
    )


def test_a_step_on_a_damaged_log_fails_once_naming_the_version_and_file(
    workspace: Workspace,
) -> None:
    """The raw DeltaError of a truncated commit becomes one line: the table, the version, the
    file and the way out; exit 1 with no traceback (Airflow fails it without retries)."""
    workspace.configure(ROW)
    workspace.land("t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    staging = workspace.paths("t").staging
    write_deltalake(str(staging), pa.table({"ID": [1]}))
    write_deltalake(str(staging), pa.table({"ID": [2]}), mode="append")
    commit = staging / "_delta_log" / "00000000000000000001.json"
    commit.write_text(commit.read_text()[:40])
    result = cdc(workspace, "stage", "t", "--start", "2024-01-01", "--end", "2024-01-01T01:00:00Z")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: stage t: the Delta table {staging} cannot be read (")
    assert "version 1, _delta_log/00000000000000000001.json is damaged. Retrying does not" in line
