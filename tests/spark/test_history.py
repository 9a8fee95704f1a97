"""SCD type 2 history (seed 003): Elsa, Olaf and Anna, and every hard case the seed lists.

The expected histories are written out by hand from the seed's tables, never computed by the
code under test. After every step the current history rows must equal the final table.
"""

from __future__ import annotations

from typing import Any

import pytest
from deltalake import DeltaTable

from spark_jobs.as_of import as_of_frame
from spark_jobs.reset_staging import run_reset_staging
from tests.helpers import Workspace, files_by_partition, table_rows
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark

VERSION = ["id", "value", "_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]
# Seed 003: inserts of Elsa and Olaf at 1, Elsa renamed Anna at 2, Olaf deleted at 3.
EVENTS_1 = [
    {"TIME": 1, "FLAG": "I", "id": 1, "value": "Elsa"},
    {"TIME": 1, "FLAG": "I", "id": 2, "value": "Olaf"},
]
EVENTS_2 = [{"TIME": 2, "FLAG": "U", "id": 1, "value": "Anna"}]
EVENTS_3 = [{"TIME": 3, "FLAG": "D", "id": 2, "value": None}]
# The seed's expected history table.
EXPECTED = sorted(
    [
        (1, "Elsa", 1, 2, False, False),
        (1, "Anna", 2, None, True, False),
        (2, "Olaf", 1, 3, False, True),
    ],
    key=repr,
)


def fresh_workspace(workspace: Workspace, name: str) -> Workspace:
    """A second, independent workspace inside a test's own folder."""
    other = Workspace(workspace.root / name)
    other.root.mkdir()
    return other


def people(workspace: Workspace, **extra: Any):  # type: ignore[no-untyped-def]
    row = {
        "name": "people",
        "file_format": "csv",
        "columns": {"id": "bigint", "value": "string", "TIME": "int"},
        "keys": ["id"],
        "sequence_by": ["TIME"],
        "history": True,
        **extra,
    }
    return workspace.configure(row)["people"]


def versions(workspace: Workspace) -> dict[str, int]:
    """The Delta version of each table of `people` a run commits to."""
    paths = workspace.paths("people")
    names = ("final", "tombstones", "history_log", "history")
    return {n: DeltaTable(str(getattr(paths, n))).version() for n in names}


def history_rows(workspace: Workspace, columns: list[str] = VERSION) -> list[tuple]:
    return table_rows(workspace.paths("people").history, columns)


def assert_current_equals_final(workspace: Workspace, columns: list[str]) -> None:
    paths = workspace.paths("people")
    current = [r[:-1] for r in table_rows(paths.history, [*columns, "_cdc_is_current"]) if r[-1]]
    assert current == table_rows(paths.final, columns)


def apply_hours(spark, workspace: Workspace, table, hours: list[str]) -> None:  # type: ignore[no-untyped-def]
    for hour in hours:
        end = f"{hour[:11]}{int(hour[11:]) + 1:02d}"
        run(spark, workspace, table, hour, end)
        assert_current_equals_final(workspace, ["id", "value", "TIME"])


def test_seed_003_three_batches(spark, workspace: Workspace) -> None:
    table = people(workspace)
    for hour, events in zip(
        ("2024-01-01T00", "2024-01-01T01", "2024-01-01T02"),
        (EVENTS_1, EVENTS_2, EVENTS_3),
        strict=True,
    ):
        workspace.land("people", hour, "events.csv", events)
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01", "2024-01-01T02"])
    assert history_rows(workspace) == EXPECTED
    # A rerun of every interval changes nothing and commits nothing, history included.
    before = versions(workspace)
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01", "2024-01-01T02"])
    assert history_rows(workspace) == EXPECTED
    assert versions(workspace) == before
    # The table as of each point of the sequence (the seed's query).
    ctx = context(spark, workspace, table)
    as_of = {
        at: sorted((r["id"], r["value"]) for r in as_of_frame(ctx, at).collect())
        for at in ("0", "1", "2", "3")
    }
    assert as_of == {
        "0": [],
        "1": [(1, "Elsa"), (2, "Olaf")],
        "2": [(1, "Anna"), (2, "Olaf")],
        "3": [(1, "Anna")],
    }


def test_seed_003_duplicated_events(spark, workspace: Workspace) -> None:
    """events1.union(events1) in one batch, and the whole set re-sent an hour later."""
    table = people(workspace)
    workspace.land("people", "2024-01-01T00", "events.csv", EVENTS_1 + EVENTS_1)
    workspace.land("people", "2024-01-01T01", "events.csv", EVENTS_2 + EVENTS_1)
    workspace.land("people", "2024-01-01T02", "events.csv", EVENTS_3 + EVENTS_2)
    workspace.land("people", "2024-01-01T03", "resent.csv", EVENTS_1 + EVENTS_2 + EVENTS_3)
    apply_hours(
        spark,
        workspace,
        table,
        ["2024-01-01T00", "2024-01-01T01", "2024-01-01T02", "2024-01-01T03"],
    )
    assert history_rows(workspace) == EXPECTED


def test_seed_003_several_changes_of_a_key_in_one_batch(spark, workspace: Workspace) -> None:
    """events1.union(events2): Elsa and Anna in the same batch each become a version."""
    table = people(workspace)
    workspace.land("people", "2024-01-01T00", "events.csv", EVENTS_2 + EVENTS_1)
    workspace.land("people", "2024-01-01T01", "events.csv", EVENTS_3)
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01"])
    assert history_rows(workspace) == EXPECTED
    # All three batches in one file, in reverse order.
    other = fresh_workspace(workspace, "one-batch")
    table = people(other)
    other.land("people", "2024-01-01T00", "events.csv", EVENTS_3 + EVENTS_2 + EVENTS_1)
    run(spark, other, table, "2024-01-01T00", "2024-01-01T01")
    assert history_rows(other) == EXPECTED


def test_seed_003_unordered_batches(spark, workspace: Workspace) -> None:
    """The delete lands first and the inserts last; intervals also run newest first."""
    table = people(workspace)
    workspace.land("people", "2024-01-01T00", "events.csv", EVENTS_3)
    workspace.land("people", "2024-01-01T01", "events.csv", EVENTS_2)
    workspace.land("people", "2024-01-01T02", "events.csv", EVENTS_1)
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01", "2024-01-01T02"])
    assert history_rows(workspace) == EXPECTED

    other = fresh_workspace(workspace, "reversed")
    table = people(other)
    for hour, events in zip(
        ("2024-01-01T00", "2024-01-01T01", "2024-01-01T02"),
        (EVENTS_1, EVENTS_2, EVENTS_3),
        strict=True,
    ):
        other.land("people", hour, "events.csv", events)
    hours = ["2024-01-01T00", "2024-01-01T01", "2024-01-01T02"]
    for hour in reversed(hours):
        run(spark, other, table, hour, f"{hour[:11]}{int(hour[11:]) + 1:02d}")
        assert_current_equals_final(other, ["id", "value", "TIME"])
    assert history_rows(other) == EXPECTED
    # Reruns of both workspaces, oldest first and newest first: no table gets a new version.
    for ws in (workspace, other):
        before = versions(ws)
        for order in (hours, hours[::-1]):
            for hour in order:
                _, applied = run(spark, ws, table, hour, f"{hour[:11]}{int(hour[11:]) + 1:02d}")
                assert applied.counts["history_changes_logged"] == 0
                assert applied.counts["history_buckets_rewritten"] == 0
                assert applied.counts["history_version"] == before["history"]
        assert versions(ws) == before
        assert history_rows(ws) == EXPECTED
        assert_current_equals_final(ws, ["id", "value", "TIME"])


def test_late_event_is_spliced_and_only_its_bucket_rewritten(spark, workspace: Workspace) -> None:
    table = people(workspace, history_buckets=8)
    paths = workspace.paths("people")
    first = [{"TIME": 10, "FLAG": "I", "id": i, "value": f"v{i}"} for i in range(1, 41)]
    workspace.land("people", "2024-01-01T00", "events.csv", first)
    workspace.land(
        "people",
        "2024-01-01T01",
        "events.csv",
        [
            {"TIME": 30, "FLAG": "U", "id": 7, "value": "seven-30"},
            {"TIME": 40, "FLAG": "D", "id": 7, "value": None},
            {"TIME": 50, "FLAG": "I", "id": 7, "value": "seven-50"},
        ],
    )
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01"])
    before = files_by_partition(paths.history, "_cdc_key_bucket")
    assert len(before) == 8
    # Late: an update at 20 (between 10 and 30) and one at 45 (after the delete at 40).
    workspace.land(
        "people",
        "2024-01-01T02",
        "late.csv",
        [
            {"TIME": 20, "FLAG": "U", "id": 7, "value": "seven-20"},
            {"TIME": 45, "FLAG": "U", "id": 7, "value": "seven-45"},
        ],
    )
    _, applied = run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert applied.counts["history_buckets_rewritten"] == 1
    after = files_by_partition(paths.history, "_cdc_key_bucket")
    changed = {b for b in before if before[b] != after.get(b)}
    assert len(changed) == 1
    bucket = next(iter(changed))
    seven = [r for r in history_rows(workspace) if r[0] == 7]
    assert seven == sorted(
        [
            (7, "v7", 10, 20, False, False),
            (7, "seven-20", 20, 30, False, False),
            (7, "seven-30", 30, 40, False, True),
            (7, "seven-45", 45, 50, False, False),
            (7, "seven-50", 50, None, True, False),
        ],
        key=repr,
    )
    bucket_ids = {
        r["id"]
        for r in DeltaTable(str(paths.history)).to_pyarrow_table().to_pylist()
        if r["_cdc_key_bucket"] == bucket
    }
    assert 7 in bucket_ids
    assert_current_equals_final(workspace, ["id", "value", "TIME"])
    # Everyone else still has the one version of the first batch.
    others = [r for r in history_rows(workspace) if r[0] != 7]
    assert others == sorted(
        [(i, f"v{i}", 10, None, True, False) for i in range(1, 41) if i != 7], key=repr
    )


def test_track_history_columns_update_in_place(spark, workspace: Workspace) -> None:
    columns = {"id": "bigint", "value": "string", "note": "string", "TIME": "int"}
    table = people(workspace, columns=columns, track_history_columns=["value"])
    rows = [
        {"TIME": 10, "FLAG": "I", "id": 1, "value": "A", "note": "n1"},
        {"TIME": 20, "FLAG": "U", "id": 1, "value": "A", "note": "n2"},  # untracked: in place
        {"TIME": 30, "FLAG": "U", "id": 1, "value": "B", "note": "n2"},  # tracked: new version
        {"TIME": 40, "FLAG": "U", "id": 1, "value": "B", "note": "n3"},  # in place, current
    ]
    workspace.land("people", "2024-01-01T00", "events.csv", rows[:2])
    workspace.land("people", "2024-01-01T01", "events.csv", rows[2:])
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01"])
    wanted = ["id", "value", "note", "TIME", *VERSION[2:]]
    assert history_rows(workspace, wanted) == [
        (1, "A", "n2", 20, 10, 30, False, False),
        (1, "B", "n3", 40, 30, None, True, False),
    ]
    # A late untracked change inside the first version, older than its last change: superseded.
    workspace.land(
        "people",
        "2024-01-01T02",
        "late.csv",
        [
            {"TIME": 15, "FLAG": "U", "id": 1, "value": "A", "note": "late"},
            {"TIME": 25, "FLAG": "U", "id": 1, "value": "A", "note": "n2b"},
        ],
    )
    apply_hours(spark, workspace, table, ["2024-01-01T02"])
    assert history_rows(workspace, wanted) == [
        (1, "A", "n2b", 25, 10, 30, False, False),
        (1, "B", "n3", 40, 30, None, True, False),
    ]
    assert_current_equals_final(workspace, ["id", "value", "note", "TIME"])


def test_history_switched_on_later_and_kept_through_reset_staging(
    spark, workspace: Workspace
) -> None:
    table = people(workspace, history=False)
    workspace.land("people", "2024-01-01T00", "events.csv", EVENTS_1)
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    table = people(workspace)  # history: true from now on
    workspace.land("people", "2024-01-01T01", "events.csv", EVENTS_2)
    workspace.land("people", "2024-01-01T02", "events.csv", EVENTS_3)
    # Hour 02 is staged but not applied when staging is reset: its delete must reach history.
    apply_hours(spark, workspace, table, ["2024-01-01T01"])
    from spark_jobs.stage import run_stage
    from tests.helpers import interval

    ctx = context(spark, workspace, table)
    run_stage(ctx, interval("2024-01-01T02", "2024-01-01T03"))
    reset = run_reset_staging(ctx)
    assert reset.counts["history_changes_logged"] == 1
    apply_hours(spark, workspace, table, ["2024-01-01T02"])
    assert history_rows(workspace) == EXPECTED


def test_a_rerun_after_a_crash_between_log_and_recut_recuts_history(
    spark, workspace: Workspace
) -> None:
    """A run that logged its changes but died before recutting: its rerun logs nothing new,
    yet history lacks the changes, so the rerun recuts (one new history version)."""
    from cdc_pipeline.counts import OverwriteCounts
    from spark_jobs import delta
    from spark_jobs.overwrite import history
    from spark_jobs.overwrite_final import apply_changes
    from spark_jobs.runtime.report import StepReport
    from spark_jobs.stage import run_stage
    from tests.helpers import interval

    table = people(workspace)
    for hour, events in zip(
        ("2024-01-01T00", "2024-01-01T01", "2024-01-01T02"),
        (EVENTS_1, EVENTS_2, EVENTS_3),
        strict=True,
    ):
        workspace.land("people", hour, "events.csv", events)
    apply_hours(spark, workspace, table, ["2024-01-01T00", "2024-01-01T01"])
    before = versions(workspace)
    # Hour 02 as far as the crashed run got: final applied, the delete logged, no recut.
    ctx = context(spark, workspace, table)
    window = interval("2024-01-01T02", "2024-01-01T03")
    run_stage(ctx, window)
    staging = delta.load_snapshot(workspace.paths("people").staging)
    changes = delta.read_snapshot(spark, staging, partitions=window.batch_ids())
    report = StepReport("overwrite-final", "people", "", OverwriteCounts(changes=1))
    apply_changes(ctx, changes, report)
    logged, _ = history.append_to_log(
        ctx, changes.withColumn(history.BUCKET, history.key_bucket(table)), None
    )
    assert logged == 1
    assert versions(workspace)["history"] == before["history"]
    assert (2, "Olaf", 1, None, True, False) in history_rows(workspace)

    _, applied = run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert applied.counts["history_changes_logged"] == 0
    assert applied.counts["history_buckets_rewritten"] == 1
    assert history_rows(workspace) == EXPECTED
    assert_current_equals_final(workspace, ["id", "value", "TIME"])
    after = versions(workspace)
    assert after["history"] == before["history"] + 1
    assert after["history_log"] == before["history_log"] + 1
    # And a rerun of that rerun commits nothing.
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert versions(workspace) == after
    assert history_rows(workspace) == EXPECTED
