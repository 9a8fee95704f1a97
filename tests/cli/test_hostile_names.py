"""Hostile file names through the real `cdc` command: every landed name is read as exactly that
file (no globbing, no URL encoding), a name Spark cannot address is quarantined alone, and
checksum sidecars never influence a read."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, exists, table_rows

pytestmark = [pytest.mark.cli, pytest.mark.slow]

JSON_TABLE = {
    "name": "j",
    "file_format": "json",
    "columns": {"ID": "bigint", "VALUE": "string", "CDC_TIMESTAMP": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["CDC_TIMESTAMP"],
}
PARQUET_TABLE = {"name": "p", "file_format": "parquet", "keys": ["ID"], "sequence_by": ["TS"]}
HOUR = ("--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z")
# name -> the ID its one change inserts; each name is read as exactly that file.
NAMES = {
    "a[1].json": 50,
    "a1.json": 51,
    "b{x,y}.json": 52,
    "bx.json": 53,
    "st*r.json": 54,
    "q?.json": 55,
    "sp ace.json": 56,
    "pct%41.json": 57,
    "plus+x.json": 58,
    "hash#x.json": 59,
    "caret^x.json": 60,
    "tab\tx.json": 61,
    "ünï.json": 62,
}
REFUSED = {"x:00.json": 70, "back\\slash.json": 71}


def line(id_: int, value: str, second: int = 0) -> str:
    change = {
        "FLAG": "I",
        "ID": id_,
        "VALUE": value,
        "CDC_TIMESTAMP": f"2024-01-01 00:00:{second:02d}",
    }
    return json.dumps(change) + "\n"


def hadoop_checksum(content: bytes, bytes_per_sum: int = 512) -> bytes:
    """A Hadoop `.name.crc` sidecar of `content`, as Hadoop's local file system writes it."""
    sums = b"".join(
        zlib.crc32(content[i : i + bytes_per_sum]).to_bytes(4, "big")
        for i in range(0, len(content), bytes_per_sum)
    )
    return b"crc\x00" + bytes_per_sum.to_bytes(4, "big") + sums


def quarantine(workspace: Workspace, table: str) -> list[dict[str, Any]]:
    path = workspace.paths(table).quarantine
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if exists(path) else []


def test_every_landed_name_is_read_as_exactly_that_file(workspace: Workspace) -> None:
    workspace.configure(JSON_TABLE)
    hour = workspace.landing / "j" / "dt=2024-01-01" / "hr=00"
    hour.mkdir(parents=True)
    for name, id_ in {**NAMES, **REFUSED}.items():
        (hour / name).write_text(line(id_, "v1"))
    # A Hadoop checksum sidecar beside a file (valid now, stale once the file is rewritten
    # below): never read, never verified.
    (hour / "good.json").write_text(line(80, "v1"))
    (hour / ".good.json.crc").write_bytes(hadoop_checksum((hour / "good.json").read_bytes()))
    # Under the C locale too: the JVM reads file names as UTF-8 whatever the locale.
    result = cdc(workspace, "run", "j", *HOUR, LC_ALL="C", LANG="C")
    assert result.returncode == 0, result.stderr
    counts = summary(result)
    assert (counts["staged"], counts["files_refused"]) == (str(len(NAMES) + 1), "2")
    expected = sorted([(id_, "v1") for id_ in NAMES.values()] + [(80, "v1")])
    assert table_rows(workspace.paths("j").final, ["ID", "VALUE"]) == expected
    files = {
        r["_cdc_file"]
        for r in DeltaTable(str(workspace.paths("j").staging)).to_pyarrow_table().to_pylist()
    }
    assert files == {*NAMES, "good.json"}
    refused = {r["_cdc_raw"]: r["_cdc_reason"] for r in quarantine(workspace, "j")}
    assert set(refused) == {f"dt=2024-01-01/hr=00/{name}" for name in REFUSED}
    assert (
        "has a colon, which Spark and Hadoop cannot read"
        in refused["dt=2024-01-01/hr=00/x:00.json"]
    )

    # New content under the same names is staged as their next versions; the sidecar now
    # disagrees with good.json's content too.
    for name in ("sp ace.json", "a[1].json", "pct%41.json", "plus+x.json", "good.json"):
        id_ = NAMES.get(name, 80)
        (hour / name).write_text(line(id_, "v2", 1))
    again = cdc(workspace, "run", "j", *HOUR)
    assert again.returncode == 0, again.stderr
    assert summary(again)["new_files"] == "5"
    changed = {
        NAMES.get(n, 80)
        for n in ("sp ace.json", "a[1].json", "pct%41.json", "plus+x.json", "good.json")
    }
    assert table_rows(workspace.paths("j").final, ["ID", "VALUE"]) == sorted(
        (id_, "v2" if id_ in changed else "v1") for id_, _ in expected
    )
    # The refused names stay refused once (no second quarantine row per rerun).
    assert len(quarantine(workspace, "j")) == 2


def test_a_garbage_checksum_sidecar_never_refuses_a_good_parquet_file(
    workspace: Workspace, tmp_path: Path
) -> None:
    workspace.configure(PARQUET_TABLE)
    hour = workspace.landing / "p" / "dt=2024-01-01" / "hr=00"
    hour.mkdir(parents=True)
    table = pa.table(
        {
            "FLAG": ["I", "I"],
            "ID": [1, 2],
            "TS": pa.array([1704067200000000] * 2, pa.timestamp("us", tz="UTC")),
        }
    )
    pq.write_table(table, hour / "x.parquet")
    (hour / ".x.parquet.crc").write_bytes(b"\x00" * 64)
    result = cdc(workspace, "run", "p", *HOUR)
    assert result.returncode == 0, result.stderr
    assert summary(result)["files_refused"] == "0"
    assert table_rows(workspace.paths("p").final, ["ID"]) == [(1,), (2,)]
    assert quarantine(workspace, "p") == []


def test_empty_and_over_long_partition_values_are_quarantined_and_keys_stay_unique(
    workspace: Workspace,
) -> None:
    workspace.configure(
        {
            **JSON_TABLE,
            "columns": {**JSON_TABLE["columns"], "REGION": "string"},
            "partition_expression": "REGION",
            "partition_column": "P",
        }
    )

    def land(hour: str, rows: list[tuple[str, int, str]]) -> None:
        folder = workspace.landing / "j" / "dt=2024-01-01" / f"hr={hour}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "a.json").write_text(
            "".join(
                json.dumps(
                    {
                        "FLAG": flag,
                        "ID": id_,
                        "VALUE": hour,
                        "REGION": region,
                        "CDC_TIMESTAMP": f"2024-01-01 {hour}:00:00",
                    }
                )
                + "\n"
                for flag, id_, region in rows
            )
        )

    land("00", [("I", 3, ""), ("I", 4, "eu"), ("I", 5, "x" * 300)])
    land("01", [("U", 3, ""), ("U", 4, "eu")])
    for end in ("01", "02"):
        hour = ("--start", "2024-01-01T00:00:00Z", "--end", f"2024-01-01T{end}:00:00Z")
        result = cdc(workspace, "run", "j", *hour)
        assert result.returncode == 0, result.stderr
    assert table_rows(workspace.paths("j").final, ["ID", "VALUE", "P"]) == [(4, "01", "eu")]
    reasons = sorted((r["ID"], r["_cdc_reason"]) for r in quarantine(workspace, "j"))
    assert [id_ for id_, _ in reasons] == ["3", "3", "5"]
    assert reasons[0][1].startswith("partition_expression gives an empty string (REGION)")
    assert reasons[2][1].startswith("partition_expression gives a value longer than 200 bytes")
    check = cdc(workspace, "check", "j")
    assert check.returncode == 0, check.stdout + check.stderr


def test_gzip_compressed_json_lines_and_csv_are_read(workspace: Workspace) -> None:
    import gzip

    workspace.configure(
        JSON_TABLE,
        {
            "name": "c",
            "file_format": "csv",
            "columns": {"ID": "bigint", "VALUE": "string", "TS": "timestamp"},
            "keys": ["ID"],
            "sequence_by": ["TS"],
        },
    )
    json_hour = workspace.landing / "j" / "dt=2024-01-01" / "hr=00"
    json_hour.mkdir(parents=True)
    (json_hour / "part-0.json.gz").write_bytes(
        gzip.compress((line(1, "a") + line(2, "b")).encode())
    )
    csv_hour = workspace.landing / "c" / "dt=2024-01-01" / "hr=00"
    csv_hour.mkdir(parents=True)
    text = "FLAG,ID,VALUE,TS\nI,1,a,2024-01-01 00:00:00\nI,2,b,2024-01-01 00:00:01\nU,1,c,2024-01-01 00:00:02\n"
    (csv_hour / "part-0.csv.gz").write_bytes(gzip.compress(text.encode()))
    (csv_hour / "broken.csv.gz").write_bytes(b"not gzip at all")
    for name in ("j", "c"):
        result = cdc(workspace, "run", name, *HOUR)
        assert result.returncode == 0, result.stderr
    assert table_rows(workspace.paths("j").final, ["ID", "VALUE"]) == [(1, "a"), (2, "b")]
    assert table_rows(workspace.paths("c").final, ["ID", "VALUE"]) == [(1, "c"), (2, "b")]
    reasons = {r["_cdc_reason"] for r in quarantine(workspace, "c")}
    assert any("not valid gzip data" in r for r in reasons), reasons


def test_a_zorder_column_the_data_lacks_fails_the_first_run_with_one_line(
    workspace: Workspace,
) -> None:
    workspace.configure({**PARQUET_TABLE, "zorder_by": ["NOPE"]})
    hour = workspace.landing / "p" / "dt=2024-01-01" / "hr=00"
    hour.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "FLAG": ["I"],
                "ID": [1],
                "TS": pa.array([1704067200000000], pa.timestamp("us", tz="UTC")),
            }
        ),
        hour / "x.parquet",
    )
    result = cdc(workspace, "run", "p", *HOUR)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: run: table p: zorder_by: NOPE is not a column of the data (its columns: ID, TS); "
        "name columns the change files carry"
    )
    assert not (workspace.paths("p").final / "_delta_log").exists()


def test_every_landed_name_is_read_as_exactly_that_object_on_s3(s3_workspace: Workspace) -> None:
    """The same names as keys of a bucket (through S3A and the driver's S3 client): each read as
    exactly that object, rewrites staged again, the names Hadoop cannot address refused alone."""
    from spark_jobs.runtime.storage import store_for

    workspace = s3_workspace
    workspace.configure(JSON_TABLE)
    hour = workspace.landing / "j" / "dt=2024-01-01" / "hr=00"
    store = store_for(hour)
    for name, id_ in {**NAMES, **REFUSED}.items():
        store.write_bytes(hour / name, line(id_, "v1").encode())
    result = cdc(workspace, "run", "j", *HOUR)
    assert result.returncode == 0, result.stderr
    counts = summary(result)
    assert (counts["staged"], counts["files_refused"]) == (str(len(NAMES)), "2")
    expected = sorted((id_, "v1") for id_ in NAMES.values())
    assert table_rows(workspace.paths("j").final, ["ID", "VALUE"]) == expected
    refused = {r["_cdc_raw"] for r in quarantine(workspace, "j")}
    assert refused == {f"dt=2024-01-01/hr=00/{name}" for name in REFUSED}
    rewritten = ("sp ace.json", "a[1].json", "pct%41.json", "plus+x.json", "st*r.json")
    for name in rewritten:
        store.write_bytes(hour / name, line(NAMES[name], "v2-longer", 1).encode())
    again = cdc(workspace, "run", "j", *HOUR)
    assert again.returncode == 0, again.stderr
    assert summary(again)["new_files"] == str(len(rewritten))
    changed = {NAMES[name] for name in rewritten}
    assert table_rows(workspace.paths("j").final, ["ID", "VALUE"]) == sorted(
        (id_, "v2-longer" if id_ in changed else "v1") for id_, _ in expected
    )
    assert len(quarantine(workspace, "j")) == 2
