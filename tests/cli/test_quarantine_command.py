"""`cdc quarantine TABLE`: rows per reason and hour, sample rows with the refused values and
where they came from (hour, file, `_cdc_row`); no Spark. The quarantine here is written the
way stage writes it (data columns as text, `_cdc_raw`, `_cdc_reason`, the arrival columns,
partitioned by `_cdc_batch`); tests/e2e/test_airflow_ops.py reads one a real stage wrote."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.cli.cdc import cdc
from tests.cli.test_status_health import ROW  # the same one-table config
from tests.helpers import Workspace

# No Spark: classic mode starts no JVM, and no Connect server is needed for these processes.
pytestmark = [pytest.mark.cli, pytest.mark.classic_only]

SCHEMA = pa.schema(
    [
        ("ID", pa.string()),
        ("TS", pa.string()),
        ("_cdc_raw", pa.string()),
        ("_cdc_reason", pa.string()),
        ("_cdc_batch", pa.string()),
        ("_cdc_file", pa.string()),
        ("_cdc_row", pa.int32()),
    ]
)


def quarantined(
    rows: list[tuple[str | None, str | None, str | None, str, str, str, int]],
) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, row, strict=True)) for row in rows], SCHEMA)


def write_quarantine(workspace: Workspace) -> None:
    path = str(workspace.paths("t").quarantine)
    first = [
        (None, "2024-01-01 00:00:01", None, "null key column ID", "2024-01-01T00", "a.csv", 3),
        (
            "7",
            "yesterday",
            None,
            "unparsable value in TS: 'yesterday'",
            "2024-01-01T00",
            "a.csv",
            1,
        ),
    ]
    second = [
        (None, None, '{"ID": 8, "TS": ', "malformed JSON line", "2024-01-01T01", "b.json", 0),
        (None, "2024-01-01 01:00:00", None, "null key column ID", "2024-01-01T01", "b.json", 4),
        (None, "x" * 300, None, "null key column ID", "2024-01-01T01", "b.json", 2),
    ]
    for rows in (first, second):
        write_deltalake(path, quarantined(rows), mode="append", partition_by=["_cdc_batch"])


def test_counts_per_reason_and_hour_and_samples_with_their_source(workspace: Workspace) -> None:
    workspace.configure(ROW)
    write_quarantine(workspace)
    result = cdc(workspace, "quarantine", "t")
    assert result.returncode == 0, result.stderr
    long = repr("x" * 200) + "... (300 chars)"
    assert result.stdout.splitlines() == [
        "quarantine t: rows=5 reasons=3",
        "  3 x null key column ID",
        "  1 x malformed JSON line",
        "  1 x unparsable value in TS: 'yesterday'",
        "quarantine t: per hour, newest first:",
        "  2024-01-01T01: 2 x null key column ID",
        "  2024-01-01T01: 1 x malformed JSON line",
        "  2024-01-01T00: 1 x null key column ID",
        "  2024-01-01T00: 1 x unparsable value in TS: 'yesterday'",
        "quarantine t: 5 sample row(s) of the newest 2 hour(s):",
        "  hour 2024-01-01T01, file b.json, _cdc_row 0: malformed JSON line: ID=null, TS=null, "
        """raw='{"ID": 8, "TS": '""",
        f"  hour 2024-01-01T01, file b.json, _cdc_row 2: null key column ID: ID=null, TS={long}",
        "  hour 2024-01-01T01, file b.json, _cdc_row 4: null key column ID: ID=null, "
        "TS='2024-01-01 01:00:00'",
        "  hour 2024-01-01T00, file a.csv, _cdc_row 1: unparsable value in TS: 'yesterday': "
        "ID='7', TS='yesterday'",
        "  hour 2024-01-01T00, file a.csv, _cdc_row 3: null key column ID: ID=null, "
        "TS='2024-01-01 00:00:01'",
    ]


def test_json_and_the_newest_hours_only(workspace: Workspace) -> None:
    workspace.configure(ROW)
    write_quarantine(workspace)
    result = cdc(workspace, "quarantine", "t", "--hours", "1", "--samples", "1", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)["quarantine"]
    assert document["rows"] == 5
    assert document["by_reason"][0] == {"reason": "null key column ID", "rows": 3}
    assert document["by_batch"][-1] == {
        "batch": "2024-01-01T00",
        "reason": "unparsable value in TS: 'yesterday'",
        "rows": 1,
    }
    assert document["samples"] == [
        {
            "batch": "2024-01-01T01",
            "file": "b.json",
            "row": 0,
            "reason": "malformed JSON line",
            "values": {"ID": None, "TS": None},
            "raw": '{"ID": 8, "TS": ',
        }
    ]


def test_nothing_held_an_unknown_table_and_a_damaged_log(workspace: Workspace) -> None:
    workspace.configure(ROW)
    empty = cdc(workspace, "quarantine", "t")
    assert (empty.returncode, empty.stdout) == (0, "quarantine t: rows=0\n")
    unknown = cdc(workspace, "quarantine", "nope")
    assert unknown.returncode == 2
    assert unknown.stderr.strip().splitlines()[-1] == (
        "error: quarantine: table nope: not in the config table (valid tables: t)"
    )
    write_quarantine(workspace)
    log = workspace.paths("t").quarantine / "_delta_log" / "00000000000000000001.json"
    log.write_text('{"add": {"path": "x')
    damaged = cdc(workspace, "quarantine", "t")
    assert damaged.returncode == 1
    line = damaged.stderr.strip().splitlines()[-1]
    assert line.startswith("error: quarantine t: ")
    assert "version 1, _delta_log/00000000000000000001.json is damaged" in line
