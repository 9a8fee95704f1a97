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


def pg_event(op: str, before: dict | None, after: dict | None, lsn: int) -> str:
    """A Debezium PostgreSQL event without the wrapper (source.ts_ms and lsn order it)."""
    source = {"connector": "postgresql", "ts_ms": 1704067200000 + lsn, "lsn": lsn}
    return json.dumps({"op": op, "before": before, "after": after, "source": source})


def test_debezium_unavailable_values_keep_the_previous_value_and_truncates_end_rows(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(
        {"name": "d", "change_format": "debezium", "keys": ["id"], "history": True}
    )["d"]
    gone = "__debezium_unavailable_value"
    first = [
        pg_event("r", None, {"id": 1, "body": "long text", "blob": "AAEC", "n": 1}, 10),
        pg_event("r", None, {"id": 2, "body": "second", "blob": "AwQ=", "n": 1}, 11),
        # Unchanged TOASTed text and bytea (base64 of the placeholder): kept, never written.
        pg_event(
            "u",
            None,
            {"id": 1, "body": gone, "blob": "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==", "n": 2},
            20,
        ),
        # A key change inside an update: the new key keeps the old key's body.
        pg_event("u", {"id": 2}, {"id": 3, "body": gone, "blob": "AwQ=", "n": 5}, 30),
    ]
    folder = workspace.landing / "d" / "dt=2024-01-01/hr=00"
    folder.mkdir(parents=True)
    (folder / "a.json").write_text("\n".join(first) + "\n")
    run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    paths = workspace.paths("d")
    columns = ["id", "body", "blob", "n"]
    assert table_rows(paths.final, columns) == [
        (1, "long text", "AAEC", 2),
        (3, "second", "AwQ=", 5),
    ]
    # Hour 01: an update, a truncate, an insert after it; then (late, in hour 00's folder) an
    # update ordered before the truncate: it never brings its key back.
    second = [
        pg_event("u", None, {"id": 1, "body": gone, "blob": "AAEC", "n": 3}, 40),
        pg_event("t", None, None, 50),
        pg_event("c", None, {"id": 7, "body": "after", "blob": None, "n": 1}, 60),
    ]
    folder = workspace.landing / "d" / "dt=2024-01-01/hr=01"
    folder.mkdir(parents=True)
    (folder / "b.json").write_text("\n".join(second) + "\n")
    (workspace.landing / "d" / "dt=2024-01-01/hr=00" / "late.json").write_text(
        pg_event("u", None, {"id": 3, "body": gone, "blob": "AwQ=", "n": 9}, 45) + "\n"
    )
    _, applied = run(spark, workspace, table, "2024-01-01T01", "2024-01-01T02")
    assert applied.counts["truncates_applied"] == 1
    assert table_rows(paths.final, columns) == [(7, "after", None, 1)]
    history = table_rows(paths.history, ["id", "body", "n", "_cdc_is_current", "_cdc_is_deleted"])
    assert history == [
        (1, "long text", 1, False, False),
        (1, "long text", 2, False, False),
        (1, "long text", 3, False, True),  # ended by the truncate
        (2, "second", 1, False, True),
        (3, "second", 5, False, False),
        (3, "second", 9, False, True),
        (7, "after", 1, True, False),
    ]
    # A change ordered before the truncate that lands later still stays out.
    (workspace.landing / "d" / "dt=2024-01-01/hr=01" / "later.json").write_text(
        pg_event("c", None, {"id": 8, "body": "old", "blob": None, "n": 1}, 48) + "\n"
    )
    run(spark, workspace, table, "2024-01-01T02", "2024-01-01T03")
    assert table_rows(paths.final, columns) == [(7, "after", None, 1)]
