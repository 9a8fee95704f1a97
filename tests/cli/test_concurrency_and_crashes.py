"""Overlapping runs of one table and runs killed mid-way end with the exact expected table."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdc_pipeline.paths import Location
from tests.cli.cdc import cdc, start, summary
from tests.helpers import Workspace, file_paths, files_under, table_rows

pytestmark = [pytest.mark.cli, pytest.mark.slow]

YEARLY = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "D": "string", "VALUE": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "partition_expression": "year(to_date(D, 'MM/dd/yyyy'))",
    "partition_column": "Y",
}


def change(flag: str, id_: int, year: int | None, value: int | None, ts: str) -> dict:
    return {
        "FLAG": flag,
        "ID": id_,
        "D": f"06/01/{year}" if year else None,
        "VALUE": value,
        "TS": ts,
    }


def hour(h: int) -> list[str]:
    return ["--start", f"2024-01-01T{h:02d}:00:00Z", "--end", f"2024-01-01T{h + 1:02d}:00:00Z"]


def finish(process) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    try:
        out, err = process.communicate(timeout=300)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)  # its own process group only
        raise
    assert process.returncode == 0, err
    return out, err


def land_two_overlapping_hours(workspace: Workspace) -> None:
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            change("I", 1, 2020, 1, "2024-01-01 00:00:00"),
            change("I", 2, 2021, 1, "2024-01-01 00:00:00"),
            change("I", 3, 2022, 1, "2024-01-01 00:00:00"),
        ],
    )
    workspace.land(
        "t",
        "2024-01-01T01",
        "a.csv",
        [
            change("U", 1, 2020, 2, "2024-01-01 01:00:00"),
            change("U", 2, 2023, 2, "2024-01-01 01:00:00"),  # moves to 2023
            change("D", 3, None, None, "2024-01-01 01:00:00"),  # key-only delete
            change("I", 4, 2020, 2, "2024-01-01 01:00:00"),
        ],
    )


EXPECTED = [(1, 2, 2020), (2, 2, 2023), (4, 2, 2020)]


def test_two_runs_at_once_committing_from_the_same_snapshot(
    any_workspace: Workspace, tmp_path: Path
) -> None:
    workspace = any_workspace
    workspace.configure(YEARLY)
    land_two_overlapping_hours(workspace)
    # Both runs compute from the same (empty) final table and commit new partitions, a pair of
    # commits delta-rs does not see as conflicting: the later one must notice and recompute.
    barrier = f"overwrite_final:before_commit|{tmp_path / 'barrier1'}|2"
    first = start(workspace, "run", "t", *hour(0), CDC_BARRIER=barrier)
    second = start(workspace, "run", "t", *hour(1), CDC_BARRIER=barrier)
    results = [summary(finish(first)), summary(finish(second))]
    assert sorted(int(r["attempts"]) for r in results) == [1, 2]
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE", "Y"]) == EXPECTED

    # Now two runs rewriting the same existing partition: delta-rs reports the conflict.
    workspace.land("t", "2024-01-01T02", "a.csv", [change("U", 1, 2020, 3, "2024-01-01 02:00:00")])
    workspace.land(
        "t",
        "2024-01-01T03",
        "a.csv",
        [
            change("U", 4, 2020, 3, "2024-01-01 03:00:00"),
            change("U", 1, 2020, 9, "2024-01-01 01:30:00"),
        ],
    )  # late, older
    barrier = f"overwrite_final:before_commit|{tmp_path / 'barrier2'}|2"
    first = start(workspace, "run", "t", *hour(2), CDC_BARRIER=barrier)
    second = start(workspace, "run", "t", *hour(3), CDC_BARRIER=barrier)
    results = [summary(finish(first)), summary(finish(second))]
    assert sorted(int(r["attempts"]) for r in results) == [1, 2]
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE", "Y"]) == [
        (1, 3, 2020),
        (2, 2, 2023),
        (4, 3, 2020),
    ]


def land_new_keys_in_two_hours(workspace: Workspace) -> None:
    """Hour 0 inserts keys 1 and 2, hour 1 keys 3 and 4 in the same two years: run one hour at
    a time, each year of final then holds two small files (new keys go to new files)."""
    for h, keys in ((0, (1, 2)), (1, (3, 4))):
        rows = [change("I", k, 2020 + k % 2, k, f"2024-01-01 0{h}:00:00") for k in keys]
        workspace.land("t", f"2024-01-01T0{h}", "a.csv", rows)


NEW_KEYS = [(1, 1, 2021), (2, 2, 2020), (3, 3, 2021), (4, 4, 2020)]


def keys_twice_in_some_version(final: Location) -> list[tuple[int, list[int]]]:
    """(version, keys) of every version of final holding a key more than once."""
    found = []
    for version in range(DeltaTable(str(final)).version() + 1):
        ids = DeltaTable(str(final), version=version).to_pyarrow_table()["ID"].to_pylist()
        twice = sorted(k for k, n in Counter(ids).items() if n > 1)
        if twice:
            found.append((version, twice))
    return found


def test_two_optimizes_at_once_compact_each_row_once(
    any_workspace: Workspace, tmp_path: Path
) -> None:
    """delta-rs commits two OPTIMIZEs made from the same version (each compacted copy stays):
    two `cdc optimize` of one table meeting before they start take turns on its lease."""
    workspace = any_workspace
    workspace.configure(YEARLY)
    land_new_keys_in_two_hours(workspace)
    for h in (0, 1):
        assert cdc(workspace, "run", "t", *hour(h)).returncode == 0
    final = workspace.paths("t").final
    assert len(file_paths(final)) == 4
    barrier = f"optimize:before_lease|{tmp_path / 'barrier'}|2"
    first = start(workspace, "optimize", "t", CDC_BARRIER=barrier)
    second = start(workspace, "optimize", "t", CDC_BARRIER=barrier)
    results = [summary(finish(p)) for p in (first, second)]
    files = sorted((r["final_files_before"], r["final_files_after"]) for r in results)
    assert files == [("2", "2"), ("4", "2")]  # the second found the years compacted
    assert table_rows(final, ["ID", "VALUE", "Y"]) == NEW_KEYS
    assert keys_twice_in_some_version(final) == []


def test_an_optimize_and_a_reset_staging_at_once_leave_staging_rows_once(
    any_workspace: Workspace, tmp_path: Path
) -> None:
    """delta-rs commits an overwrite (reset-staging's) made after an OPTIMIZE of the files it
    read (optimize's of staging), which keeps the compacted old changes beside the reset's
    rows: the two steps take turns on the table's lease."""
    workspace = any_workspace
    workspace.configure(YEARLY)
    # Two files staged in one hour's batch (a late one): optimize has staging to compact.
    for name, rows in (
        (
            "a.csv",
            [
                change("I", 1, 2020, 1, "2024-01-01 00:00:00"),
                change("I", 2, 2021, 1, "2024-01-01 00:00:00"),
            ],
        ),
        (
            "b.csv",
            [
                change("U", 1, 2020, 2, "2024-01-01 00:30:00"),
                change("I", 3, 2022, 1, "2024-01-01 00:30:00"),
            ],
        ),
    ):
        workspace.land("t", "2024-01-01T00", name, rows)
        assert cdc(workspace, "run", "t", *hour(0)).returncode == 0
    paths = workspace.paths("t")
    assert len(file_paths(paths.staging)) >= 2
    barrier = tmp_path / "barrier"
    first = start(workspace, "optimize", "t", CDC_BARRIER=f"optimize:before_lease|{barrier}|2")
    second = start(
        workspace, "reset-staging", "t", CDC_BARRIER=f"reset_staging:before_lease|{barrier}|2"
    )
    finish(first)
    finish(second)
    final = table_rows(paths.final, ["ID", "VALUE", "Y"])
    assert final == [(1, 2, 2020), (2, 1, 2021), (3, 1, 2022)]
    # After the reset staging holds a copy of each final row, whichever step went first.
    assert table_rows(paths.staging, ["ID", "VALUE", "Y"]) == final
    assert table_rows(paths.final, ["ID", "VALUE", "Y"]) == final


def test_an_optimize_killed_holding_its_lease_does_not_hold_up_the_next(
    workspace: Workspace,
) -> None:
    """A holder of this machine that died leaves its claim: the next optimize takes it over at
    once instead of waiting for its end."""
    workspace.configure(YEARLY)
    land_new_keys_in_two_hours(workspace)
    for h in (0, 1):
        assert cdc(workspace, "run", "t", *hour(h)).returncode == 0
    killed = cdc(workspace, "optimize", "t", CDC_FAULT="optimize:holding_lease")
    assert killed.returncode == -signal.SIGKILL
    again = cdc(workspace, "optimize", "t", timeout=300)
    assert again.returncode == 0, again.stderr
    counts = summary(again)
    assert (counts["final_files_before"], counts["final_files_after"]) == ("4", "2")
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE", "Y"]) == NEW_KEYS


def data_files_on_disk(table: Location) -> set[str]:
    files = {f for f in files_under(table) if f.endswith(".parquet")}
    return {f for f in files if not f.startswith(("_delta_log/", "_cdc_tmp/"))}


# Kills at every point of a run, and three runs at once: tests/cli/test_faults.py.


def test_stage_killed_between_its_commits_loses_and_duplicates_nothing(
    workspace: Workspace,
) -> None:
    # On S3: tests/cli/test_faults.py kills a run there and reruns it.
    workspace.configure(YEARLY)
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            change("I", 1, 2020, 1, "2024-01-01 00:00:00"),
            change("I", 2, 2021, 1, "2024-01-01 00:00:00"),
            change("Z", 3, 2021, 1, "2024-01-01 00:00:00"),
        ],
    )
    paths = workspace.paths("t")
    killed = cdc(workspace, "stage", "t", *hour(0), CDC_FAULT="stage:before_quarantine_commit")
    assert killed.returncode == -signal.SIGKILL
    assert len(table_rows(paths.staging)) == 2  # staging committed, quarantine and ledger not
    done = cdc(workspace, "run", "t", *hour(0))
    assert done.returncode == 0, done.stderr
    assert len(table_rows(paths.staging)) == 2
    assert table_rows(paths.quarantine, ["ID", "FLAG"]) == [("3", "Z")]
    assert table_rows(paths.final, ["ID", "VALUE", "Y"]) == [(1, 1, 2020), (2, 1, 2021)]
