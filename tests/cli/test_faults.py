"""Fault tests: runs killed with SIGKILL at each point of a run and rerun, and three runs at once.

Each ends with the exact expected table, no duplicated staged change, and no orphan file
surviving a vacuum.
"""

from __future__ import annotations

import shutil
import signal
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote

import pytest

from cdc_pipeline.paths import Location
from spark_jobs.rules.transforms import FLAG
from tests.cli.cdc import cdc, start, summary
from tests.cli.test_concurrency_and_crashes import (
    EXPECTED,
    YEARLY,
    change,
    data_files_on_disk,
    finish,
    hour,
    land_two_overlapping_hours,
)
from tests.helpers import Workspace, exists, file_paths, files_under, table_rows, ts

pytestmark = [pytest.mark.cli, pytest.mark.slow, pytest.mark.connect_only]

FINAL = ["ID", "VALUE", "Y"]
STAGED = ["ID", FLAG, "VALUE", "TS"]
TABLES = ("final", "staging", "quarantine", "tombstones", "ledger")


def t(text: str) -> datetime:
    """'2024-01-01 01:30' as deltalake returns it (UTC)."""
    return ts(text.replace(" ", "T") + ":00Z")


# What land_two_overlapping_hours lands, as (ID, flag, VALUE, TS) staged rows.
HOUR_0 = [
    (1, "I", 1, t("2024-01-01 00:00")),
    (2, "I", 1, t("2024-01-01 00:00")),
    (3, "I", 1, t("2024-01-01 00:00")),
]
HOUR_1 = [
    (1, "U", 2, t("2024-01-01 01:00")),
    (2, "U", 2, t("2024-01-01 01:00")),
    (3, "D", None, t("2024-01-01 01:00")),
    (4, "I", 2, t("2024-01-01 01:00")),
]
AFTER_HOUR_0 = [(1, 1, 2020), (2, 1, 2021), (3, 1, 2022)]
TOMBSTONE_OF_3 = [(3, t("2024-01-01 01:00"))]


def staged(workspace: Workspace) -> list[tuple]:
    return table_rows(workspace.paths("t").staging, STAGED)


def tombstones(workspace: Workspace) -> list[tuple]:
    path = workspace.paths("t").tombstones
    return table_rows(path, ["ID", "TS"]) if exists(path / "_delta_log") else []


def ledger_files(workspace: Workspace) -> list[tuple]:
    return table_rows(workspace.paths("t").ledger, ["batch", "file"])


def orphans(table: Location) -> set[str]:
    """Data files on disk that the table's current version does not reference."""
    return data_files_on_disk(table) - {unquote(p) for p in file_paths(table)}


def vacuum_leaves_no_orphan(workspace: Workspace) -> None:
    """`cdc vacuum --retention-hours 0 --force`, then every table holds exactly its version's files."""
    contents = {}
    for name in TABLES:
        path = getattr(workspace.paths("t"), name)
        if exists(path / "_delta_log"):
            contents[name] = table_rows(path)
    vacuum = cdc(workspace, "vacuum", "t", "--retention-hours", "0", "--force")
    assert vacuum.returncode == 0, vacuum.stderr
    assert {"final", "staging", "tombstones"} <= contents.keys()
    for name, rows in contents.items():
        path = getattr(workspace.paths("t"), name)
        referenced = {unquote(p) for p in file_paths(path)}
        assert data_files_on_disk(path) == referenced, name
        assert files_under(path / "_cdc_tmp") == set(), name
        assert table_rows(path) == rows, name  # the vacuum changed no data


@pytest.fixture(scope="module")
def after_hour_0(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """Two overlapping hours landed and hour 0 run: the state every kill test starts from."""
    base = Workspace(tmp_path_factory.mktemp("after-hour-0"))
    base.configure(YEARLY)
    land_two_overlapping_hours(base)
    done = cdc(base, "run", "t", *hour(0))
    assert done.returncode == 0, done.stderr
    assert table_rows(base.paths("t").final, FINAL) == AFTER_HOUR_0
    return base


# point -> (staged rows, final rows, tombstones, table holding uncommitted files) just after the kill
KILLS = {
    "stage:before_first_write": (HOUR_0, AFTER_HOUR_0, [], None),
    "stage:before_staging_commit": (HOUR_0, AFTER_HOUR_0, [], "staging"),
    "stage:before_ledger_commit": (HOUR_0 + HOUR_1, AFTER_HOUR_0, [], None),
    "overwrite_final:before_first_write": (HOUR_0 + HOUR_1, AFTER_HOUR_0, [], None),
    "overwrite_final:before_commit": (HOUR_0 + HOUR_1, AFTER_HOUR_0, TOMBSTONE_OF_3, "final"),
    "overwrite_final:after_commit": (HOUR_0 + HOUR_1, EXPECTED, TOMBSTONE_OF_3, None),
}


def kill_hour_1_then_rerun(workspace: Workspace, point: str) -> None:
    """Hour 1's run killed at `point` (hour 0 applied): what the kill leaves, then the rerun's
    exact tables, and a vacuum that leaves no orphan and changes no row."""
    paths = workspace.paths("t")
    final_files = file_paths(paths.final)
    staged_after_kill, final_after_kill, tombstones_after_kill, written_in = KILLS[point]

    killed = cdc(workspace, "run", "t", *hour(1), CDC_FAULT=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert table_rows(paths.final, FINAL) == sorted(final_after_kill, key=repr)
    if final_after_kill == AFTER_HOUR_0:
        assert file_paths(paths.final) == final_files  # not even a file swapped
    assert staged(workspace) == sorted(staged_after_kill, key=repr)
    assert tombstones(workspace) == tombstones_after_kill
    staged_hour_1 = point.startswith("overwrite_final:")  # the ledger commit was passed
    assert len(ledger_files(workspace)) == (2 if staged_hour_1 else 1)
    if written_in is not None:
        assert orphans(getattr(paths, written_in)), "the killed run had written files"

    rerun = cdc(workspace, "run", "t", *hour(1))
    assert rerun.returncode == 0, rerun.stderr
    assert table_rows(paths.final, FINAL) == EXPECTED
    assert staged(workspace) == sorted(HOUR_0 + HOUR_1, key=repr)  # nothing lost or staged twice
    assert tombstones(workspace) == TOMBSTONE_OF_3
    assert ledger_files(workspace) == [
        ("2024-01-01T00", "a.csv"),
        ("2024-01-01T01", "a.csv"),
    ]
    vacuum_leaves_no_orphan(workspace)
    assert table_rows(paths.final, FINAL) == EXPECTED


@pytest.mark.parametrize("point", list(KILLS))
def test_run_killed_at_a_point_then_rerun(
    point: str, after_hour_0: Workspace, workspace: Workspace
) -> None:
    shutil.copytree(after_hour_0.root, workspace.root, dirs_exist_ok=True)
    kill_hour_1_then_rerun(workspace, point)


# One of the two kill points that leave written, uncommitted files behind (stage's is the same
# adoption code; both were run on S3 when this was written): S3 tests cost ~2 min each here.
@pytest.mark.parametrize("point", ["overwrite_final:before_commit"])
def test_run_killed_on_object_storage_then_rerun(point: str, s3_workspace: Workspace) -> None:
    """The kills that leave written, uncommitted files behind, with the tables in S3 (no
    rename there: files are adopted by copy and delete)."""
    workspace = s3_workspace
    workspace.configure(YEARLY)
    land_two_overlapping_hours(workspace)
    done = cdc(workspace, "run", "t", *hour(0))
    assert done.returncode == 0, done.stderr
    kill_hour_1_then_rerun(workspace, point)


def land_third_hour(workspace: Workspace) -> None:
    """Hour 2: touches keys and partitions of hours 0 and 1, with two late changes that lose."""
    workspace.land(
        "t",
        "2024-01-01T02",
        "a.csv",
        [
            change("U", 2, 2023, 3, "2024-01-01 02:00:00"),  # after hour 1's move to 2023
            change("U", 1, 2021, 9, "2024-01-01 00:30:00"),  # late, older than hour 1's: loses
            change("I", 3, 2022, 7, "2024-01-01 00:30:00"),  # late, older than the delete: loses
            change("I", 5, 2022, 1, "2024-01-01 02:00:00"),  # where key 3 was
        ],
    )


# Latest change per key over the three hours, deletes removed: written out by hand.
EXPECTED_THREE_HOURS = [(1, 2, 2020), (2, 3, 2023), (4, 2, 2020), (5, 1, 2022)]
HOUR_2 = [
    (2, "U", 3, t("2024-01-01 02:00")),
    (1, "U", 9, t("2024-01-01 00:30")),
    (3, "I", 7, t("2024-01-01 00:30")),
    (5, "I", 1, t("2024-01-01 02:00")),
]
STAGED_THREE_HOURS = HOUR_0 + HOUR_1 + HOUR_2


def test_three_overlapping_runs_committing_from_the_same_snapshot(
    workspace: Workspace, tmp_path: Path
) -> None:
    # On S3: tests/cli/test_concurrency_and_crashes.py's two runs at once (the same commit race).
    workspace.configure(YEARLY)
    land_two_overlapping_hours(workspace)
    land_third_hour(workspace)
    barrier = f"overwrite_final:before_commit|{tmp_path / 'barrier'}|3"
    runs = [start(workspace, "run", "t", *hour(h), CDC_BARRIER=barrier) for h in (0, 1, 2)]
    results = [summary(finish(process)) for process in runs]
    attempts = sorted(int(r["attempts"]) for r in results)
    # One commit wins from the shared snapshot; the other two must notice and recompute.
    assert attempts[0] == 1 and attempts[1] >= 2, attempts
    assert table_rows(workspace.paths("t").final, FINAL) == EXPECTED_THREE_HOURS
    assert staged(workspace) == sorted(STAGED_THREE_HOURS, key=repr)
    assert tombstones(workspace) == TOMBSTONE_OF_3
    vacuum_leaves_no_orphan(workspace)
    assert table_rows(workspace.paths("t").final, FINAL) == EXPECTED_THREE_HOURS


def test_the_same_interval_three_times_at_once(workspace: Workspace) -> None:
    workspace.configure(YEARLY)
    land_two_overlapping_hours(workspace)
    land_third_hour(workspace)
    interval = ["--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T03:00:00Z"]
    runs = [start(workspace, "run", "t", *interval) for _ in range(3)]
    for process in runs:
        finish(process)
    assert table_rows(workspace.paths("t").final, FINAL) == EXPECTED_THREE_HOURS
    # Runs staging the same file at the very same time may each stage it (a documented limit:
    # identical rows, removed by reset-staging); none may be lost.
    assert set(staged(workspace)) == set(STAGED_THREE_HOURS)
    assert tombstones(workspace) == TOMBSTONE_OF_3
    vacuum_leaves_no_orphan(workspace)
    assert table_rows(workspace.paths("t").final, FINAL) == EXPECTED_THREE_HOURS
