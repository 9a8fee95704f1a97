"""What a run reads is what has landed, not what the clock says: late files, sub-hourly runs,
outages, files written during a run and files outside the late-arrival window, through the real
`cdc` command."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli.cdc import cdc, start, summary
from tests.helpers import Workspace, exists, table_rows

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TABLE = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "VALUE": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def change(flag: str, id_: int, value: int | None, ts: str) -> dict[str, Any]:
    return {"FLAG": flag, "ID": id_, "VALUE": value, "TS": f"2024-01-01 {ts}"}


def window(start: str, end: str) -> list[str]:
    return ["--start", f"2024-01-01T{start}:00Z", "--end", f"2024-01-01T{end}:00Z"]


def run(workspace: Workspace, start: str, end: str, *extra: str) -> dict[str, str]:
    result = cdc(workspace, "run", "t", *window(start, end), *extra)
    assert result.returncode == 0, result.stderr
    return summary(result)


def final(workspace: Workspace) -> list[tuple[Any, ...]]:
    path = workspace.paths("t").final
    return table_rows(path, ["ID", "VALUE"]) if exists(path) else []


def test_a_file_landing_in_an_old_hour_after_its_run_is_applied_by_the_next_run(
    any_workspace: Workspace,
) -> None:
    workspace = any_workspace
    workspace.configure(TABLE)
    workspace.land("t", "2024-01-01T00", "a.csv", [change("I", 1, 1, "00:10:00")])
    first = run(workspace, "00:00", "01:00")
    assert first["files_applied"] == "1"
    # Lands in hour 00's folder after that hour's run; hour 01 gets its own file.
    workspace.land("t", "2024-01-01T00", "late.csv", [change("I", 2, 1, "00:50:00")])
    workspace.land("t", "2024-01-01T01", "c.csv", [change("I", 3, 1, "01:10:00")])
    second = run(workspace, "01:00", "02:00")
    assert (second["new_files"], second["staged"], second["files_applied"]) == ("2", "2", "2")
    assert final(workspace) == [(1, 1), (2, 1), (3, 1)]
    # A rerun of either interval stages and applies nothing again.
    for start_, end_ in (("00:00", "01:00"), ("01:00", "02:00")):
        again = run(workspace, start_, end_)
        assert (again["new_files"], again["files_applied"]) == ("0", "0")
    assert final(workspace) == [(1, 1), (2, 1), (3, 1)]


def test_quarter_hour_runs_over_an_hourly_folder_apply_what_landed_since_the_previous_run(
    workspace: Workspace,
) -> None:
    workspace.configure({**TABLE, "schedule": "*/15 * * * *"})
    workspace.land("t", "2024-01-01T00", "a.csv", [change("I", 1, 1, "00:05:00")])
    run(workspace, "00:00", "00:15")
    assert final(workspace) == [(1, 1)]
    workspace.land("t", "2024-01-01T00", "b.csv", [change("U", 1, 2, "00:20:00")])
    run(workspace, "00:15", "00:30")
    assert final(workspace) == [(1, 2)]
    version = summary(cdc(workspace, "overwrite-final", "t", *window("00:30", "00:45")))
    assert (version["files_applied"], version["changes"]) == ("0", "0")
    workspace.land("t", "2024-01-01T00", "c.csv", [change("I", 2, 1, "00:50:00")])
    run(workspace, "00:45", "01:00")
    assert final(workspace) == [(1, 2), (2, 1)]


def test_one_run_after_an_outage_applies_every_missed_hour(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    for hour in range(6):
        workspace.land(
            "t", f"2024-01-01T{hour:02d}", "a.csv", [change("U", 1, hour, f"{hour:02d}:30:00")]
        )
        workspace.land(
            "t", f"2024-01-01T{hour:02d}", "b.csv", [change("I", 10 + hour, 0, f"{hour:02d}:30:00")]
        )
    # The scheduler was down for hours 00-04: the first run after it is 05-06.
    result = run(workspace, "05:00", "06:00")
    assert (result["new_files"], result["files_applied"]) == ("12", "12")
    assert final(workspace) == [(1, 5), *[(10 + h, 0) for h in range(6)]]


def test_a_file_outside_the_window_is_counted_and_named_never_staged_silently(
    any_workspace: Workspace,
) -> None:
    workspace = any_workspace
    workspace.configure({**TABLE, "late_arrival_window": "2h"})
    workspace.land("t", "2024-01-01T05", "now.csv", [change("I", 1, 1, "05:10:00")])
    workspace.land("t", "2024-01-01T01", "old.csv", [change("I", 2, 1, "01:10:00")])
    result = cdc(workspace, "run", "t", *window("05:00", "06:00"))
    assert result.returncode == 0, result.stderr
    counts = summary(result)
    assert (counts["files_outside_window"], counts["files_applied"]) == ("1", "1")
    assert final(workspace) == [(1, 1)]
    warning = [line for line in result.stderr.splitlines() if "late_arrival_window" in line]
    assert len(warning) == 1, result.stderr
    assert "dt=2024-01-01/hr=01/old.csv" in warning[0]
    command = "cdc run t --start 2024-01-01T01:00:00Z --end 2024-01-01T06:00:00Z"
    assert command in warning[0]
    # The command the warning gives applies it, and nothing is left outside.
    applied = run(workspace, "01:00", "06:00")
    assert (applied["new_files"], applied["files_outside_window"]) == ("1", "0")
    assert final(workspace) == [(1, 1), (2, 1)]


def test_a_late_older_update_of_a_deleted_key_never_brings_it_back(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    workspace.land("t", "2024-01-01T00", "a.csv", [change("I", 1, 1, "00:10:00")])
    workspace.land("t", "2024-01-01T01", "a.csv", [change("D", 1, None, "01:10:00")])
    run(workspace, "00:00", "01:00")
    run(workspace, "01:00", "02:00")
    assert final(workspace) == []
    # An update made before the delete lands late, in hour 00's folder.
    workspace.land("t", "2024-01-01T00", "late.csv", [change("U", 1, 9, "00:40:00")])
    result = run(workspace, "02:00", "03:00")
    assert result["files_applied"] == "1"
    assert final(workspace) == []


def test_late_files_staged_then_reset_and_optimized_are_applied_once(
    workspace: Workspace,
) -> None:
    # Local folders only: the late-file listing on S3 is the first two tests of this module.
    workspace.configure(TABLE)
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [change("I", 1, 1, "00:10:00"), change("I", 2, 1, "00:10:00")],
    )
    run(workspace, "00:00", "01:00")
    workspace.land(
        "t",
        "2024-01-01T00",
        "late.csv",
        [
            change("U", 1, 2, "00:50:00"),
            change("U", 2, 2, "00:50:00"),
            change("U", 2, 3, "00:55:00"),
        ],
    )
    # Older than what final holds: the reset drops it, and nothing of it is left to apply.
    workspace.land("t", "2024-01-01T00", "older.csv", [change("U", 1, 7, "00:01:00")])
    staged = summary(cdc(workspace, "stage", "t", *window("01:00", "02:00")))
    assert staged["staged"] == "4"
    for step in ("reset-staging", "optimize"):
        result = cdc(workspace, step, "t")
        assert result.returncode == 0, result.stderr
    # Staged before the reset, applied after it: the reset kept the changes final lacked.
    applied = summary(cdc(workspace, "overwrite-final", "t", *window("01:00", "02:00")))
    assert applied["files_applied"] == "2"
    assert final(workspace) == [(1, 2), (2, 3)]
    status = summary(cdc(workspace, "status", "t", "--at", "2024-01-01T02:00:00Z"))
    assert (status["files_waiting"], status["files_applied"]) == ("0", "3")
    again = summary(cdc(workspace, "overwrite-final", "t", *window("02:00", "03:00")))
    assert (again["files_applied"], again["changes"]) == ("0", "0")
    check = cdc(workspace, "check", "t")
    assert check.returncode == 0, check.stdout + check.stderr


def test_intervals_run_in_any_order_give_the_same_final(workspace: Workspace) -> None:
    workspace.configure(TABLE)
    workspace.land("t", "2024-01-01T00", "a.csv", [change("I", 1, 1, "00:10:00")])
    workspace.land("t", "2024-01-01T01", "a.csv", [change("U", 1, 2, "01:10:00")])
    workspace.land("t", "2024-01-01T02", "a.csv", [change("I", 2, 1, "02:10:00")])
    run(workspace, "02:00", "03:00")  # the newest first: it lists the older hours too
    run(workspace, "00:00", "01:00")
    run(workspace, "01:00", "02:00")
    assert final(workspace) == [(1, 2), (2, 1)]


def test_a_file_written_during_a_run_is_applied_by_the_next_run(
    workspace: Workspace, tmp_path: Path
) -> None:
    workspace.configure(TABLE)
    path = workspace.land("t", "2024-01-01T00", "a.csv", [change("I", 1, 1, "00:10:00")])
    barrier = tmp_path / "barrier"
    process = start(
        workspace,
        "run",
        "t",
        *window("00:00", "01:00"),
        CDC_BARRIER=f"stage:before_first_write|{barrier}|2",
    )
    try:
        deadline = time.monotonic() + 120
        while not (barrier.exists() and any(barrier.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.05)
        # The capture job is still writing the file the run has listed and hashed.
        with path.open("a") as handle:
            handle.write("I,2,1,2024-01-01 00:20:00\n")
        (barrier / "writer").touch()
        out, err = process.communicate(timeout=300)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)  # its own process group only
        raise
    assert process.returncode == 0, err
    assert summary((out, err))["files_deferred"] == "1"
    assert final(workspace) == []
    result = run(workspace, "01:00", "02:00")
    assert result["files_applied"] == "1"
    assert final(workspace) == [(1, 1), (2, 1)]


def test_status_tells_freshness_by_the_data_not_by_the_runs(workspace: Workspace) -> None:
    workspace.configure({**TABLE, "late_arrival_window": "3h"})
    workspace.land("t", "2024-01-01T00", "a.csv", [change("I", 1, 1, "00:10:00")])
    run(workspace, "00:00", "01:00")
    late = workspace.land("t", "2024-01-01T00", "late.csv", [change("I", 2, 1, "00:50:00")])
    os.utime(late, (1704074400, 1704074400))  # landed 2024-01-01T02:00:00Z
    result = cdc(workspace, "status", "t", "--at", "2024-01-01T02:30:00Z")
    assert result.returncode == 0, result.stderr
    values = summary(result)
    assert values["newest_change"] == "2024-01-01T00:10:00Z"
    assert (values["files_waiting"], values["files_applied"]) == ("1", "1")
    # Landed at 02:00 in hour 00's folder: its changes may be from 00:00, 2.5 h before --at.
    assert values["oldest_waiting"] == "2024-01-01T02:00:00Z"
    assert (values["oldest_change_waiting"], values["waiting_hours"]) == (
        "2024-01-01T00:00:00Z",
        "2.5",
    )
    assert values["files_outside_window"] == "0"
    # Three hours on, the late file's folder is outside the window: still shown, not hidden.
    later = summary(cdc(workspace, "status", "t", "--at", "2024-01-01T05:30:00Z"))
    assert (later["files_waiting"], later["files_outside_window"]) == ("0", "1")
    run(workspace, "00:00", "03:00")
    done = summary(cdc(workspace, "status", "t", "--at", "2024-01-01T02:30:00Z"))
    assert (done["newest_change"], done["files_waiting"], done["oldest_waiting"]) == (
        "2024-01-01T00:50:00Z",
        "0",
        "-",
    )
