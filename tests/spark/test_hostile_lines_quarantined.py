"""Hostile change lines: every bad line or value is quarantined with its reason; the rest stage.

Each test lands one hour of files mixing good rows with lines of every bad shape, runs stage
and overwrite-final, and asserts the exact quarantine rows (where, reason, raw line), the final
rows and the summary counts. Before, one such line failed the whole hour.
"""

from __future__ import annotations

import json
import re
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_pipeline.config import parse_config
from spark_jobs.formats.json_lines import DUPLICATE, NAN_LITERAL
from spark_jobs.staging import rows
from tests.helpers import Workspace, table_rows, ts
from tests.spark.steps import run

pytestmark = pytest.mark.spark

UTF8 = "not valid UTF-8 text (its bytes that are not are U+FFFD in _cdc_raw)"
NOT_OBJECT = "malformed line: not a JSON object"
RANGE = "is outside the years 0001 to 9999"
# The reason for a sequence value past max_sequence_ahead names the stage run's time.
AHEAD = r"sequence value too far ahead in {column}: '{value}' is more than max_sequence_ahead 7d after the stage run at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


@pytest.fixture(autouse=True)
def read_columns_are_the_frames(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each read's columns as its reader states them (`ChangeRead.columns`, what stage uses
    instead of asking Spark) must be the columns Spark gives its frame, for every shape here."""
    checked: list[list[str]] = []
    original = rows.type_read

    def checking(context: Any, interval: Any, read: Any, *args: Any, **kwargs: Any) -> Any:
        if read.columns is not None:
            assert read.columns == read.frame.columns
            checked.append(read.columns)
        return original(context, interval, read, *args, **kwargs)

    monkeypatch.setattr(rows, "type_read", checking)
    return checked


def land_lines(workspace: Workspace, table: str, name: str, lines: list[str | bytes]) -> None:
    """One file of raw lines (bytes kept as they are) in the hour folder 2024-01-01T00."""
    folder = workspace.landing / table / "dt=2024-01-01" / "hr=00"
    folder.mkdir(parents=True, exist_ok=True)
    data = b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines)
    (folder / name).write_bytes(data)


def quarantine(path: Path) -> list[tuple[Any, ...]]:
    """(file, row, reason, raw line) of every quarantined row, in file and row order."""
    rows = table_rows(path, ["_cdc_file", "_cdc_row", "_cdc_reason", "_cdc_raw"])
    return sorted(rows, key=lambda r: (r[0], r[1]))


def assert_reasons(found: list[tuple[Any, ...]], expected: list[tuple[Any, ...]]) -> None:
    """Rows equal; an expected reason given as re.Pattern must match the whole reason."""
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        if isinstance(want[2], re.Pattern):
            assert want[2].fullmatch(got[2]), got
            assert (got[0], got[1], got[3]) == (want[0], want[1], want[3])
        else:
            assert got == want


def json_line(**values: Any) -> str:
    return json.dumps(values)


FLAT = {
    "name": "t",
    "file_format": "json",
    "columns": {
        "ID": "bigint",
        "AMOUNT": "decimal(5,2)",
        "N": "int",
        "TS": "timestamp",
        "D": "date",
    },
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
T0 = "2024-01-01 00:00:00"


def test_flat_json_lines_of_any_shape_are_quarantined_and_the_rest_staged(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(FLAT)["t"]
    huge = '{"FLAG": "I", "ID": 9, "N": "' + "x" * 1_000_000  # a 1 MB line, never closed
    lines: list[str | bytes] = [
        json_line(FLAG="I", ID=1, AMOUNT=1.5, N=1, TS=T0, D="2024-01-01"),
        "[1, 2]",
        "42",
        '"just a string"',
        "null",
        "true",
        json_line(FLAG="I", ID={"a": 1}, TS=T0),
        json_line(FLAG="I", ID=7, N=[1, 2], TS=T0),
        '{"FLAG": "I", "ID": {{[[',
        huge,
        b'{"FLAG": "I", "ID": 10, "TS": "2024-01-01 00:00:00", "N": "caf\xe9"}',
        json_line(FLAG="I", ID=11, TS="10000-01-01 00:00:00"),
        json_line(FLAG="I", ID=12, TS=T0, D="-0001-06-01"),
        json_line(FLAG="I", ID=13, AMOUNT=12345.678, TS=T0),
        json_line(FLAG="I", ID=14, N=99999999999, TS=T0),
        '{"FLAG": "I", "ID": 99999999999999999999, "TS": "2024-01-01 00:00:00"}',
        json_line(FLAG="I", ID=16, TS="9999-01-01 00:00:00"),
        '{"FLAG": "I", "ID": 17, "ID": 18, "TS": "2024-01-01 00:00:00"}',
        json_line(FLAG="U", ID=1, AMOUNT=2.25, N=2, TS="2024-01-01 00:00:01", D="2024-01-02"),
        json_line(FLAG="I", ID=2, AMOUNT=0.5, N=3, TS=T0, D="2024-01-03"),
    ]
    land_lines(workspace, "t", "a.json", lines)
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    counts = staged.counts
    assert (counts["rows_read"], counts["staged"], counts["quarantined"]) == (20, 3, 17)
    paths = workspace.paths("t")
    assert_reasons(
        quarantine(paths.quarantine),
        [
            ("a.json", 1, NOT_OBJECT, "[1, 2]"),
            ("a.json", 2, NOT_OBJECT, "42"),
            ("a.json", 3, NOT_OBJECT, '"just a string"'),
            ("a.json", 4, NOT_OBJECT, "null"),
            ("a.json", 5, NOT_OBJECT, "true"),
            ("a.json", 6, "unparsable value in ID: '{\"a\":1}' is not a valid bigint", None),
            ("a.json", 7, "unparsable value in N: '[1,2]' is not a valid int", None),
            ("a.json", 8, NOT_OBJECT, '{"FLAG": "I", "ID": {{[['),
            ("a.json", 9, NOT_OBJECT, huge),
            (
                "a.json",
                10,
                f"malformed line: {UTF8}",
                '{"FLAG": "I", "ID": 10, "TS": "2024-01-01 00:00:00", "N": "caf\ufffd"}',
            ),
            ("a.json", 11, f"value out of range in TS: '10000-01-01 00:00:00' {RANGE}", None),
            ("a.json", 12, f"value out of range in D: '-0001-06-01' {RANGE}", None),
            (
                "a.json",
                13,
                "unparsable value in AMOUNT: '12345.678' is not a valid decimal(5,2)",
                None,
            ),
            ("a.json", 14, "unparsable value in N: '99999999999' is not a valid int", None),
            (
                "a.json",
                15,
                "unparsable value in ID: '99999999999999999999' is not a valid bigint",
                None,
            ),
            (
                "a.json",
                16,
                re.compile(AHEAD.format(column="TS", value="9999-01-01 00:00:00")),
                None,
            ),
            ("a.json", 17, DUPLICATE, lines[17]),
        ],
    )
    assert table_rows(paths.final, ["ID", "AMOUNT", "N", "TS", "D"]) == [
        (1, Decimal("2.25"), 2, ts("2024-01-01T00:00:01Z"), date(2024, 1, 2)),
        (2, Decimal("0.50"), 3, ts("2024-01-01T00:00:00Z"), date(2024, 1, 3)),
    ]


CSV = {
    "name": "c",
    "file_format": "csv",
    "columns": {"ID": "bigint", "V": "string", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def test_csv_rows_that_do_not_fit_their_header_are_quarantined_with_the_line(
    spark, workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    table = workspace.configure(CSV)["c"]
    land_lines(
        workspace,
        "c",
        "a.csv",
        [
            "ID,V,TS,FLAG",
            f'1,"a,b",{T0},I',
            f"2,b,{T0},I,extra",
            f"3,c,{T0}",
            b"4,caf\xe9,2024-01-01 00:00:00,I",
            "",  # blank lines are skipped, as Spark's CSV reader does
            "5,e,10000-01-01 00:00:00,I",
            "6,f,9999-01-01 00:00:00,I",
        ],
    )
    # A header without a declared column that rows may lack: null there, with a warning.
    land_lines(workspace, "c", "b.csv", ["TS,FLAG,ID", f"{T0},I,8"])
    # A header without the key column: no row of the file can be applied.
    land_lines(workspace, "c", "c.csv", ["V,TS,FLAG", f"x,{T0},I"])
    # The case: a header missing V over rows that still carry it (a shift before).
    land_lines(workspace, "c", "d.csv", ["ID,TS,FLAG", "9,v,2024-01-01 01:01:00,I"])
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    counts = staged.counts
    assert (counts["rows_read"], counts["staged"], counts["quarantined"]) == (9, 2, 7)
    paths = workspace.paths("c")
    assert_reasons(
        quarantine(paths.quarantine),
        [
            ("a.csv", 1, "row has 5 fields, the header has 4", f"2,b,{T0},I,extra"),
            ("a.csv", 2, "row has 3 fields, the header has 4", f"3,c,{T0}"),
            ("a.csv", 3, f"row is {UTF8}", f"4,caf\ufffd,{T0},I"),
            ("a.csv", 4, f"value out of range in TS: '10000-01-01 00:00:00' {RANGE}", None),
            ("a.csv", 5, re.compile(AHEAD.format(column="TS", value="9999-01-01 00:00:00")), None),
            ("c.csv", 0, "the file's header has no column ID (a key column)", f"x,{T0},I"),
            ("d.csv", 0, "row has 4 fields, the header has 3", "9,v,2024-01-01 01:01:00,I"),
        ],
    )
    assert table_rows(paths.final, ["ID", "V", "TS"]) == [
        (1, "a,b", ts("2024-01-01T00:00:00Z")),
        (8, None, ts("2024-01-01T00:00:00Z")),
    ]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "header" in line]
    assert warnings == [
        "warning: table c: dt=2024-01-01/hr=00/b.csv: the header has no column V; its rows "
        "read null there",
        "warning: table c: dt=2024-01-01/hr=00/d.csv: the header has no column V; its rows "
        "read null there",
    ]


def test_debezium_events_of_any_shape_are_quarantined_and_the_rest_staged(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure({"name": "d", "change_format": "debezium", "keys": ["id"]})["d"]
    lines: list[str | bytes] = [
        '{"op": "c", "after": {"id": 1, "name": "a"}, "source": {"ts_ms": 1000, "lsn": 10}}',
        "[1]",
        "42",
        '{"op": {"x": 1}, "after": {"id": 2}}',
        '{"op": "c", "after": [1, 2], "source": {"ts_ms": 1000}}',
        '{"op": "u", "before": "x", "after": {"id": 1}, "source": {"ts_ms": 1000}}',
        '{"op": "c", "after": {"id": 3}, "source": [1]}',
        '{"op": "c", "after": {"id": 3}, "source": {"ts_ms": 1e30}}',
        # Year 9999 in the source clock: Debezium's ts_ms is a time too (max_sequence_ahead).
        '{"op": "c", "after": {"id": 4}, "source": {"ts_ms": 253402300799000}}',
        # A schema that is not Debezium's shape gives no types: the values' own are used.
        '{"schema": {"fields": 5}, "payload": {"op": "c", "after": {"id": 5, "name": "e"}, '
        '"source": {"ts_ms": 2000}}}',
        b'{"op": "c", "after": {"id": 6, "name": "\xff"}, "source": {"ts_ms": 1000}}',
        "null",
        # Keys that cannot be columns are ignored (and counted): a technical name, a name that
        # equals another ignoring case, a name that is not an identifier.
        '{"op": "c", "after": {"id": 7, "_cdc_row": 5, "ID": 9, "a b": 1}, '
        '"source": {"ts_ms": 3000}}',
    ]
    land_lines(workspace, "d", "a.json", lines)
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    counts = staged.counts
    assert (counts["rows_read"], counts["staged"], counts["quarantined"]) == (12, 3, 9)
    assert (counts["tombstones_skipped"], counts["undeclared_columns_ignored"]) == (1, 3)
    debezium = "malformed Debezium event: "
    assert_reasons(
        quarantine(workspace.paths("d").quarantine),
        [
            ("a.json", 1, NOT_OBJECT, "[1]"),
            ("a.json", 2, NOT_OBJECT, "42"),
            ("a.json", 3, debezium + "op is not a JSON string", lines[3]),
            ("a.json", 4, debezium + "after is not a JSON object", lines[4]),
            ("a.json", 5, debezium + "before is not a JSON object", lines[5]),
            ("a.json", 6, debezium + "source is not a JSON object", lines[6]),
            ("a.json", 7, debezium + "source.ts_ms is not a valid bigint", lines[7]),
            (
                "a.json",
                8,
                re.compile(AHEAD.format(column="_cdc_source_ts_ms", value="253402300799000")),
                None,
            ),
            (
                "a.json",
                10,
                f"malformed line: {UTF8}",
                '{"op": "c", "after": {"id": 6, "name": "\ufffd"}, "source": {"ts_ms": 1000}}',
            ),
        ],
    )
    final = workspace.paths("d").final
    assert table_rows(final, ["id", "name"]) == [(1, "a"), (5, "e"), (7, None)]


def test_wal2json_lines_of_any_shape_are_quarantined_and_the_rest_staged(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure({"name": "w", "change_format": "wal2json", "keys": ["id"]})["w"]

    def insert(id_: int, value: str, lsn: str) -> str:
        columns = [
            {"name": "id", "type": "integer", "value": id_},
            {"name": "v", "type": "text", "value": value},
        ]
        return json.dumps({"action": "I", "columns": columns, "lsn": lsn})

    lines: list[str | bytes] = [
        insert(1, "a", "0/10"),
        '{"action": "I", "columns": {"id": 1}}',
        '{"action": "I", "columns": [1, 2]}',
        '{"action": "I", "columns": [{"name": "id", "value": 2}, {"name": "id", "value": 3}]}',
        '{"action": {"x": 1}}',
        '{"action": "D", "identity": "x"}',
        '{"action": "B"}',
        '"a string"',
        insert(2, "b", "0/20"),
    ]
    land_lines(workspace, "w", "a.json", lines)
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    counts = staged.counts
    assert (counts["rows_read"], counts["staged"], counts["quarantined"]) == (8, 2, 6)
    assert counts["transaction_markers"] == 1
    columns = "malformed wal2json line: columns is not an array of objects with distinct names"
    assert_reasons(
        quarantine(workspace.paths("w").quarantine),
        [
            ("a.json", 1, columns, lines[1]),
            ("a.json", 2, columns, lines[2]),
            ("a.json", 3, columns, lines[3]),
            ("a.json", 4, "malformed wal2json line: action is not a JSON string", lines[4]),
            (
                "a.json",
                5,
                "malformed wal2json line: identity is not an array of objects with distinct names",
                lines[5],
            ),
            ("a.json", 7, NOT_OBJECT, lines[7]),
        ],
    )
    assert table_rows(workspace.paths("w").final, ["id", "v"]) == [(1, "a"), (2, "b")]


def test_snapshot_extract_with_bad_lines_stages_the_good_rows(spark, workspace: Workspace) -> None:
    row = {
        "name": "s",
        "file_format": "json",
        "change_format": "snapshot",
        "columns": {"ID": "bigint", "V": "string", "D": "date"},
        "keys": ["ID"],
    }
    table = workspace.configure(row)["s"]
    lines: list[str | bytes] = [
        json_line(ID=1, V="a", D="2024-01-01"),
        "[1]",
        json_line(ID=2, V="b", D="10000-01-01"),
        json_line(ID=3, V="c", D="2024-01-02"),
    ]
    land_lines(workspace, "s", "a.json", lines)
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    counts = staged.counts
    assert (counts["inserted"], counts["quarantined"]) == (2, 2)
    assert quarantine(workspace.paths("s").quarantine) == [
        ("a.json", 1, NOT_OBJECT, "[1]"),
        ("a.json", 2, f"value out of range in D: '10000-01-01' {RANGE}", None),
    ]
    assert table_rows(workspace.paths("s").final, ["ID", "V", "D"]) == [
        (1, "a", date(2024, 1, 1)),
        (3, "c", date(2024, 1, 2)),
    ]


def test_max_sequence_ahead_is_a_duration_or_null() -> None:
    row = {**CSV, "max_sequence_ahead": "7x"}
    problems = [str(p) for p in parse_config({"tables": [row]}).problems]
    assert len(problems) == 1 and "max_sequence_ahead: '7x' is not a duration" in problems[0]
    assert parse_config({"tables": [CSV]}).tables["c"].max_sequence_ahead == "7d"
    unbounded = parse_config({"tables": [{**CSV, "max_sequence_ahead": None}]})
    assert unbounded.tables["c"].max_sequence_ahead is None


NUMBERS = {
    "name": "n",
    "file_format": "json",
    "columns": {"ID": "bigint", "X": "double", "F": "float", "N": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
NOT_FINITE = "is not a finite number (NaN and infinities are refused)"


def test_json_numbers_out_of_range_are_quarantined_not_staged_as_infinity_or_null(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(NUMBERS)["n"]
    head = '{"FLAG": "I", "TS": "2024-01-01 00:00:00", '
    lines: list[str | bytes] = [
        head + '"ID": 1, "X": 1.5, "F": 2.5, "N": 1}',
        head + '"ID": 2, "X": 1e999}',
        head + '"ID": 3, "X": -1e999}',
        head + '"ID": 4, "X": NaN}',  # not JSON
        head + '"ID": 5, "X": "NaN"}',
        head + '"ID": 6, "X": "-Infinity"}',
        head + '"ID": 7, "F": 1e300}',  # a double beyond a float's range
        head + '"ID": 8, "N": 1e999}',
        head + '"ID": 9, "N": 2147483648}',
        head + '"ID": 1e999}',
        head + '"ID": 9223372036854775808}',
        '{"FLAG": "D", "TS": "2024-01-01 00:00:00", "ID": 1, "X": "Infinity"}',
        head + '"ID": 13, "X": 1.7976931348623157e308, "F": 3.4e38, "N": -2147483648}',
    ]
    land_lines(workspace, "n", "a.json", lines)
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (staged.counts["staged"], staged.counts["quarantined"]) == (2, 11)
    paths = workspace.paths("n")
    assert_reasons(
        quarantine(paths.quarantine),
        [
            # A number is quoted as the line wrote it.
            ("a.json", 1, f"value out of range in X: '1e999' {NOT_FINITE}", None),
            ("a.json", 2, f"value out of range in X: '-1e999' {NOT_FINITE}", None),
            ("a.json", 3, NAN_LITERAL, lines[3]),
            ("a.json", 4, f"value out of range in X: 'NaN' {NOT_FINITE}", None),
            ("a.json", 5, f"value out of range in X: '-Infinity' {NOT_FINITE}", None),
            ("a.json", 6, f"value out of range in F: '1e300' {NOT_FINITE}", None),
            ("a.json", 7, "unparsable value in N: '1e999' is not a valid int", None),
            ("a.json", 8, "unparsable value in N: '2147483648' is not a valid int", None),
            ("a.json", 9, "unparsable value in ID: '1e999' is not a valid bigint", None),
            (
                "a.json",
                10,
                "unparsable value in ID: '9223372036854775808' is not a valid bigint",
                None,
            ),
            ("a.json", 11, f"value out of range in X: 'Infinity' {NOT_FINITE}", None),
        ],
    )
    assert table_rows(paths.final, ["ID", "X", "F", "N"]) == [
        (1, 1.5, 2.5, 1),
        (13, 1.7976931348623157e308, pytest.approx(3.4e38, rel=1e-6), -2147483648),
    ]


def test_a_decimal_that_does_not_fit_its_scale_is_quarantined_never_rounded(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(
        {
            "name": "m",
            "file_format": "csv",
            "columns": {
                "ID": "bigint",
                "AMOUNT": "decimal(10,2)",
                "NOTE": "string",
                "N": "int",
                "TS": "timestamp",
            },
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )["m"]
    land_lines(
        workspace,
        "m",
        "a.csv",
        [
            "ID,AMOUNT,NOTE,N,TS,FLAG",
            f"1,1.005,a,1,{T0},I",  # three decimals into a scale of 2
            f"2,12345678.999,b,1,{T0},I",
            f"3,1.50,c,1,{T0},I",  # fits: 1.50
            f'4,2.1,"",,{T0},I',  # a quoted empty text is the empty string, an unquoted null
            f'5,3,,"",{T0},I',  # a quoted empty number is null, as an unquoted one
        ],
    )
    staged, _ = run(spark, workspace, table, "2024-01-01T00", "2024-01-01T01")
    assert (staged.counts["staged"], staged.counts["quarantined"]) == (3, 2)
    reason = "has more decimal places than decimal(10,2) holds (never rounded)"
    assert quarantine(workspace.paths("m").quarantine) == [
        ("a.csv", 0, f"value out of range in AMOUNT: '1.005' {reason}", None),
        ("a.csv", 1, f"value out of range in AMOUNT: '12345678.999' {reason}", None),
    ]
    assert table_rows(workspace.paths("m").final, ["ID", "AMOUNT", "NOTE", "N"]) == [
        (3, Decimal("1.50"), "c", 1),
        (4, Decimal("2.10"), "", None),
        (5, Decimal("3.00"), None, None),
    ]
