"""change_format snapshot (seed 004): full extracts compared by hashes into I, U, D and N.

The extracts and every expected count and row are built here in plain Python from the seed's
description, independently of the code under test.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import pytest
from deltalake import DeltaTable

from cdc_pipeline.errors import InputError
from spark_jobs.stage import run_stage
from tests.helpers import Workspace, interval, table_rows
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark

KEYS = [f"K{i}" for i in range(1, 6)]
VALUES = [f"V{i}" for i in range(1, 11)]
DAY_1 = datetime(2019, 6, 18, tzinfo=UTC)
DAY_2 = datetime(2019, 6, 19, tzinfo=UTC)
VERSION_COLUMNS = ["_cdc_valid_from", "_cdc_valid_to", "_cdc_is_current", "_cdc_is_deleted"]


def seed_004_table(workspace: Workspace):  # type: ignore[no-untyped-def]
    return workspace.configure(
        {
            "name": "accounts_snapshot",
            "change_format": "snapshot",
            "file_format": "parquet",
            "columns": {
                **{k: "string" for k in KEYS},
                **{v: "bigint" for v in VALUES},
                "EXTRACTED_AT": "string",
            },
            "keys": KEYS,
            "compare_exclude": ["EXTRACTED_AT"],
            "history": True,
            "schedule": "@daily",
        }
    )["accounts_snapshot"]


def new_key(rng: random.Random) -> dict[str, str]:
    return {k: str(uuid.UUID(int=rng.getrandbits(128), version=4)) for k in KEYS}


def test_seed_004_day_1_and_day_2(spark, workspace: Workspace) -> None:
    rng = random.Random(4)
    day_1 = [
        {**new_key(rng), **{v: rng.randrange(10**6) for v in VALUES}, "EXTRACTED_AT": "day 1"}
        for _ in range(10_000)
    ]
    deleted, updated, unchanged = day_1[:2000], day_1[2000:6000], day_1[6000:]
    inserted = [
        {**new_key(rng), **{v: rng.randrange(10**6) for v in VALUES}, "EXTRACTED_AT": "day 2"}
        for _ in range(2000)
    ]
    updates = [{**row, "V3": row["V3"] + 1, "EXTRACTED_AT": "day 2"} for row in updated]
    # Unchanged rows carry a new extraction time only: compare_exclude keeps them unchanged.
    day_2 = [*updates, *[{**row, "EXTRACTED_AT": "day 2"} for row in unchanged], *inserted]
    rng.shuffle(day_2)
    table = seed_004_table(workspace)
    paths = workspace.paths("accounts_snapshot")
    workspace.land("accounts_snapshot", "2019-06-18T00", "extract.parquet", day_1, "parquet")
    staged, applied = run(spark, workspace, table, "2019-06-18T00", "2019-06-19T00")
    assert {k: staged.counts[k] for k in ("inserted", "updated", "deleted", "unchanged")} == {
        "inserted": 10_000,
        "updated": 0,
        "deleted": 0,
        "unchanged": 0,
    }
    assert (applied.counts["rows_written"], applied.counts["history_rows_written"]) == (
        10_000,
        10_000,
    )
    columns = [*KEYS, *VALUES, "EXTRACTED_AT"]
    assert table_rows(paths.final, columns) == sorted(
        (tuple(r[c] for c in columns) for r in day_1), key=repr
    )

    workspace.land("accounts_snapshot", "2019-06-19T00", "extract.parquet", day_2, "parquet")
    staged, _ = run(spark, workspace, table, "2019-06-19T00", "2019-06-20T00")
    assert {k: staged.counts[k] for k in ("inserted", "updated", "deleted", "unchanged")} == {
        "inserted": 2000,
        "updated": 4000,
        "deleted": 2000,
        "unchanged": 4000,
    }
    assert staged.counts["staged"] == 8000  # N rows are not staged
    expected_final = [*updates, *unchanged, *inserted]  # unchanged rows keep day 1's values
    assert table_rows(paths.final, columns) == sorted(
        (tuple(r[c] for c in columns) for r in expected_final), key=repr
    )
    # History: one version per I and U, the deleted and updated day-1 versions closed at day 2.
    history = table_rows(paths.history, [*KEYS, "V3", *VERSION_COLUMNS])

    def version(row, start, end, current, gone):  # type: ignore[no-untyped-def]
        return (*[row[k] for k in KEYS], row["V3"], start, end, current, gone)

    expected_history = [
        *[version(r, DAY_1, DAY_2, False, True) for r in deleted],
        *[version(r, DAY_1, DAY_2, False, False) for r in updated],
        *[version(r, DAY_2, None, True, False) for r in updates],
        *[version(r, DAY_1, None, True, False) for r in unchanged],
        *[version(r, DAY_2, None, True, False) for r in inserted],
    ]
    assert len(history) == 16_000
    assert history == sorted(expected_history, key=repr)

    # The same day again: nothing new is staged, and no table gets a new version.
    before = table_rows(paths.final, columns)
    committed = ("final", "tombstones", "history_log", "history")
    versions = {n: DeltaTable(str(getattr(paths, n))).version() for n in committed}
    staged, applied = run(spark, workspace, table, "2019-06-19T00", "2019-06-20T00")
    assert (staged.counts["new_files"], staged.counts["staged"]) == (0, 0)
    assert (applied.counts["rows_written"], applied.counts["history_rows_written"]) == (0, 0)
    assert table_rows(paths.final, columns) == before
    assert {n: DeltaTable(str(getattr(paths, n))).version() for n in committed} == versions
    assert table_rows(paths.history, [*KEYS, "V3", *VERSION_COLUMNS]) == history


def test_snapshot_order_quarantine_and_late_files(spark, workspace: Workspace) -> None:
    table = workspace.configure(
        {
            "name": "items",
            "change_format": "snapshot",
            "file_format": "csv",
            "columns": {"ID": "bigint", "NAME": "string", "PRICE": "int"},
            "keys": ["ID"],
        }
    )["items"]
    paths = workspace.paths("items")
    land = workspace.land
    land("items", "2024-03-01T00", "a.csv", [{"ID": 1, "NAME": "pen", "PRICE": 2}])
    land("items", "2024-03-01T00", "b.csv", [{"ID": 2, "NAME": "ink", "PRICE": 5}])
    run(spark, workspace, table, "2024-03-01", "2024-03-02")
    assert table_rows(paths.final) == [(1, "pen", 2), (2, "ink", 5)]

    # Day 2: ink's price is unparsable (quarantined, so ink is neither updated nor deleted);
    # pen is gone; a cap is new.
    land("items", "2024-03-02T00", "a.csv", [{"ID": 2, "NAME": "ink", "PRICE": "five"}])
    land("items", "2024-03-02T00", "b.csv", [{"ID": 3, "NAME": "cap", "PRICE": 1}])
    ctx = context(spark, workspace, table)
    staged = run_stage(ctx, interval("2024-03-02", "2024-03-03"))
    assert (staged.counts["inserted"], staged.counts["deleted"], staged.counts["quarantined"]) == (
        1,
        1,
        1,
    )
    # Day 3 cannot be compared before day 2 is applied.
    land("items", "2024-03-03T00", "a.csv", [{"ID": 3, "NAME": "cap", "PRICE": 1}])
    with pytest.raises(InputError, match=r"previous extract in dt=2024-03-02/hr=00 is staged"):
        run_stage(ctx, interval("2024-03-03", "2024-03-04"))
    run(spark, workspace, table, "2024-03-02", "2024-03-03")
    assert table_rows(paths.final) == [(2, "ink", 5), (3, "cap", 1)]

    # A file of day 2 that lands late: the whole extract is compared again.
    land("items", "2024-03-02T00", "c.csv", [{"ID": 4, "NAME": "pad", "PRICE": 3}])
    late, _ = run(spark, workspace, table, "2024-03-02", "2024-03-03")
    assert (late.counts["inserted"], late.counts["deleted"], late.counts["unchanged"]) == (1, 0, 1)
    assert table_rows(paths.final) == [(2, "ink", 5), (3, "cap", 1), (4, "pad", 3)]

    # An older extract would undo newer changes: refused, nothing written.
    land("items", "2024-02-28T00", "a.csv", [{"ID": 1, "NAME": "pen", "PRICE": 2}])
    with pytest.raises(InputError, match=r"older than the extract in dt=2024-03-02/hr=00"):
        run_stage(ctx, interval("2024-02-28", "2024-02-29"))
    # Two extracts in one interval: refused.
    land("items", "2024-03-04T00", "a.csv", [{"ID": 3, "NAME": "cap", "PRICE": 1}])
    with pytest.raises(InputError, match=r"one full extract per run"):
        run_stage(ctx, interval("2024-03-03", "2024-03-05"))
    # Day 3 (only the cap): ink and pad are deleted; the delete of pad is key-only.
    staged, _ = run(spark, workspace, table, "2024-03-03", "2024-03-04")
    assert (staged.counts["deleted"], staged.counts["unchanged"]) == (2, 1)
    assert table_rows(paths.final) == [(3, "cap", 1)]
    assert table_rows(paths.final, ["_cdc_snapshot_at"]) == [(datetime(2024, 3, 2, tzinfo=UTC),)]
