"""`cdc run` over values a careless exporter or a half-finished upload changes on the way in.

The cases of issue 56 through the real command (`local[1]`): a time more precise than its
column, a time of day sent to a date, an offset sent to a timestamp_ntz, CSV as RFC 4180, a
CSV row cut mid-write, two JSON values on one line, JSON that Spark refuses for a named reason,
a JSON number sent to a string column, underflow to zero, invalid UTF-8 from Parquet, the Hive
default partition name, a brotli Parquet file and a varchar(n) column. A value is never altered
or dropped: it is stored as sent, or quarantined with the rule it breaks.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.formats.csv import UNTERMINATED
from spark_jobs.formats.json_lines import DUPLICATE, NAN_LITERAL, SURROGATE, TRAILING
from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, table_rows, ts

pytestmark = [pytest.mark.cli, pytest.mark.slow]

HOUR = ("--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z")
T0 = "2024-01-01T00:00:00Z"
QUARANTINE = ["_cdc_file", "_cdc_row", "_cdc_reason"]


def land(workspace: Workspace, table: str, name: str, text: str) -> Path:
    folder = Path(str(workspace.landing)) / table / "dt=2024-01-01" / "hr=00"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def counts_of(result_counts: dict[str, str]) -> tuple[str, ...]:
    return tuple(result_counts[k] for k in ("rows_read", "staged", "quarantined", "rows_written"))


def change(key: int, values: str) -> str:
    """A JSON line inserting `key` at T0 with `values` (JSON members as text)."""
    return f'{{"FLAG": "I", "ID": {key}, "TS": "{T0}", {values}}}'


def lost(column: str, raw: str, rule: str) -> str:
    return f"value out of range in {column}: '{raw}' {rule}"


SUB_MICRO = "is more precise than a timestamp holds (microseconds; never truncated)"
TIME_OF_DAY = (
    "has a time of day, which a date does not hold (never dropped); declare the column as timestamp"
)
OFFSET = (
    "has a UTC offset or time zone, which a timestamp_ntz does not hold (never dropped); "
    "declare the column as timestamp, or send times without one"
)


def test_json_times_numbers_and_lines_are_stored_as_sent_or_quarantined_by_rule(
    workspace: Workspace,
) -> None:
    """Sub-microsecond sequences no longer tie (both quarantined, final does not pick the wrong
    one); a date with a time of day and a timestamp_ntz with an offset are quarantined, their
    lossless forms kept; a number in a string column keeps its text; two objects on one line, a
    NaN, a lone surrogate, a repeated field and underflow are quarantined with their reason."""
    workspace.configure(
        {
            "name": "j",
            "file_format": "json",
            "columns": {
                "ID": "bigint",
                "V": "string",
                "TS": "timestamp",
                "D": "date",
                "N": "timestamp_ntz",
                "F": "float",
                "X": "double",
            },
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )
    land(
        workspace,
        "j",
        "a.json",
        '{"FLAG": "I", "ID": 1, "V": "later", "TS": "2024-01-01T00:00:00.0000002Z"}\n'
        '{"FLAG": "I", "ID": 2, "V": "zeros", "TS": "2024-01-01T00:00:00.1234560Z"}\n',
    )
    land(
        workspace,
        "j",
        "b.json",
        '{"FLAG": "I", "ID": 1, "V": "earlier", "TS": "2024-01-01T00:00:00.0000001Z"}\n',
    )
    lines = [
        change(3, '"D": "2024-01-01T10:00:00Z"'),
        change(4, '"D": "2024-01-01T00:00:00Z"'),
        change(5, '"N": "2024-01-01T10:00:00+05:30"'),
        change(6, '"N": "2024-01-01T10:00:00Z"'),
        change(7, '"V": 123456789012345678901234567890.123456789'),
        change(8, '"V": 1.10, "X": -0.0, "F": 0.0'),
        change(9, '"V": "a"') + change(10, '"V": "b"'),
        change(11, '"X": NaN'),
        change(12, '"V": "\\ud800"'),
        change(13, '"ID": 14'),
        change(15, '"X": 1e-400'),
        change(16, '"F": 1e-50'),
    ]
    land(workspace, "j", "c.json", "\n".join(lines) + "\n")
    result = cdc(workspace, "run", "j", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert counts_of(summary(result)) == ("15", "5", "10", "5")
    paths = workspace.paths("j")
    assert table_rows(paths.final, ["ID", "V", "TS", "D", "N", "F", "X"]) == [
        (2, "zeros", ts("2024-01-01T00:00:00.123456Z"), None, None, None, None),
        (4, None, ts(T0), date(2024, 1, 1), None, None, None),
        (6, None, ts(T0), None, datetime(2024, 1, 1, 10), None, None),
        (7, "123456789012345678901234567890.123456789", ts(T0), None, None, None, None),
        (8, "1.10", ts(T0), None, None, 0.0, -0.0),
    ]
    assert table_rows(paths.quarantine, QUARANTINE) == sorted(
        [
            ("a.json", 0, lost("TS", "2024-01-01T00:00:00.0000002Z", SUB_MICRO)),
            ("b.json", 0, lost("TS", "2024-01-01T00:00:00.0000001Z", SUB_MICRO)),
            ("c.json", 0, lost("D", "2024-01-01T10:00:00Z", TIME_OF_DAY)),
            ("c.json", 2, lost("N", "2024-01-01T10:00:00+05:30", OFFSET)),
            ("c.json", 6, TRAILING),
            ("c.json", 7, NAN_LITERAL),
            ("c.json", 8, SURROGATE),
            ("c.json", 9, DUPLICATE),
            (
                "c.json",
                10,
                lost("X", "1e-400", "is too small for a double (never rounded to zero)"),
            ),
            ("c.json", 11, lost("F", "1e-50", "is too small for a float (never rounded to zero)")),
        ],
        key=repr,
    )


def test_csv_is_rfc_4180_and_a_row_cut_mid_write_waits_for_the_completed_file(
    workspace: Workspace,
) -> None:
    """A doubled quote is one quote and a backslash a character; booleans in the exporters'
    spellings are read, any other text quarantined; a sub-microsecond time is quarantined as in
    JSON; a last row without a line end (key 12 cut to `1`) is quarantined, never applied as key
    1, and the completed file's new version applies key 12."""
    workspace.configure(
        {
            "name": "c",
            "file_format": "csv",
            "columns": {"ID": "bigint", "V": "string", "TS": "timestamp", "B": "boolean"},
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )
    t = "2024-01-01 00:00:00"
    land(
        workspace,
        "c",
        "a.csv",
        "ID,V,TS,FLAG,B\n"
        f'1,"say ""hi""",{t},I,t\n'
        f"2,C:\\dir\\,{t},I,1\n"
        f'3,"C:\\dir\\",{t},I,YES\n'
        f"4,x,{t}.1234567,I,f\n"
        f"6,w,{t},I,on\n"
        f"7,n,{t},I,No\n",
    )
    cut = land(workspace, "c", "b.csv", f"FLAG,V,TS,ID\nI,y,{t},5\nI,z,{t},1")
    result = cdc(workspace, "run", "c", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert counts_of(summary(result)) == ("8", "5", "3", "5")
    paths = workspace.paths("c")
    assert table_rows(paths.final, ["ID", "V", "B", "_cdc_file"]) == [
        (1, 'say "hi"', True, "a.csv"),
        (2, "C:\\dir\\", True, "a.csv"),
        (3, "C:\\dir\\", True, "a.csv"),
        (5, "y", None, "b.csv"),
        (7, "n", False, "a.csv"),
    ]
    quarantined = [
        ("a.csv", 3, lost("TS", f"{t}.1234567", SUB_MICRO)),
        ("a.csv", 4, "unparsable value in B: 'on' is not a valid boolean"),
        ("b.csv", 1, UNTERMINATED),
    ]
    assert table_rows(paths.quarantine, QUARANTINE) == quarantined

    cut.write_text(f"FLAG,V,TS,ID\nI,y,{t},5\nI,z,{t},12\n")  # the writer finishes
    result = cdc(workspace, "run", "c", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert table_rows(paths.final, ["ID", "V", "_cdc_file"]) == [
        (1, 'say "hi"', "a.csv"),
        (12, "z", "~0001~b.csv"),
        (2, "C:\\dir\\", "a.csv"),
        (3, "C:\\dir\\", "a.csv"),
        (5, "y", "~0001~b.csv"),
        (7, "n", "a.csv"),
    ]
    assert table_rows(paths.quarantine, QUARANTINE) == quarantined


def test_parquet_from_pandas_is_read_and_bad_values_are_refused_by_rule(
    workspace: Workspace,
) -> None:
    """A binary value declared string that is not UTF-8 never reaches final (deltalake reads
    final); a double too small for the declared float and a partition value Hive reads back as
    null are quarantined; timestamp[ns] is read, only a value past the microsecond quarantined;
    a brotli file is refused alone, saying how to write it."""
    workspace.configure(
        {
            "name": "p",
            "file_format": "parquet",
            "columns": {
                "ID": "bigint",
                "V": "string",
                "X": "float",
                "P": "string",
                "TS": "timestamp",
            },
            "keys": ["ID"],
            "sequence_by": ["TS"],
            "partition_expression": "P",
            "partition_column": "P_PART",
        }
    )
    folder = Path(str(workspace.landing)) / "p" / "dt=2024-01-01" / "hr=00"
    folder.mkdir(parents=True)
    when = datetime(2024, 1, 1, tzinfo=UTC)
    changes = pa.table(
        {
            "FLAG": ["I"] * 4,
            "ID": [1, 2, 3, 4],
            "V": pa.array([b"ok", b"bad\xff", b"ok", b"ok"], pa.binary()),
            "X": [2.5, 2.5, 1e-50, 2.5],
            "P": ["a", "a", "a", "__HIVE_DEFAULT_PARTITION__"],
            "TS": pa.array([when] * 4, pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(changes, folder / "a.parquet")
    pq.write_table(changes.slice(0, 1), folder / "brotli.parquet", compression="brotli")
    # pandas' default: naive nanoseconds; one whole microsecond, one nanosecond past it.
    nanos = pa.table(
        {
            "FLAG": ["I", "I"],
            "ID": [5, 6],
            "V": pa.array([b"ns", b"ns"], pa.binary()),
            "X": [1.0, 1.0],
            "P": ["a", "a"],
            "TS": pa.array([1704067200_000_001_000, 1704067200_000_000_001], pa.timestamp("ns")),
        }
    )
    pq.write_table(nanos, folder / "nanos.parquet")
    result = cdc(workspace, "run", "p", *HOUR, timeout=900)
    assert result.returncode == 0, result.stderr
    assert summary(result)["files_refused"] == "1"
    paths = workspace.paths("p")
    assert table_rows(paths.final, ["ID", "V", "X", "P_PART", "TS"]) == [
        (1, "ok", 2.5, "a", ts(T0)),
        (5, "ns", 1.0, "a", ts("2024-01-01T00:00:00.000001Z")),
    ]
    size = (folder / "brotli.parquet").stat().st_size
    brotli = (
        f"unreadable Parquet file ({size} bytes): compressed with BROTLI, a codec Spark has no "
        "reader for; write it with snappy, zstd or gzip (pyarrow: write_table(..., "
        "compression='zstd'))"
    )
    hive = (
        "partition_expression gives __HIVE_DEFAULT_PARTITION__ (P): Hive-style partitions read "
        "that folder name back as null; make it give another value"
    )
    assert table_rows(paths.quarantine, ["_cdc_file", "_cdc_row", "V", "_cdc_reason"]) == sorted(
        [
            (
                "a.parquet",
                1,
                "bad\ufffd",
                "invalid text in V: 'bad\ufffd' is not valid UTF-8 text (its bytes that are "
                "not are U+FFFD here)",
            ),
            (
                "a.parquet",
                2,
                "ok",
                lost("X", "1.0E-50", "is too small for a float (never rounded to zero)"),
            ),
            ("a.parquet", 3, "ok", hive),
            ("nanos.parquet", 1, "ns", lost("TS", "2024-01-01 00:00:00.000000001", SUB_MICRO)),
            ("brotli.parquet", None, None, brotli),
        ],
        key=repr,
    )


def test_a_varchar_column_is_refused_by_validate_with_the_alternative(
    workspace: Workspace,
) -> None:
    """varchar(n) and char(n) are stored as plain string: the length would be enforced nowhere."""
    workspace.config_path.write_text(
        "tables:\n"
        "  - name: v\n"
        "    file_format: json\n"
        "    columns: {ID: bigint, V: varchar(3), TS: timestamp}\n"
        "    keys: [ID]\n"
        "    sequence_by: [TS]\n"
    )
    result = cdc(workspace, "validate")
    assert result.returncode != 0
    assert (
        "type 'varchar(3)' of V declares a length, which is not enforced (the column would hold "
        "longer values): declare string" in result.stdout + result.stderr
    )


def test_a_line_too_long_for_the_driver_is_refused_alone_and_the_good_file_applied(
    workspace: Workspace,
) -> None:
    """Issue 56 case 11 at a small limit (CDC_MAX_LINE_BYTES=1 MiB, its least): a file holding
    one 1.5 MiB line (a JSON array) and one of NUL bytes without a line end (a sparse file) are
    refused alone, naming the limit and the settings; good.json beside them is applied, and the
    next run neither fails nor reports them again. The limit is found while the file is hashed:
    a file no longer than it is never searched."""
    workspace.configure(
        {
            "name": "big",
            "file_format": "json",
            "columns": {"ID": "bigint", "V": "string", "TS": "timestamp"},
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )
    array = land(workspace, "big", "array.json", "[" + "1," * 750_000 + "1]\n")
    folder = array.parent
    (folder / "sparse.json").write_bytes(b"\0" * (2 << 20))
    land(workspace, "big", "good.json", change(1, '"V": "kept"') + "\n")
    limit = {"CDC_MAX_LINE_BYTES": str(1 << 20)}
    result = cdc(workspace, "run", "big", *HOUR, timeout=900, **limit)
    assert result.returncode == 0, result.stderr
    assert summary(result)["files_refused"] == "2"
    paths = workspace.paths("big")
    assert table_rows(paths.final, ["ID", "V"]) == [(1, "kept")]

    def refused(name: str) -> str:
        size = (folder / name).stat().st_size
        return (
            f"unreadable file ({size} bytes): a line is longer than CDC_MAX_LINE_BYTES=1048576 "
            "bytes (1 MiB), more than one change row may be: one line that size can take the "
            "driver's memory and fail every run of the table. Write one change per line; for "
            "longer rows raise CDC_MAX_LINE_BYTES with CDC_SPARK_DRIVER_MEMORY"
        )

    expected = [
        ("array.json", None, refused("array.json")),
        ("sparse.json", None, refused("sparse.json")),
    ]
    assert table_rows(paths.quarantine, QUARANTINE) == expected
    again = cdc(workspace, "run", "big", *HOUR, timeout=900, **limit)
    assert again.returncode == 0, again.stderr
    assert table_rows(paths.quarantine, QUARANTINE) == expected
