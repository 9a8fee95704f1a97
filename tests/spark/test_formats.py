"""Debezium and wal2json change events: the sample files, primary-key changes, types, markers."""

from __future__ import annotations

import json
import shutil
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from cdc_pipeline.config import project_root
from tests.helpers import Workspace, table_rows, ts
from tests.spark.steps import run

pytestmark = pytest.mark.spark

SAMPLES = project_root() / "samples"


def land_sample(workspace: Workspace, table: str, change_format: str) -> None:
    """Copy samples/<format>/<table>/hour-NN.json into the hours 2024-01-01T00, T01, ..."""
    for source in sorted((SAMPLES / change_format / table).glob("hour-*.json")):
        hour = int(source.stem.split("-")[1])
        folder = workspace.landing / table / f"dt=2024-01-01/hr={hour:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, folder / f"{table}-{hour:02d}.json")


def test_debezium_sample_files(spark, workspace: Workspace) -> None:
    table = workspace.configure(
        {"name": "customers_cdc", "change_format": "debezium", "keys": ["id"]}
    )["customers_cdc"]
    land_sample(workspace, "customers_cdc", "debezium")
    paths = workspace.paths("customers_cdc")
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert staged.counts["transaction_markers"] == 2
    assert staged.counts["tombstones_skipped"] == 1
    assert staged.counts["quarantined"] == 1
    # Bob's key change 2 -> 22 (a delete and a create at one LSN) is applied in one commit.
    columns = ["id", "name", "email", "tier"]
    assert table_rows(paths.final, columns) == sorted(
        [
            (1, "Alice", "alice@shop.example", "gold"),
            (3, "Carol", "carol@example.com", "silver"),
            (22, "Bob", "bob@example.com", "silver"),
        ],
        key=repr,
    )
    quarantine = table_rows(paths.quarantine, ["_cdc_raw", "_cdc_reason"])
    assert quarantine == [
        ('{"before":null,"after":{"id":4,"name":"Dan"', "malformed line: not JSON")
    ]
    staged, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    # The truncate, captured before every change here, is applied and removes nothing.
    assert (staged.counts["unknown_events_skipped"], applied.counts["truncates_applied"]) == (0, 1)
    # Alice deleted by a key-only before image; the late tier=bronze update loses to gold.
    assert table_rows(paths.final, columns) == sorted(
        [(3, "Carol", "carol@example.com", "gold"), (22, "Bob", "bob@example.com", "silver")],
        key=repr,
    )
    final = {r[0]: r for r in table_rows(paths.final, ["id", "_cdc_source_ts_ms", "_cdc_lsn"])}
    assert final[3] == (3, 1704070800000, 24030000)


def test_wal2json_sample_files(spark, workspace: Workspace) -> None:
    table = workspace.configure({"name": "accounts", "change_format": "wal2json", "keys": ["id"]})[
        "accounts"
    ]
    land_sample(workspace, "accounts", "wal2json")
    paths = workspace.paths("accounts")
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (staged.counts["transaction_markers"], staged.counts["unknown_events_skipped"]) == (4, 1)
    # The identity 2 -> 200 update: key 2 is gone and 200 holds the row after the same run.
    assert table_rows(paths.final, ["id", "owner", "balance"]) == sorted(
        [(1, "Anna", Decimal("90.25")), (200, "Olaf", Decimal("20.00"))], key=repr
    )
    assert table_rows(paths.quarantine, ["_cdc_raw", "_cdc_reason"]) == [
        ("this line is not JSON", "malformed line: not JSON")
    ]
    run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert table_rows(paths.final, ["id", "owner", "balance"]) == sorted(
        [(3, "Elsa", Decimal("5.00")), (200, "Olaf", Decimal("25.00"))], key=repr
    )
    # Types from wal2json's type names: integer -> int, numeric(12,2) -> decimal(12,2).
    assert final_types(paths.final)["id"] == "integer"
    assert final_types(paths.final)["balance"] == "decimal(12,2)"


def final_types(path: Path) -> dict[str, str]:
    """Column -> Delta type name of a table's schema."""
    schema = json.loads(DeltaTable(str(path)).schema().to_json())
    return {f["name"]: f["type"] for f in schema["fields"]}


def wrapped(op: str, before: dict | None, after: dict | None, ts_ms: int, pos: int) -> str:
    """A Debezium MySQL event inside the schema/payload wrapper."""
    value_fields = [
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "born"},
        {
            "type": "int64",
            "optional": True,
            "name": "io.debezium.time.MicroTimestamp",
            "field": "seen",
        },
        {"type": "float64", "optional": True, "field": "score"},
    ]
    schema = {
        "type": "struct",
        "fields": [
            {"type": "struct", "optional": True, "field": "before", "fields": value_fields},
            {"type": "struct", "optional": True, "field": "after", "fields": value_fields},
        ],
    }
    source = {"connector": "mysql", "ts_ms": ts_ms, "file": "mysql-bin.000003", "pos": pos}
    payload = {"op": op, "before": before, "after": after, "source": source}
    return json.dumps({"schema": schema, "payload": payload})


def test_debezium_wrapper_types_binlog_order_and_key_change(spark, workspace: Workspace) -> None:
    table = workspace.configure({"name": "p", "change_format": "debezium", "keys": ["id"]})["p"]
    row = {"id": 1, "born": 19723, "seen": 1704067200123456, "score": 1.5}
    folder = workspace.landing / "p" / "dt=2024-01-01/hr=00"
    folder.mkdir(parents=True)
    lines = [
        wrapped("c", None, row, 1000, 500),
        # Same source.ts_ms: the binlog position orders them (700 after 600).
        wrapped("u", row, {**row, "score": 3.0}, 2000, 700),
        wrapped("u", row, {**row, "score": 2.0}, 2000, 600),
        # A key change inside an update: the old key goes, the new key holds the row.
        wrapped("c", None, {**row, "id": 5}, 2000, 800),
        wrapped("u", {**row, "id": 5}, {**row, "id": 6, "score": 6.0}, 3000, 900),
    ]
    (folder / "a.json").write_text("\n".join(lines) + "\n")
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    rows = table_rows(workspace.paths("p").final, ["id", "born", "seen", "score", "_cdc_position"])
    assert rows == [
        (
            1,
            date(2024, 1, 1),
            ts("2024-01-01T00:00:00.123456Z"),
            3.0,
            "mysql-bin.000003:00000000000000000700:0000000000",
        ),
        (
            6,
            date(2024, 1, 1),
            ts("2024-01-01T00:00:00.123456Z"),
            6.0,
            "mysql-bin.000003:00000000000000000900:0000000000",
        ),
    ]
