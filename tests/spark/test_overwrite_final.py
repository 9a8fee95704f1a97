"""The latest-change rule applied by stage + overwrite-final, against exact expected tables."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from unittest import mock

import pytest

from spark_jobs.reset_staging import run_reset_staging
from tests.helpers import Workspace, files_by_partition, table_rows, ts
from tests.spark.steps import context, run
from tests.spark.test_stage import EVENTS, event

pytestmark = pytest.mark.spark

SEED = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "VALUE": "int", "CDC_TIMESTAMP": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["CDC_TIMESTAMP"],
}
YEARLY = {
    "name": "orders",
    "file_format": "csv",
    "columns": {
        "ORDER_ID": "bigint",
        "LINE_NO": "int",
        "CREATE_DATE": "string",
        "AMOUNT": "decimal(10,2)",
        "CDC_TIMESTAMP": "timestamp",
    },
    "keys": ["ORDER_ID", "LINE_NO"],
    "sequence_by": ["CDC_TIMESTAMP"],
    "partition_expression": "year(to_date(CREATE_DATE, 'MM/dd/yyyy'))",
    "partition_column": "CREATE_DATE_YEAR",
}


@pytest.fixture(params=["small", "large"])
def change_set_size(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """ "large": the path a change set above the driver and broadcast limits takes (both set to
    0), planned as such a run is: with adaptive execution (a run of fewer changes than the
    driver limit is planned as a small one, `SMALL_RUN_CHANGES`, which in Connect writes the
    shuffle's partitions as they come: a combination no real run has)."""
    if request.param == "large":
        from spark_jobs import overwrite_final

        monkeypatch.setattr(overwrite_final, "LOCAL_KEYS_MAX", 0)
        monkeypatch.setattr(overwrite_final, "BROADCAST_CHANGES_MAX", 0)
        monkeypatch.setattr(overwrite_final, "SMALL_RUN_CHANGES", 0)
    return str(request.param)


def row(flag: str, id_: int, value: int | None, when: str) -> dict:
    return {"FLAG": flag, "ID": id_, "VALUE": value, "CDC_TIMESTAMP": when}


def order(flag: str, oid: int, line: int, date: str | None, amount: str | None, when: str) -> dict:
    return {
        "FLAG": flag,
        "ORDER_ID": oid,
        "LINE_NO": line,
        "CREATE_DATE": date,
        "AMOUNT": amount,
        "CDC_TIMESTAMP": when,
    }


def test_seed_002_table_1_change_set(spark, workspace: Workspace) -> None:
    table = workspace.configure(SEED)["t"]
    # IDs 2 and 3 "were inserted at some point earlier".
    workspace.land(
        "t",
        "2018-01-01T15",
        "a.csv",
        [row("I", 2, 19, "2018-01-01 15:00:00"), row("I", 3, 30, "2018-01-01 15:00:00")],
    )
    workspace.land(
        "t",
        "2018-01-01T16",
        "c.csv",
        [
            row("I", 1, 10, "2018-01-01 16:02:00"),
            row("U", 1, 11, "2018-01-01 16:02:01"),
            row("D", 1, 11, "2018-01-01 16:02:03"),
            row("U", 2, 20, "2018-01-01 16:02:00"),
            row("D", 3, 30, "2018-01-01 16:02:00"),
        ],
    )
    stage, apply = run(spark, workspace, table, "2018-01-01T15", "2018-01-01T17")
    assert (stage.counts["staged"], stage.counts["quarantined"]) == (7, 0)
    assert apply.counts["tombstones_added"] == 2
    paths = workspace.paths("t")
    assert table_rows(paths.final) == [(2, 20, ts("2018-01-01T16:02:00Z"))]
    assert table_rows(paths.tombstones) == [
        (1, ts("2018-01-01T16:02:03Z")),
        (3, ts("2018-01-01T16:02:00Z")),
    ]
    assert len(table_rows(paths.staging)) == 7


def test_composite_keys_are_distinct_records(spark, workspace: Workspace) -> None:
    table = workspace.configure(YEARLY)["orders"]
    workspace.land(
        "orders",
        "2024-01-01T00",
        "a.csv",
        [
            order("I", 1, 1, "01/05/2023", "10.00", "2024-01-01 00:00:01"),
            order("I", 1, 2, "01/05/2023", "20.00", "2024-01-01 00:00:01"),
            order("I", 2, 1, "01/05/2023", "30.00", "2024-01-01 00:00:01"),
        ],
    )
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [
            order("U", 1, 2, "01/05/2023", "21.50", "2024-01-01 01:00:00"),
            order("D", 2, 1, None, None, "2024-01-01 01:00:00"),
        ],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T02")
    assert table_rows(
        workspace.paths("orders").final, ["ORDER_ID", "LINE_NO", "AMOUNT", "CREATE_DATE_YEAR"]
    ) == [
        (1, 1, Decimal("10.00"), 2023),
        (1, 2, Decimal("21.50"), 2023),
    ]


def seed_three_years(spark, workspace: Workspace):
    table = workspace.configure(YEARLY)["orders"]
    workspace.land(
        "orders",
        "2024-01-01T00",
        "a.csv",
        [
            order("I", 1, 1, "03/01/2015", "1.00", "2024-01-01 00:00:00"),
            order("I", 2, 1, "03/01/2016", "2.00", "2024-01-01 00:00:00"),
            order("I", 3, 1, "03/01/2016", "3.00", "2024-01-01 00:00:00"),
            order("I", 4, 1, "03/01/2017", "4.00", "2024-01-01 00:00:00"),
        ],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    return table


def test_only_touched_partitions_are_rewritten(
    spark, workspace: Workspace, change_set_size: str
) -> None:
    table = seed_three_years(spark, workspace)
    final = workspace.paths("orders").final
    before = files_by_partition(final, "CREATE_DATE_YEAR")
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [order("U", 2, 1, "03/01/2016", "2.50", "2024-01-01 01:00:00")],
    )
    _, apply = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    after = files_by_partition(final, "CREATE_DATE_YEAR")
    assert apply.counts["partitions_rewritten"] == 1
    assert after[2015] == before[2015] and after[2017] == before[2017]
    assert after[2016].isdisjoint(before[2016])
    assert table_rows(final, ["ORDER_ID", "AMOUNT", "CREATE_DATE_YEAR"]) == [
        (1, Decimal("1.00"), 2015),
        (2, Decimal("2.50"), 2016),
        (3, Decimal("3.00"), 2016),
        (4, Decimal("4.00"), 2017),
    ]


def test_a_run_replaces_only_the_files_holding_a_changed_key(
    spark, workspace: Workspace, change_set_size: str
) -> None:
    """In a touched partition, a new key adds a file and replaces none; an update replaces the
    file holding its key and keeps the partition's other files."""
    table = seed_three_years(spark, workspace)
    final = workspace.paths("orders").final
    seeded = files_by_partition(final, "CREATE_DATE_YEAR")
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [order("I", 5, 1, "05/01/2016", "5.00", "2024-01-01 01:00:00")],
    )
    _, inserted = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    after_insert = files_by_partition(final, "CREATE_DATE_YEAR")
    assert (inserted.counts["partitions_rewritten"], inserted.counts["rows_written"]) == (1, 1)
    assert after_insert[2016] > seeded[2016] and len(after_insert[2016]) == 2
    workspace.land(
        "orders",
        "2024-01-01T02",
        "a.csv",
        [order("U", 5, 1, "05/01/2016", "5.50", "2024-01-01 02:00:00")],
    )
    _, updated = run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    after = files_by_partition(final, "CREATE_DATE_YEAR")
    assert (updated.counts["partitions_rewritten"], updated.counts["rows_written"]) == (1, 1)
    assert seeded[2016] < after[2016]  # the file of keys 2 and 3 is kept
    assert after[2016].isdisjoint(after_insert[2016] - seeded[2016])  # key 5's is replaced
    assert after[2015] == seeded[2015] and after[2017] == seeded[2017]
    assert table_rows(final, ["ORDER_ID", "AMOUNT", "CREATE_DATE_YEAR"]) == [
        (1, Decimal("1.00"), 2015),
        (2, Decimal("2.00"), 2016),
        (3, Decimal("3.00"), 2016),
        (4, Decimal("4.00"), 2017),
        (5, Decimal("5.50"), 2016),
    ]


def test_an_unpartitioned_table_replaces_only_the_files_holding_a_changed_key(
    spark, workspace: Workspace, change_set_size: str
) -> None:
    from spark_jobs import delta

    table = workspace.configure(SEED)["t"]
    final = workspace.paths("t").final
    batches = [
        (
            "2024-01-01T00",
            [row("I", 1, 0, "2024-01-01 00:00:01"), row("I", 2, 0, "2024-01-01 00:00:01")],
        ),
        ("2024-01-01T01", [row("I", 10, 1, "2024-01-01 01:00:01")]),
        (
            "2024-01-01T02",
            [row("U", 10, 2, "2024-01-01 02:00:01"), row("D", 11, None, "2024-01-01 02:00:02")],
        ),
    ]
    names: list[set[str]] = []
    for hour, rows in batches:
        workspace.land("t", hour, "a.csv", rows)
        _, applied = run(spark, workspace, table, hour, hour[:-2] + f"{int(hour[-2:]) + 1:02d}")
        names.append({f.name for f in delta.load_snapshot(final).files})
    assert applied.counts["rows_written"] == 1  # key 10's row, not keys 1 and 2
    first, second, third = names
    assert first < second and len(second) == 2  # the insert added a file
    assert first < third and third.isdisjoint(second - first)  # the update replaced only 10's
    assert table_rows(final, ["ID", "VALUE"]) == sorted([(1, 0), (2, 0), (10, 2)], key=repr)
    # Only a delete of a key final does not hold: remembered, and final keeps its version.
    version = delta.load_snapshot(final).version
    workspace.land("t", "2024-01-01T03", "a.csv", [row("D", 12, None, "2024-01-01 03:00:00")])
    _, applied = run(spark, workspace, table, "2024-01-01T03", "2024-01-01T04")
    assert (applied.counts["final_version"], delta.load_snapshot(final).version) == (version,) * 2
    assert table_rows(workspace.paths("t").tombstones, ["ID"]) == [(11,), (12,)]
    assert table_rows(final, ["ID", "VALUE"]) == sorted([(1, 0), (2, 0), (10, 2)], key=repr)


@pytest.mark.parametrize("unread", [True, False], ids=["unread", "read"])
def test_a_file_in_a_new_keys_range_is_copied_or_kept_exactly(
    spark, workspace: Workspace, unread: bool
) -> None:
    """A new key inside the key range of a small file that does not hold it: the file is
    replaced unread (a copy of its rows, UNREAD_ROWS_MAX) or, its keys read, kept; either way
    final holds every key once, also when the same change comes again in a later file (the
    later arrival wins: its row replaces the first)."""
    from spark_jobs import delta
    from spark_jobs.overwrite import key_lookup

    table = workspace.configure(SEED)["t"]
    paths = workspace.paths("t")
    workspace.land(
        "t", "2024-01-01T00", "a.csv", [row("I", n, n, "2024-01-01 00:00:01") for n in (1, 3)]
    )
    workspace.land("t", "2024-01-01T01", "a.csv", [row("I", 2, 2, "2024-01-01 01:00:01")])
    with mock.patch.object(
        key_lookup, "UNREAD_ROWS_MAX", key_lookup.UNREAD_ROWS_MAX if unread else -1
    ):
        run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
        first = {f.name for f in delta.load_snapshot(paths.final).files}
        _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
        second = {f.name for f in delta.load_snapshot(paths.final).files}
        rows_after_insert = table_rows(paths.final, ["ID", "VALUE"])
        workspace.land("t", "2024-01-01T01", "b.csv", [row("I", 2, 2, "2024-01-01 01:00:01")])
        staged, again = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert applied.counts["rows_written"] == (3 if unread else 1)
    assert first.isdisjoint(second) if unread else first < second
    assert rows_after_insert == [(1, 1), (2, 2), (3, 3)]
    assert (staged.counts["new_files"], again.counts["rows_written"]) == (1, 3 if unread else 1)
    assert table_rows(paths.final, ["ID", "VALUE", "_cdc_file"]) == [
        (1, 1, "a.csv"),
        (2, 2, "b.csv"),
        (3, 3, "a.csv"),
    ]


def test_a_new_key_in_an_untouched_partitions_key_range_leaves_it_as_it_is(
    spark, workspace: Workspace
) -> None:
    """A new key whose value lies inside the key range of a small file of another partition:
    that file's keys are read (it holds no changed key), so its partition, which the change set
    does not touch, keeps its files; and a key-only delete of a key final never held, inside
    the same range, rewrites nothing."""
    from spark_jobs import delta

    table = workspace.configure(YEARLY)["orders"]
    paths = workspace.paths("orders")
    workspace.land(
        "orders",
        "2024-01-01T00",
        "a.csv",
        [
            order("I", 101, 1, "01/01/2020", "1.00", "2024-01-01 00:00:00"),
            order("I", 105, 1, "01/05/2020", "5.00", "2024-01-01 00:00:00"),
            order("I", 201, 1, "01/01/2021", "1.00", "2024-01-01 00:00:00"),
        ],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    before = files_by_partition(paths.final, "CREATE_DATE_YEAR")
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [order("I", 102, 1, "01/02/2021", "2.00", "2024-01-01 01:00:00")],  # new, in 2021
    )
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    after = files_by_partition(paths.final, "CREATE_DATE_YEAR")
    assert (applied.counts["partitions_rewritten"], applied.counts["rows_written"]) == (1, 1)
    assert after[2020] == before[2020] and after[2021] > before[2021]
    version = delta.load_snapshot(paths.final).version
    workspace.land(
        "orders",
        "2024-01-01T02",
        "a.csv",
        [order("D", 103, 1, None, None, "2024-01-01 02:00:00")],  # never held; in 101-105
    )
    _, deleted = run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert (deleted.counts["final_version"], delta.load_snapshot(paths.final).version) == (
        version,
        version,
    )
    assert table_rows(paths.final, ["ORDER_ID", "CREATE_DATE_YEAR"]) == [
        (101, 2020),
        (102, 2021),
        (105, 2020),
        (201, 2021),
    ]


HOSTILE_VALUES = ["a b", "p=q", "c/d", "x%20y", "é", "hash#1", "q?x", "z:1", "pct%", "_x", ".y"]


def test_files_in_partitions_with_hostile_values_are_replaced_exactly(
    spark, workspace: Workspace
) -> None:
    """A file is removed from the log by its path, which Spark escapes and the log encodes: a
    partition value with any of those characters still has its old file replaced, not kept
    beside the new one (a key twice)."""
    from spark_jobs import delta

    config = {
        "name": "h",
        "file_format": "csv",
        "columns": {"ID": "bigint", "REGION": "string", "VALUE": "int", "TS": "timestamp"},
        "keys": ["ID"],
        "sequence_by": ["TS"],
        "partition_expression": "REGION",
        "partition_column": "REGION_P",
    }
    table = workspace.configure(config)["h"]
    final = workspace.paths("h").final

    def change(flag: str, id_: int, region: str | None, value: int | None, when: str) -> dict:
        return {"FLAG": flag, "ID": id_, "REGION": region, "VALUE": value, "TS": when}

    inserts = [change("I", i, v, 0, "2024-01-01 00:00:00") for i, v in enumerate(HOSTILE_VALUES)]
    workspace.land("h", "2024-01-01T00", "a.csv", inserts)
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    # Every key updated in place, the first moved to the second's partition, the third deleted
    # by its key only.
    updates = [
        change("U", i, v, 1, "2024-01-01 01:00:00") for i, v in enumerate(HOSTILE_VALUES) if i > 2
    ]
    updates += [
        change("U", 0, HOSTILE_VALUES[1], 1, "2024-01-01 01:00:00"),
        change("U", 1, HOSTILE_VALUES[1], 1, "2024-01-01 01:00:00"),
        change("D", 2, None, None, "2024-01-01 01:00:00"),
    ]
    workspace.land("h", "2024-01-01T01", "a.csv", updates)
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert applied.counts["partitions_rewritten"] == len(HOSTILE_VALUES)
    expected = [(0, HOSTILE_VALUES[1], 1), (1, HOSTILE_VALUES[1], 1)] + [
        (i, v, 1) for i, v in enumerate(HOSTILE_VALUES) if i > 2
    ]
    assert table_rows(final, ["ID", "REGION_P", "VALUE"]) == sorted(expected, key=repr)
    snapshot = delta.load_snapshot(final)
    assert snapshot.num_records == len(expected)
    # Spark's own reader (by the files the log lists) agrees.
    rows = delta.read_snapshot(spark, snapshot).select("ID", "REGION_P", "VALUE").collect()
    assert sorted((tuple(r) for r in rows), key=repr) == sorted(expected, key=repr)


def test_key_moving_partition_leaves_its_old_partition(
    spark, workspace: Workspace, change_set_size: str
) -> None:
    table = seed_three_years(spark, workspace)
    final = workspace.paths("orders").final
    before = files_by_partition(final, "CREATE_DATE_YEAR")
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [order("U", 1, 1, "03/01/2017", "1.10", "2024-01-01 01:00:00")],
    )
    _, apply = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert apply.counts["partitions_rewritten"] == 2
    assert table_rows(final, ["ORDER_ID", "CREATE_DATE_YEAR"]) == [
        (1, 2017),
        (2, 2016),
        (3, 2016),
        (4, 2017),
    ]
    after = files_by_partition(final, "CREATE_DATE_YEAR")
    assert 2015 not in after  # its only key moved away
    assert after[2016] == before[2016]


def test_key_only_delete_rewrites_the_partition_holding_the_key(
    spark, workspace: Workspace, change_set_size: str
) -> None:
    table = seed_three_years(spark, workspace)
    final = workspace.paths("orders").final
    before = files_by_partition(final, "CREATE_DATE_YEAR")
    workspace.land(
        "orders", "2024-01-01T01", "a.csv", [order("D", 3, 1, None, None, "2024-01-01 01:00:00")]
    )
    _, apply = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    after = files_by_partition(final, "CREATE_DATE_YEAR")
    assert apply.counts["partitions_rewritten"] == 1
    assert table_rows(final, ["ORDER_ID"]) == [(1,), (2,), (4,)]
    assert (
        after[2015] == before[2015] and after[2017] == before[2017] and after[2016] != before[2016]
    )


def test_rerun_changes_nothing_and_restaging_adds_nothing(spark, workspace: Workspace) -> None:
    table = seed_three_years(spark, workspace)
    paths = workspace.paths("orders")
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [
            order("D", 1, 1, None, None, "2024-01-01 01:00:00"),
            order("U", 4, 1, "03/01/2015", "4.40", "2024-01-01 01:00:01"),
        ],
    )
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    expected = table_rows(paths.final)
    staged = table_rows(paths.staging)
    stage, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T02")
    assert stage.counts["new_files"] == 0 and stage.counts["staged"] == 0
    assert table_rows(paths.final) == expected
    assert table_rows(paths.staging) == staged
    assert table_rows(paths.tombstones, ["ORDER_ID", "LINE_NO"]) == [(1, 1)]


def test_a_file_landing_late_in_a_staged_hour_is_staged_on_rerun(
    spark, workspace: Workspace
) -> None:
    table = seed_three_years(spark, workspace)
    workspace.land(
        "orders",
        "2024-01-01T00",
        "b.csv",
        [order("U", 2, 1, "03/01/2016", "9.00", "2024-01-01 00:30:00")],
    )
    stage, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (stage.counts["files"], stage.counts["new_files"], stage.counts["staged"]) == (2, 1, 1)
    assert (2, Decimal("9.00")) in table_rows(
        workspace.paths("orders").final, ["ORDER_ID", "AMOUNT"]
    )


def test_intervals_in_any_order_give_the_same_table(spark, workspace: Workspace) -> None:
    table = workspace.configure(SEED)["t"]
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [row("I", 1, 1, "2024-01-01 00:00:00"), row("I", 2, 1, "2024-01-01 00:00:00")],
    )
    workspace.land(
        "t",
        "2024-01-01T01",
        "a.csv",
        [row("U", 1, 2, "2024-01-01 01:00:00"), row("D", 2, None, "2024-01-01 01:00:00")],
    )
    workspace.land(
        "t",
        "2024-01-01T02",
        "a.csv",
        [row("U", 1, 3, "2024-01-01 02:00:00"), row("I", 2, 5, "2024-01-01 02:00:00")],
    )
    # A late event in hour 3 that is older than everything above.
    workspace.land(
        "t",
        "2024-01-01T03",
        "a.csv",
        [row("U", 1, 0, "2023-12-31 23:00:00"), row("U", 2, 0, "2024-01-01 00:30:00")],
    )
    for hour in ("2024-01-01T02", "2024-01-01T00", "2024-01-01T03", "2024-01-01T01"):
        end = hour[:-2] + f"{int(hour[-2:]) + 1:02d}"
        run(spark, workspace, table, hour, end)
    assert table_rows(workspace.paths("t").final) == [
        (1, 3, ts("2024-01-01T02:00:00Z")),
        (2, 5, ts("2024-01-01T02:00:00Z")),
    ]


def test_equal_sequence_goes_to_the_later_arrival(spark, workspace: Workspace) -> None:
    table = workspace.configure(SEED)["t"]
    same = "2024-01-01 00:00:00"
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [row("I", 1, 1, same), row("I", 2, 1, same), row("U", 2, 2, same)],
    )
    workspace.land("t", "2024-01-01T00", "b.csv", [row("U", 1, 2, same)])
    workspace.land("t", "2024-01-01T01", "a.csv", [row("U", 1, 3, same), row("D", 3, None, same)])
    workspace.land("t", "2024-01-01T00", "c.csv", [row("I", 3, 1, same)])
    # The later folder is applied first: the earlier one must still lose the ties.
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE"]) == [(1, 3), (2, 2)]


def test_second_sequence_column_breaks_timestamp_ties(spark, workspace: Workspace) -> None:
    config = {
        **SEED,
        "columns": {**SEED["columns"], "LSN": "bigint"},
        "sequence_by": ["CDC_TIMESTAMP", "LSN"],
    }
    table = workspace.configure(config)["t"]
    same = "2024-01-01 00:00:00"
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [
            {**row("U", 1, 2, same), "LSN": 20},
            {**row("U", 1, 1, same), "LSN": 10},
            {**row("D", 2, None, same), "LSN": 7},
            {**row("I", 2, 1, same), "LSN": 5},
        ],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE", "LSN"]) == [(1, 2, 20)]


def test_a_delete_is_remembered_also_after_reset_staging(spark, workspace: Workspace) -> None:
    table = workspace.configure(SEED)["t"]
    paths = workspace.paths("t")
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.csv",
        [row("I", 1, 1, "2024-01-01 00:00:00"), row("I", 2, 1, "2024-01-01 00:00:00")],
    )
    workspace.land("t", "2024-01-01T01", "a.csv", [row("D", 1, None, "2024-01-01 01:00:00")])
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T02")
    reset = run_reset_staging(context(spark, workspace, table))
    assert (reset.counts["rows_before"], reset.counts["rows_after"]) == (3, 2)
    staged = table_rows(paths.staging, ["ID", "VALUE", "_cdc_flag"])
    assert staged == [(1, None, "D"), (2, 1, "U")]
    # An older update of the deleted key lands later: it must not bring the key back.
    workspace.land("t", "2024-01-01T02", "a.csv", [row("U", 1, 9, "2024-01-01 00:30:00")])
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert table_rows(paths.final, ["ID", "VALUE"]) == [(2, 1)]
    # A newer insert does.
    workspace.land("t", "2024-01-01T03", "a.csv", [row("I", 1, 7, "2024-01-01 03:00:00")])
    run(spark, workspace, table, "2024-01-01T03", "2024-01-01T04")
    assert table_rows(paths.final, ["ID", "VALUE"]) == [(1, 7), (2, 1)]


def test_reset_staging_keeps_changes_not_yet_applied(spark, workspace: Workspace) -> None:
    table = workspace.configure(SEED)["t"]
    ctx = context(spark, workspace, table)
    workspace.land("t", "2024-01-01T00", "a.csv", [row("I", 1, 1, "2024-01-01 00:00:00")])
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    workspace.land(
        "t",
        "2024-01-01T01",
        "a.csv",
        [row("U", 1, 2, "2024-01-01 01:00:00"), row("I", 2, 1, "2024-01-01 01:00:00")],
    )
    from spark_jobs.overwrite_final import run_overwrite_final
    from spark_jobs.stage import run_stage
    from tests.helpers import interval

    run_stage(ctx, interval("2024-01-01T01", "2024-01-01T02"))  # staged, not applied
    run_reset_staging(ctx)
    run_overwrite_final(ctx, interval("2024-01-01T01", "2024-01-01T02"))
    assert table_rows(workspace.paths("t").final, ["ID", "VALUE"]) == [(1, 2), (2, 1)]


def test_parquet_input_with_types_from_the_files(spark, workspace: Workspace) -> None:
    config = {k: v for k, v in SEED.items() if k != "columns"} | {"file_format": "parquet"}
    table = workspace.configure(config)["t"]
    import datetime as dt

    when = dt.datetime(2024, 1, 1, 0, 0, tzinfo=dt.UTC)
    workspace.land(
        "t",
        "2024-01-01T00",
        "a.parquet",
        [
            {"FLAG": "I", "ID": 1, "VALUE": 1.5, "CDC_TIMESTAMP": when},
            {"FLAG": "I", "ID": 2, "VALUE": 2.5, "CDC_TIMESTAMP": when},
            {"FLAG": "D", "ID": 2, "VALUE": None, "CDC_TIMESTAMP": when + dt.timedelta(seconds=1)},
        ],
        file_format="parquet",
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert table_rows(workspace.paths("t").final) == [(1, 1.5, when)]


def test_json_customers_story_of_seed_000(spark, workspace: Workspace) -> None:
    table = workspace.configure(
        {
            "name": "customers",
            "file_format": "json",
            "columns": {"ID": "string", "NAME": "string", "SEQ": "bigint"},
            "keys": ["ID"],
            "sequence_by": ["SEQ"],
        }
    )["customers"]
    workspace.land(
        "customers",
        "2024-01-01T00",
        "a.json",
        [
            {"FLAG": "I", "ID": "id1", "NAME": "Alice", "SEQ": 0},
            {"FLAG": "I", "ID": "id2", "NAME": "Bob", "SEQ": 0},
        ],
        file_format="json",
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    workspace.land(
        "customers",
        "2024-01-01T01",
        "a.json",
        [
            {"FLAG": "U", "ID": "id1", "NAME": "Angela", "SEQ": 1},
            {"FLAG": "D", "ID": "id2", "SEQ": 2},
            {"FLAG": "I", "ID": "id2", "NAME": "Carol", "SEQ": 3},
        ],
        file_format="json",
    )
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert table_rows(workspace.paths("customers").final) == [
        ("id1", "Angela", 1),
        ("id2", "Carol", 3),
    ]
    # An unpartitioned table: a winning delete goes to tombstones (same Spark job as final).
    workspace.land(
        "customers",
        "2024-01-01T02",
        "a.json",
        [{"FLAG": "D", "ID": "id1", "SEQ": 4}, {"FLAG": "U", "ID": "id1", "NAME": "Old", "SEQ": 2}],
        file_format="json",
    )
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    paths = workspace.paths("customers")
    assert table_rows(paths.final) == [("id2", "Carol", 3)]
    assert table_rows(paths.tombstones, ["ID", "SEQ"]) == [("id1", 4)]


DAILY = {
    "name": "ev",
    "file_format": "csv",
    "columns": {"ID": "bigint", "VALUE": "int", "CDC_TIMESTAMP": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["CDC_TIMESTAMP"],
    "partition_expression": "date_trunc('DAY', CDC_TIMESTAMP)",
    "partition_column": "DAY",
}


@pytest.mark.parametrize("stable", [False, True])
def test_timestamp_partitions_keep_their_other_rows(
    spark, workspace: Workspace, change_set_size: str, stable: bool
) -> None:
    """A timestamp partition value from the Delta log (an aware datetime) and one from the
    changes (naive) name the same partition: a new row there keeps the rows already in it."""
    table = workspace.configure({**DAILY, "partition_stable": stable})["ev"]
    final = workspace.paths("ev").final

    workspace.land(
        "ev",
        "2024-01-01T00",
        "a.csv",
        [
            row("I", 1, 10, "2024-01-01 01:00:00"),
            row("I", 2, 20, "2024-01-01 02:00:00"),
            row("I", 3, 30, "2024-01-02 03:00:00"),
        ],
    )
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    before = files_by_partition(final, "DAY")
    workspace.land(
        "ev",
        "2024-01-01T01",
        "a.csv",
        [
            row("I", 4, 40, "2024-01-01 04:00:00"),  # a new key in the existing day 1
            row("U", 2, 21, "2024-01-01 05:00:00"),
        ],
    )
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert applied.counts["partitions_rewritten"] == 1
    after = files_by_partition(final, "DAY")
    day1, day2 = ts("2024-01-01T00:00:00Z"), ts("2024-01-02T00:00:00Z")
    assert after[day2] == before[day2]
    assert table_rows(final, ["ID", "VALUE", "DAY"]) == [
        (1, 10, day1),
        (2, 21, day1),
        (3, 30, day2),
        (4, 40, day1),
    ]


def test_partition_stable_looks_up_only_keys_with_a_delete(
    spark, workspace: Workspace, change_set_size: str
) -> None:
    """With partition_stable, an insert or update is trusted to find its key in the partition
    it names; only keys with a delete are looked up (a delete's row image still adds its
    partition, so the lookup finds the key there without reading other partitions)."""
    table = workspace.configure({**YEARLY, "partition_stable": True})["orders"]
    paths = workspace.paths("orders")
    # Five years, one file each; order ids 1xx in 2020, 2xx in 2021, ... 5xx in 2024.
    first = [
        order("I", year * 100 + n, 1, f"01/0{n}/{2019 + year}", "1.00", "2024-01-01 00:00:00")
        for year in (1, 2, 3, 4, 5)
        for n in (1, 2)
    ]
    workspace.land("orders", "2024-01-01T00", "a.csv", first)
    _, applied = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (applied.counts["keys"], applied.counts["keys_looked_up"]) == (10, 0)
    before = files_by_partition(paths.final, "CREATE_DATE_YEAR")
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [
            order("U", 202, 1, "01/02/2021", "2.00", "2024-01-01 01:00:00"),  # in 2021
            order("D", 101, 1, None, None, "2024-01-01 01:00:00"),  # key only: looked up
            order("D", 302, 1, "01/02/2022", "1.00", "2024-01-01 01:00:00"),  # row image: 2022
            order("I", 999, 1, "01/01/2025", "9.00", "2024-01-01 01:00:00"),  # new, in 2025
            order("D", 888, 1, None, None, "2024-01-01 01:00:00"),  # key only, never existed
            # Deleted by key, then created again in another year: its delete gets it looked up.
            order("D", 502, 1, None, None, "2024-01-01 01:00:00"),
            order("I", 502, 1, "02/02/2025", "5.00", "2024-01-01 01:00:01"),
        ],
    )
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    # Looked up: the keys with a delete (101, 302, 888, 502).
    assert (applied.counts["keys"], applied.counts["keys_looked_up"]) == (6, 4)
    # 2021 (update), 2020 (found for 101), 2022 (the delete's image), 2025 (inserts), 2024
    # (found for 502).
    assert applied.counts["partitions_rewritten"] == 5
    after = files_by_partition(paths.final, "CREATE_DATE_YEAR")
    assert after[2023] == before[2023]
    assert after[2020].isdisjoint(before[2020]) and after[2022].isdisjoint(before[2022])
    assert table_rows(paths.final, ["ORDER_ID", "AMOUNT", "CREATE_DATE_YEAR"]) == [
        (102, Decimal("1.00"), 2020),
        (201, Decimal("1.00"), 2021),
        (202, Decimal("2.00"), 2021),
        (301, Decimal("1.00"), 2022),
        (401, Decimal("1.00"), 2023),
        (402, Decimal("1.00"), 2023),
        (501, Decimal("1.00"), 2024),
        (502, Decimal("5.00"), 2025),
        (999, Decimal("9.00"), 2025),
    ]
    assert table_rows(paths.tombstones, ["ORDER_ID"]) == [(101,), (302,), (888,)]


# It reads Spark's own job bookkeeping through `sparkContext` (the status tracker counts the jobs
# of a job group): Connect has no sparkContext, and its tags do not reach the tracker.
@pytest.mark.classic_only
def test_moved_key_lookup_reads_only_files_whose_key_range_can_hold_it(
    spark, workspace: Workspace
) -> None:
    """Files carry min/max key statistics: a changed key is looked for only in the files whose
    key range can hold it (new keys above every range read no file), and a run replaces the
    files that hold one."""
    from spark_jobs import delta
    from spark_jobs.overwrite import key_lookup
    from spark_jobs.overwrite.key_lookup import ChangedKeys, files_holding_keys, files_that_may_hold

    table = workspace.configure(YEARLY)["orders"]
    paths = workspace.paths("orders")
    # Three years, one file each; order ids 1xx in 2020, 2xx in 2021, 3xx in 2022.
    first = [
        order("I", year * 100 + n, 1, f"01/0{n}/{2019 + year}", "1.00", "2024-01-01 00:00:00")
        for year in (1, 2, 3)
        for n in (1, 2, 3)
    ]
    workspace.land("orders", "2024-01-01T00", "a.csv", first)
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    final = delta.load_snapshot(paths.final)
    ranges = {
        f.partition_values["CREATE_DATE_YEAR"]: (f.min_values["ORDER_ID"], f.max_values["ORDER_ID"])
        for f in final.files
    }
    assert ranges == {2020: (101, 103), 2021: (201, 203), 2022: (301, 303)}
    ctx = context(spark, workspace, table)

    def keys(*ids: int):  # type: ignore[no-untyped-def]
        return spark.createDataFrame([(i, 1) for i in ids], "ORDER_ID bigint, LINE_NO int")

    def years(files) -> set[int]:  # type: ignore[no-untyped-def]
        return {f.partition_values["CREATE_DATE_YEAR"] for f in files}

    assert files_that_may_hold(ctx, final, final.files, keys(900, 901)) == []  # new keys
    assert years(files_that_may_hold(ctx, final, final.files, keys(202, 900))) == {2021}
    assert years(files_that_may_hold(ctx, final, final.files, keys(102))) == {2020}
    import pyarrow as pa

    def local(*ids: int) -> pa.Table:
        return pa.table({"ORDER_ID": pa.array(ids, pa.int64()), "LINE_NO": [1] * len(ids)})

    def changed(*ids: int, on_driver: bool) -> ChangedKeys:
        frame, arrow = keys(*ids), local(*ids) if on_driver else None
        return ChangedKeys(
            frame=frame,
            local=arrow,
            partitions={2020},
            lookup=frame,
            lookup_local=arrow,
            broadcast=True,
        )

    # 202 moves to 2020, 103 is there, 999 is new: the files of 2021 and 2020 hold a key.
    for on_driver in (False, True):
        found = files_holding_keys(ctx, final, changed(202, 103, 999, on_driver=on_driver))
        assert years(found) == {2020, 2021}
    # Keys no file outside 2020 can hold: its file (3 rows) is taken without a Spark job to
    # read its keys, unless UNREAD_ROWS_MAX says it is too large. (The key is composite: a
    # lookup is two jobs, the keys' broadcast and the scan.)
    for unread, jobs_wanted in ((key_lookup.UNREAD_ROWS_MAX, 0), (2, 2)):
        group = f"lookup-unread-{unread}"
        spark.sparkContext.setJobGroup(group, group)
        try:
            with mock.patch.object(key_lookup, "UNREAD_ROWS_MAX", unread):
                found = files_holding_keys(ctx, final, changed(102, 150, on_driver=True))
            jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(group)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        assert (years(found), len(jobs)) == ({2020}, jobs_wanted), unread
    # With the keys on the driver, when no file's key range can hold any key (999 is in none),
    # no Spark job runs at all.
    spark.sparkContext.setJobGroup("lookup-probe", "lookup-probe")
    try:
        found = files_holding_keys(ctx, final, changed(999, 998, on_driver=True))
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup("lookup-probe")
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert (found, jobs) == ([], [])
    # The same through a run: the move leaves 2021, the new order touches 2023 only.
    workspace.land(
        "orders",
        "2024-01-01T01",
        "a.csv",
        [
            order("U", 202, 1, "02/02/2020", "2.00", "2024-01-01 01:00:00"),
            order("I", 999, 1, "01/01/2023", "9.00", "2024-01-01 01:00:00"),
        ],
    )
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert applied.counts["partitions_rewritten"] == 3
    assert table_rows(paths.final, ["ORDER_ID", "CREATE_DATE_YEAR"]) == sorted(
        [
            (101, 2020),
            (102, 2020),
            (103, 2020),
            (202, 2020),
            (201, 2021),
            (203, 2021),
            (301, 2022),
            (302, 2022),
            (303, 2022),
            (999, 2023),
        ],
        key=repr,
    )


@pytest.mark.parametrize("partitioned", [False, True], ids=["unpartitioned", "partitioned"])
def test_an_optimize_landing_between_read_and_commit_leaves_no_key_twice(
    spark, workspace: Workspace, monkeypatch: pytest.MonkeyPatch, partitioned: bool
) -> None:
    """delta-rs lets an overwrite commit after an OPTIMIZE removed files it read, so the
    compacted copy of those rows stands beside the rewrite. The run sees the OPTIMIZE in the
    log and recomputes; the recompute must rank every row of the partitions it rewrites, not
    only its changed keys, or the keys it does not change stay twice (CI, Airflow backfill)."""
    from spark_jobs import delta
    from spark_jobs.optimize import optimize_table

    if partitioned:
        table = seed_three_years(spark, workspace)
        name, columns = "orders", ["ORDER_ID", "AMOUNT"]
        # A second file in 2016, so OPTIMIZE has something to compact there.
        workspace.land(
            name,
            "2024-01-01T01",
            "a.csv",
            [order("I", 5, 1, "05/01/2016", "5.00", "2024-01-01 01:00:00")],
        )
        run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
        change = order("U", 2, 1, "03/01/2016", "2.50", "2024-01-01 02:00:00")
        expected = [
            (1, Decimal("1.00")),
            (2, Decimal("2.50")),
            (3, Decimal("3.00")),
            (4, Decimal("4.00")),
            (5, Decimal("5.00")),
        ]
    else:
        table = workspace.configure(SEED)["t"]
        name, columns = "t", ["ID", "VALUE"]
        for hour, rows in (
            (
                "2024-01-01T00",
                [row("I", 1, 0, "2024-01-01 00:00:01"), row("I", 10, 0, "2024-01-01 00:00:02")],
            ),
            ("2024-01-01T01", [row("I", 11, 1, "2024-01-01 01:00:01")]),
        ):
            workspace.land(name, hour, "a.csv", rows)
            run(spark, workspace, table, hour, hour[:-2] + f"{int(hour[-2:]) + 1:02d}")
        change = row("U", 1, 2, "2024-01-01 02:00:00")
        expected = [(1, 2), (10, 0), (11, 1)]
    final = workspace.paths(name).final
    assert len(delta.load_snapshot(final).files) >= 2
    workspace.land(name, "2024-01-01T02", "a.csv", [change])

    optimized: list[tuple[int, int, int]] = []
    real_fault = delta.inject_fault

    def optimize_before_our_commit(point: str) -> None:
        if point == "overwrite_final:before_commit" and not optimized:
            optimized.append(optimize_table(final))
        real_fault(point)

    monkeypatch.setattr(delta, "inject_fault", optimize_before_our_commit)
    _, applied = run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    ((before, after, _),) = optimized
    assert after < before  # the OPTIMIZE did compact files the run had read
    assert applied.counts["attempts"] == 2
    assert table_rows(final, columns) == sorted(expected, key=repr)


def _multi_stage_jobs(spark: Any, group: str) -> list[tuple[int, list[int]]]:
    """The jobs of a job group with more than one stage: a shuffle (a job's list names the
    stages it depends on, skipped ones too)."""
    tracker = spark.sparkContext.statusTracker()
    found = []
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        if info is not None and len(info.stageIds) > 1:
            found.append((job, list(info.stageIds)))
    return found


# Spark's own job bookkeeping through `sparkContext`, as above: classic sessions only.
@pytest.mark.classic_only
@pytest.mark.parametrize("kind", ["partitioned", "unpartitioned", "insert_only"])
def test_a_small_run_shuffles_nothing(spark: Any, workspace: Workspace, kind: str) -> None:
    """A run of a few changes (the operating point's 15-minute run) stages and applies them
    without a shuffle: each count, distinct and ranking of so few rows runs in one task (a
    shuffle is two Spark jobs more, each a round of planning and scheduling), and the result is
    exact."""
    if kind == "insert_only":
        table = workspace.configure(EVENTS)["ev"]
        first = [event("a", "2024-01-01T23:10:00Z"), event("b", "2024-01-01T23:20:00Z")]
        second = [
            event("a", "2024-01-01T23:10:00Z"),  # re-sent
            event("a", "2024-01-02T00:05:00Z"),
            event("a", "2024-01-02T00:05:00Z"),  # the same event twice in the run
            event("c", "2024-01-02T00:06:00Z", "buy"),
        ]
        workspace.land("ev", "2024-01-01T23", "a.json", first, file_format="json")
        workspace.land("ev", "2024-01-02T00", "a.json", second, file_format="json")
        columns = ["EVENT_ID", "EVENT_TIME", "KIND"]
        expected = [
            ("a", ts("2024-01-01T23:10:00Z"), "click"),
            ("a", ts("2024-01-02T00:05:00Z"), "click"),
            ("b", ts("2024-01-01T23:20:00Z"), "click"),
            ("c", ts("2024-01-02T00:06:00Z"), "buy"),
        ]
    elif kind == "partitioned":
        table = workspace.configure(YEARLY)["orders"]
        first = [
            order("I", 101, 1, "01/01/2020", "1.00", "2024-01-01 23:00:00"),
            order("I", 201, 1, "01/01/2021", "2.00", "2024-01-01 23:00:00"),
            order("I", 202, 1, "01/02/2021", "3.00", "2024-01-01 23:00:00"),
        ]
        second = [
            order("U", 101, 1, "01/01/2020", "1.50", "2024-01-02 00:01:00"),
            order("U", 201, 1, "05/05/2022", "2.50", "2024-01-02 00:02:00"),  # moves to 2022
            order("D", 202, 1, None, None, "2024-01-02 00:03:00"),  # key-only delete
            order("I", 301, 1, "01/01/2022", "4.00", "2024-01-02 00:04:00"),
        ]
        workspace.land("orders", "2024-01-01T23", "a.csv", first)
        workspace.land("orders", "2024-01-02T00", "a.csv", second)
        columns = ["ORDER_ID", "CREATE_DATE", "AMOUNT", "CREATE_DATE_YEAR"]
        expected = [
            (101, "01/01/2020", Decimal("1.50"), 2020),
            (201, "05/05/2022", Decimal("2.50"), 2022),
            (301, "01/01/2022", Decimal("4.00"), 2022),
        ]
    else:
        table = workspace.configure(SEED)["t"]
        first = [row("I", n, n, "2024-01-01 23:00:00") for n in (1, 2, 3)]
        second = [
            row("U", 1, 10, "2024-01-02 00:01:00"),
            row("U", 1, 11, "2024-01-02 00:02:00"),
            row("D", 2, None, "2024-01-02 00:03:00"),
            row("I", 4, 4, "2024-01-02 00:04:00"),
        ]
        workspace.land("t", "2024-01-01T23", "a.csv", first)
        workspace.land("t", "2024-01-02T00", "a.csv", second)
        columns = ["ID", "VALUE"]
        expected = [(1, 11), (3, 3), (4, 4)]
    run(spark, workspace, table, "2024-01-01T23", "2024-01-02T00")
    group = f"small-run-{kind}"
    spark.sparkContext.setJobGroup(group, group)
    try:
        run(spark, workspace, table, "2024-01-02T00", "2024-01-02T01")
        shuffles = _multi_stage_jobs(spark, group)
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(group)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert jobs and shuffles == []
    assert table_rows(workspace.paths(table.name).final, columns) == sorted(expected, key=repr)
