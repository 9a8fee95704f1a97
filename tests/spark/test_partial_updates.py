"""`ignore_null_updates`: a flat table whose updates send only what changed.

A null (or a column the file lacks) in an insert or update keeps the key's previous value:
within a batch, across batches, for a change that arrives late and out of order, and in every
history version; a delete still ends the row, so a key inserted after it starts empty. Turned
off, a null is a null again.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import Workspace, table_rows
from tests.spark.steps import run

pytestmark = pytest.mark.spark

ROW = {
    "name": "p",
    "file_format": "csv",
    "columns": {"ID": "bigint", "NAME": "string", "BALANCE": "bigint", "TS": "bigint"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
    "history": True,
    "ignore_null_updates": True,
}


def change(flag: str, id_: int, name: str | None, balance: int | None, ts: int) -> dict[str, Any]:
    return {"FLAG": flag, "ID": id_, "NAME": name, "BALANCE": balance, "TS": ts}


def test_nulls_keep_previous_values_across_batches_late_files_deletes_and_history(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(ROW)["p"]
    paths = workspace.paths("p")
    workspace.land(
        "p",
        "2024-01-01T00",
        "a.csv",
        [
            change("I", 1, "a", 10, 1),
            change("U", 1, None, 20, 2),  # NAME not sent: stays "a"
            change("I", 2, "b", 5, 1),
            change("D", 2, None, None, 2),
            change("I", 2, None, 7, 3),  # after its delete: nothing to keep
        ],
    )
    staged, applied = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (staged.counts["staged"], applied.counts["rows_written"]) == (5, 2)
    assert table_rows(paths.final, ["ID", "NAME", "BALANCE"]) == [(1, "a", 20), (2, None, 7)]

    workspace.land("p", "2024-01-01T01", "b.csv", [change("U", 1, "z", None, 4)])
    # A file without the BALANCE column: every row keeps its balance.
    workspace.land("p", "2024-01-01T01", "c.csv", [{"FLAG": "U", "ID": 2, "NAME": "c", "TS": 5}])
    # Late, into hour 00's folder, ordered between TS 2 and 4: the update at 4 keeps its 99.
    workspace.land("p", "2024-01-01T00", "late.csv", [change("U", 1, None, 99, 3)])
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert table_rows(paths.final, ["ID", "NAME", "BALANCE"]) == [(1, "z", 99), (2, "c", 7)]
    history = table_rows(paths.history, ["ID", "NAME", "BALANCE", "TS", "_cdc_is_deleted"])
    assert history == sorted(
        [
            (1, "a", 10, 1, False),
            (1, "a", 20, 2, False),
            (1, "a", 99, 3, False),
            (1, "z", 99, 4, False),
            (2, "b", 5, 1, True),
            (2, None, 7, 3, False),
            (2, "c", 7, 5, False),
        ],
        key=repr,
    )

    # Turned off: the next null is a null (staging keeps its column; old rows keep their rule).
    table = workspace.configure({**ROW, "ignore_null_updates": False})["p"]
    workspace.land("p", "2024-01-01T02", "d.csv", [change("U", 1, None, 100, 6)])
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert table_rows(paths.final, ["ID", "NAME", "BALANCE"]) == [(1, None, 100), (2, "c", 7)]
