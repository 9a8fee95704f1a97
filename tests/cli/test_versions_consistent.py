"""Every committed version of every table is consistent under overlapping real `cdc` processes.

Two tables (one partitioned with history, one unpartitioned) get four hours of changes (moves,
key-only deletes, late older changes). Real `cdc` processes run them overlapping: intervals in
reverse order, reruns, `optimize`, `reset-staging` and `vacuum` at the same time. Then every
version of final, history, staging and tombstones is opened by time travel and checked: final
and history's current rows hold each key once, and every row of every table is the row image
of a change that was landed (nothing invented, nothing half-written). The last versions must
equal the latest-change rule applied to everything landed (computed here in plain Python), and
`cdc check` must say ok.
"""

from __future__ import annotations

import os
import random
import signal
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.cli.cdc import cdc, start, summary
from tests.helpers import Workspace, table_rows

# About 3 minutes on 2 idle cores; the timeout leaves room for a machine shared with other jobs.
pytestmark = [pytest.mark.cli, pytest.mark.slow, pytest.mark.timeout(2400)]

COLUMNS = {"ID": "bigint", "D": "string", "VALUE": "int", "TS": "timestamp"}
TABLES: dict[str, dict[str, Any]] = {
    "a": {
        "name": "a",
        "file_format": "csv",
        "columns": COLUMNS,
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "partition_expression": "year(to_date(D, 'MM/dd/yyyy'))",
        "partition_column": "Y",
        "history": True,
    },
    "b": {
        "name": "b",
        "file_format": "csv",
        "columns": COLUMNS,
        "keys": ["ID"],
        "sequence_by": ["TS"],
    },
}
HOURS = 4
KEYS = 24

Change = tuple[
    str, int, int | None, int | None, datetime, int, int
]  # flag, id, year, value, ts, hour, row


def land(workspace: Workspace, table: str, seed: int) -> list[Change]:
    """Four hours of changes; returns them with their arrival (hour, row)."""
    rng = random.Random(seed)
    changes: list[Change] = []
    for hour in range(HOURS):
        rows = []
        for position in range(12):
            key = rng.randrange(1, KEYS + 1)
            # A quarter of the changes are late: their sequence lies in an earlier hour.
            seq_hour = rng.randrange(0, hour + 1) if rng.random() < 0.25 else hour
            when = datetime(2024, 1, 1, seq_hour, rng.randrange(60), rng.randrange(60), tzinfo=UTC)
            if rng.random() < 0.2:
                flag, year, value = "D", None, None
            else:
                flag, year, value = (
                    rng.choice("IU"),
                    rng.choice((2020, 2021, 2022)),
                    rng.randrange(1000),
                )
            rows.append(
                {
                    "FLAG": flag,
                    "ID": key,
                    "D": f"06/01/{year}" if year else None,
                    "VALUE": value,
                    "TS": when.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
            changes.append((flag, key, year, value, when, hour, position))
        workspace.land(table, f"2024-01-01T{hour:02d}", "c.csv", rows)
    return changes


def expected_final(changes: list[Change]) -> list[tuple[Any, ...]]:
    """The latest-change rule in plain Python: latest TS, then later hour, then later row."""
    latest: dict[int, Change] = {}
    for change in changes:
        key = change[1]
        if key not in latest or (change[4], change[5], change[6]) > (
            latest[key][4],
            latest[key][5],
            latest[key][6],
        ):
            latest[key] = change
    return sorted(((c[1], c[3], c[2]) for c in latest.values() if c[0] != "D"), key=repr)


def interval(start: int, end: int | None = None) -> list[str]:
    """--start/--end of the hours [start, end) (one hour by default)."""
    stop = start + 1 if end is None else end
    return ["--start", f"2024-01-01T{start:02d}:00:00Z", "--end", f"2024-01-01T{stop:02d}:00:00Z"]


def together(workspace: Workspace, *commands: list[str]) -> None:
    """Start the commands at once and wait for all; each must succeed."""
    processes = [start(workspace, *command) for command in commands]
    try:
        for command, process in zip(commands, processes, strict=True):
            out, err = process.communicate(timeout=900)
            assert process.returncode == 0, (command, out, err[-2000:])
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # its own process group only


def versions(path: Path) -> range:
    return range(DeltaTable(str(path)).version() + 1)


def rows_of(path: Path, version: int) -> list[dict[str, Any]]:
    return DeltaTable(str(path), version=version).to_pyarrow_table().to_pylist()


def check_every_version(workspace: Workspace, name: str, changes: list[Change]) -> dict[str, int]:
    """Open every version of the table's Delta tables; return how many were checked per table."""
    images = {(c[1], c[3], c[4]) for c in changes if c[0] != "D"}  # (ID, VALUE, TS) landed
    deletes = {(c[1], c[4]) for c in changes if c[0] == "D"}
    years = {(c[1], c[3], c[4]): c[2] for c in changes if c[0] != "D"}
    paths = workspace.paths(name)
    checked: dict[str, int] = {}
    for table in ("final", "history", "staging", "tombstones"):
        path = getattr(paths, table)
        if not path.exists():
            continue
        for version in versions(path):
            rows = rows_of(path, version)
            where = f"{name}/{table}@{version}"
            for row in rows:
                if table == "tombstones" or row.get("_cdc_flag") == "D":
                    assert (row["ID"], row["TS"]) in deletes, (where, row)
                else:
                    image = (row["ID"], row["VALUE"], row["TS"])
                    assert image in images, (where, row)  # a row no change carried
                    if "Y" in row:
                        assert row["Y"] == years[image], (where, row)
            if table in ("final", "history"):
                live = [r["ID"] for r in rows if table == "final" or r["_cdc_is_current"]]
                twice = [k for k, n in Counter(live).items() if n > 1]
                assert not twice, (where, "keys twice", twice)
        checked[table] = len(versions(path))
    return checked


def test_every_committed_version_is_consistent(workspace: Workspace) -> None:
    workspace.configure(*TABLES.values())
    landed = {name: land(workspace, name, seed) for seed, name in enumerate(TABLES)}
    # Every hour has landed: a run applies its own hour and every earlier one not applied yet
    # (its late-arrival window), so b's hours are run in order to give it one version each.
    # Round 1: hours out of order and at the same time.
    together(
        workspace,
        ["run", "a", *interval(1)],
        ["run", "a", *interval(0)],
        ["run", "b", *interval(0)],
    )
    # Round 2: the rest in reverse order, with an optimize racing the runs.
    together(
        workspace,
        ["run", "a", *interval(3)],
        ["run", "a", *interval(2)],
        ["optimize", "a"],
        ["run", "b", *interval(1)],
    )
    # Round 3: a rerun of applied hours with staging resets and a vacuum (the default retention:
    # a shorter one would delete files of the older versions checked below); b's last two
    # hours race its staging reset.
    together(
        workspace,
        ["run", "a", *interval(0, 2)],
        ["reset-staging", "a"],
        ["vacuum", "a"],
        ["reset-staging", "b"],
        ["run", "b", *interval(2, 4)],
    )
    totals: dict[str, int] = {}
    for name, changes in landed.items():
        assert table_rows(
            workspace.paths(name).final, ["ID", "VALUE", "Y"] if name == "a" else ["ID", "VALUE"]
        ) == [row if name == "a" else row[:2] for row in expected_final(changes)]
        checked = check_every_version(workspace, name, changes)
        for table, count in checked.items():
            totals[f"{name}/{table}"] = count
    commits = sum(totals.values())
    print(f"versions checked: {commits} ({', '.join(f'{k}={v}' for k, v in totals.items())})")
    result = cdc(workspace, "check", timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(result.stdout.splitlines())
    assert [line.split(":")[0] for line in lines] == ["check a", "check b"]
    assert all(": ok keys=" in line for line in lines), lines
    print("\n".join(lines))
    # a's concurrent runs share their hours' changes (how they split them varies): at least
    # its creation and one commit per round with new hours.
    assert totals["a/final"] >= 3 and totals["a/history"] >= 3 and totals["b/final"] >= 4


def test_check_exits_1_on_a_breach_and_2_on_a_bad_table(workspace: Workspace) -> None:
    workspace.configure(TABLES["b"])
    land(workspace, "b", 7)
    assert cdc(workspace, "run", "b", *interval(0), timeout=900).returncode == 0
    final = workspace.paths("b").final
    Path(sorted(DeltaTable(str(final)).file_uris())[0]).unlink()
    result = cdc(workspace, "check", "b", timeout=900)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("check b: BREACH missing data files in final: 1 file, e.g. ")
    bad = cdc(workspace, "check", "nope")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: check: table nope: not in the config table (valid tables: b)"
    )


def test_run_on_a_snapshot_table_counts_the_extract_and_a_rerun_commits_nothing(
    workspace: Workspace,
) -> None:
    workspace.configure(
        {
            "name": "s",
            "change_format": "snapshot",
            "file_format": "csv",
            "columns": {"ID": "bigint", "VALUE": "string"},
            "keys": ["ID"],
        }
    )
    workspace.land(
        "s", "2024-01-01T00", "x.csv", [{"ID": 1, "VALUE": "a"}, {"ID": 2, "VALUE": "b"}]
    )
    workspace.land(
        "s", "2024-01-01T01", "x.csv", [{"ID": 1, "VALUE": "a"}, {"ID": 3, "VALUE": "c"}]
    )
    assert cdc(workspace, "run", "s", *interval(0), timeout=900).returncode == 0
    second = summary(cdc(workspace, "run", "s", *interval(1), timeout=900))
    assert {k: second[k] for k in ("inserted", "updated", "deleted", "unchanged")} == {
        "inserted": "1",
        "updated": "0",
        "deleted": "1",
        "unchanged": "1",
    }
    version = DeltaTable(str(workspace.paths("s").final)).version()
    assert second["final_version"] == str(version)
    rerun = summary(cdc(workspace, "run", "s", *interval(1), timeout=900))
    assert (rerun["new_files"], rerun["rows_written"], rerun["final_version"]) == (
        "0",
        "0",
        str(version),
    )
    assert DeltaTable(str(workspace.paths("s").final)).version() == version
