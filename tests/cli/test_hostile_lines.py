"""`cdc run` over an hour holding hostile lines: exit 0, bad rows counted, good rows in final.

The issue's cases through the real command (`local[1]`): a JSON line that is an array or a
bare number, a timestamp in year 10000, a CSV row with a field too many, a header missing a
column. Before, each failed the whole hour on every retry.
"""

from __future__ import annotations

import pytest

from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, table_rows, ts

pytestmark = [pytest.mark.cli, pytest.mark.slow]

COLUMNS = {"ID": "bigint", "V": "string", "TS": "timestamp"}
HOUR = ("--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z")


def land(workspace: Workspace, table: str, name: str, text: str) -> None:
    folder = workspace.landing / table / "dt=2024-01-01" / "hr=00"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def counts_of(result_counts: dict[str, str]) -> tuple[str, ...]:
    return tuple(result_counts[k] for k in ("rows_read", "staged", "quarantined", "rows_written"))


def test_json_array_number_and_year_10000_lines_do_not_hold_back_the_hour(
    workspace: Workspace,
) -> None:
    workspace.configure(
        {
            "name": "j",
            "file_format": "json",
            "columns": COLUMNS,
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )
    land(
        workspace,
        "j",
        "a.json",
        '{"FLAG": "I", "ID": 1, "V": "a", "TS": "2024-01-01 00:00:00"}\n'
        "[1, 2]\n"
        "42\n"
        '{"FLAG": "I", "ID": 2, "V": "b", "TS": "10000-01-01 00:00:00"}\n'
        '{"FLAG": "U", "ID": 1, "V": "a2", "TS": "2024-01-01 00:00:01"}\n'
        '{"FLAG": "I", "ID": 3, "V": "c", "TS": "2024-01-01 00:00:00"}\n',
    )
    result = cdc(workspace, "run", "j", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("run j [2024-01-01T00:00:00Z, 2024-01-01T01:00:00Z): ")
    assert counts_of(summary(result)) == ("6", "3", "3", "2")
    assert table_rows(workspace.paths("j").final, ["ID", "V", "TS"]) == [
        (1, "a2", ts("2024-01-01T00:00:01Z")),
        (3, "c", ts("2024-01-01T00:00:00Z")),
    ]
    assert table_rows(workspace.paths("j").quarantine, ["_cdc_row", "_cdc_reason"]) == [
        (1, "malformed line: not a JSON object"),
        (2, "malformed line: not a JSON object"),
        (3, "value out of range in TS: '10000-01-01 00:00:00' is outside the years 0001 to 9999"),
    ]


def test_csv_year_10000_extra_field_and_short_header_do_not_hold_back_the_hour(
    workspace: Workspace,
) -> None:
    workspace.configure(
        {
            "name": "c",
            "file_format": "csv",
            "columns": COLUMNS,
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )
    land(
        workspace,
        "c",
        "a.csv",
        "ID,V,TS,FLAG\n"
        "1,a,2024-01-01 00:00:00,I\n"
        "2,b,10000-01-01 00:00:00,I\n"
        "3,c,2024-01-01 00:00:00,I,extra\n",
    )
    land(
        workspace, "c", "b.csv", "ID,TS,FLAG\n4,2024-01-01 00:00:00,I\n5,v,2024-01-01 01:01:00,I\n"
    )
    result = cdc(workspace, "run", "c", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("run c [2024-01-01T00:00:00Z, 2024-01-01T01:00:00Z): ")
    assert counts_of(summary(result)) == ("5", "2", "3", "2")
    assert (
        "warning: table c: dt=2024-01-01/hr=00/b.csv: the header has no column V; its rows read "
        "null there" in result.stderr.splitlines()
    )
    assert table_rows(workspace.paths("c").final, ["ID", "V", "TS"]) == [
        (1, "a", ts("2024-01-01T00:00:00Z")),
        (4, None, ts("2024-01-01T00:00:00Z")),
    ]
    assert table_rows(
        workspace.paths("c").quarantine, ["_cdc_file", "_cdc_row", "_cdc_reason"]
    ) == [
        (
            "a.csv",
            1,
            "value out of range in TS: '10000-01-01 00:00:00' is outside the years 0001 to 9999",
        ),
        ("a.csv", 2, "row has 5 fields, the header has 4"),
        ("b.csv", 1, "row has 4 fields, the header has 3"),
    ]


def test_text_times_with_offsets_and_a_too_deep_line_are_quarantined_with_their_reason(
    workspace: Workspace,
) -> None:
    """A text sequence value with a UTC offset is refused (10:00+02:00 is before 09:30+01:00 in
    time, after it as text); a line nested 10,000 deep says so; the rest of the hour applies."""
    workspace.configure({"name": "j", "file_format": "json", "keys": ["ID"], "sequence_by": ["TS"]})
    deep = "[" * 10_000 + "]" * 10_000
    land(
        workspace,
        "j",
        "a.json",
        '{"FLAG": "I", "ID": 1, "V": "a", "TS": "2024-01-01T10:00:00+02:00"}\n'
        '{"FLAG": "U", "ID": 1, "V": "b", "TS": "2024-01-01T09:30:00+01:00"}\n'
        f'{{"FLAG": "I", "ID": 2, "V": "c", "TS": "2024-01-01T09:30:00Z", "X": {deep}}}\n'
        '{"FLAG": "I", "ID": 3, "V": "d", "TS": "2024-01-01T09:30:00Z"}\n'
        '{"FLAG": "I", "ID": 4, "V": "e", "TS": "2024-01-01T09:30:00+00:00"}\n',
    )
    result = cdc(workspace, "run", "j", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert counts_of(summary(result)) == ("5", "2", "3", "2")
    assert table_rows(workspace.paths("j").final, ["ID", "V", "TS"]) == [
        (3, "d", "2024-01-01T09:30:00Z"),
        (4, "e", "2024-01-01T09:30:00+00:00"),
    ]
    offset = (
        "ambiguous sequence value in TS: '{}' is a time with a UTC offset in a text sequence_by "
        "column: text order is not time order across offsets; declare the column as timestamp "
        "in columns (or send UTC times)"
    )
    assert table_rows(workspace.paths("j").quarantine, ["_cdc_row", "_cdc_reason"]) == [
        (0, offset.format("2024-01-01T10:00:00+02:00")),
        (1, offset.format("2024-01-01T09:30:00+01:00")),
        (2, "malformed line: nested deeper than 1000 levels (Spark's JSON parser limit)"),
    ]


def test_a_sequence_by_column_the_data_lacks_fails_the_first_run_once_naming_it(
    workspace: Workspace,
) -> None:
    """Without declared columns, validate cannot know the data's columns: the first run checks
    keys and sequence_by against them, exit 2 before anything is written (every row was
    quarantined as 'null sequence_by column', run after run); fixed, the same hour applies."""
    row = {"name": "j", "file_format": "json", "keys": ["ID"], "sequence_by": ["TSX"]}
    workspace.configure(row)
    land(
        workspace, "j", "a.json", '{"FLAG": "I", "ID": 1, "V": "a", "TS": "2024-01-01 00:00:00"}\n'
    )
    result = cdc(workspace, "run", "j", *HOUR, timeout=900)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: run: table j: sequence_by: TSX is not a column of the data "
        "(its columns: ID, TS, V); name columns the change files carry"
    )
    assert not (workspace.paths("j").staging / "_delta_log").exists()
    workspace.configure({**row, "sequence_by": ["TS"]})
    result = cdc(workspace, "run", "j", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert table_rows(workspace.paths("j").final, ["ID", "V", "TS"]) == [
        (1, "a", "2024-01-01 00:00:00")
    ]
