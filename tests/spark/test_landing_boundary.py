"""Landing is a boundary: links refused, bad files quarantined alone, changed files re-staged."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from cdc_pipeline.errors import InputError
from spark_jobs import landing
from spark_jobs.landing import ledger as landing_ledger
from spark_jobs.stage import run_stage
from spark_jobs.staging import rows as stage_rows
from tests.helpers import Workspace, file_paths, interval, table_rows
from tests.spark.steps import context, run

pytestmark = pytest.mark.spark

TABLE = {
    "name": "j",
    "file_format": "json",
    "columns": {"ID": "bigint", "N": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
T0 = "2024-01-01T20:00:00Z"
LINK = landing.SYMLINK_REASON
REFUSAL_COLUMNS = ["_cdc_raw", "_cdc_reason", "_cdc_batch", "_cdc_file", "_cdc_row"]


def row(id_: int, n: int, ts: str = T0, flag: str = "I") -> dict[str, Any]:
    return {"FLAG": flag, "ID": id_, "N": n, "TS": ts}


def hour_folder(ws: Workspace, table: str, hour: str) -> Path:
    folder = ws.landing / table / f"dt={hour[:10]}" / f"hr={hour[11:]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_links_are_refused_and_strays_reported_while_the_rest_is_staged(
    spark, workspace: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = workspace.configure(TABLE)["j"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (outside / "b.json").write_text(json.dumps(row(9, 9)) + "\n")
    workspace.land("j", "2024-01-01T20", "a.json", [row(1, 1)], file_format="json")
    folder = hour_folder(workspace, "j", "2024-01-01T20")
    (folder / "x.json").symlink_to(outside / "passwd")
    (folder / "notes.txt").write_text("not a change file")
    (folder / "_SUCCESS").write_text("")  # a marker: skipped silently, as Spark does
    (folder.parent / "hr=21").symlink_to(outside)  # a linked hour folder of the interval
    (folder.parent / "hr=5").mkdir()
    (workspace.landing / "j" / "dt=2024-13-45" / "hr=99").mkdir(parents=True)
    (workspace.landing / "j" / "stray.json").write_text("{}\n")
    (workspace.landing / "j" / "dt=2024-03-01").mkdir()  # another interval's day: not looked at
    (workspace.landing / "j" / "dt=2024-01-02").symlink_to(outside)  # a linked day folder
    stage_report, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-02T01")
    counts = stage_report.counts
    assert (counts["files"], counts["new_files"], counts["staged"], counts["quarantined"]) == (
        1,
        1,
        1,
        3,
    )
    assert (
        counts["symlinks_refused"],
        counts["unrecognised_entries"],
        counts["files_refused"],
    ) == (3, 4, 0)
    paths = workspace.paths("j")
    assert table_rows(paths.quarantine, REFUSAL_COLUMNS) == sorted(
        [
            ("dt=2024-01-01/hr=20/x.json", LINK, "2024-01-01T20", "x.json", None),
            ("dt=2024-01-01/hr=21", LINK, "2024-01-01T21", "dt=2024-01-01/hr=21", None),
            ("dt=2024-01-02", LINK, "2024-01-02T00", "dt=2024-01-02", None),
        ],
        key=repr,
    )
    assert table_rows(paths.quarantine, ["ID", "N", "FLAG"]) == [(None, None, None)] * 3
    assert table_rows(paths.final, ["ID", "N"]) == [(1, 1)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    where = "warning: table j: [2024-01-01T20:00:00Z, 2024-01-02T01:00:00Z)"
    assert warnings == [
        f"{where}: not in the landing layout "
        "dt=YYYY-MM-DD/hr=HH/*.json|.jsonl|.ndjson|.json.gz|.jsonl.gz|.ndjson.gz, never read: dt=2024-13-45/, stray.json, dt=2024-01-01/hr=5/, dt=2024-01-01/hr=20/notes.txt",
        f"{where}: symbolic links refused, never followed: dt=2024-01-02, dt=2024-01-01/hr=21, "
        "dt=2024-01-01/hr=20/x.json",
    ]
    # A rerun reports the links again but quarantines nothing twice.
    again = run_stage(
        context(spark, workspace, table), interval("2024-01-01T20", "2024-01-02T01")
    ).counts
    assert (again["symlinks_refused"], again["new_files"], again["quarantined"]) == (3, 0, 0)
    assert len(table_rows(paths.quarantine)) == 3


def test_a_linked_table_folder_is_an_error(spark, workspace: Workspace, tmp_path: Path) -> None:
    table = workspace.configure(TABLE)["j"]
    (tmp_path / "elsewhere").mkdir()
    workspace.landing.mkdir()
    (workspace.landing / "j").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputError) as raised:
        run_stage(context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21"))
    assert str(raised.value) == (
        f"table j: the landing folder {workspace.landing / 'j'} is a symbolic link; landing links "
        "are never followed: make it a real folder"
    )
    assert not workspace.paths("j").table_root.exists()


def test_a_changed_file_is_a_new_version_that_ranks_after_the_old(
    spark, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = workspace.configure(TABLE)["j"]
    paths = workspace.paths("j")
    path = workspace.land("j", "2024-01-01T20", "g.json", [row(1, 1)], file_format="json")
    run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    # Rewritten in place: the same key and sequence with another value, and a new line.
    workspace.land("j", "2024-01-01T20", "g.json", [row(1, 2), row(2, 2)], file_format="json")
    stage_report, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert (stage_report.counts["new_files"], stage_report.counts["staged"]) == (1, 2)
    assert table_rows(paths.final, ["ID", "N"]) == [(1, 2), (2, 2)]
    assert table_rows(paths.staging, ["ID", "N", "_cdc_file"]) == [
        (1, 1, "g.json"),
        (1, 2, "~0001~g.json"),
        (2, 2, "~0001~g.json"),
    ]
    # Touched, same content: no new version; the touch is recorded, so the next run does not hash.
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    touched = run_stage(
        context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21")
    )
    assert (touched.counts["new_files"], touched.counts["staged"]) == (0, 0)
    hashed: list[Path] = []
    real_digest = landing_ledger.file_digest

    def counted_digest(path: Path) -> tuple[str, int, int]:
        hashed.append(path)
        return real_digest(path)

    monkeypatch.setattr(landing_ledger, "file_digest", counted_digest)
    run_stage(context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21"))
    assert hashed == []
    ledger = table_rows(paths.ledger, ["file", "rows_staged", "mtime_ns"])
    assert [(f, n) for f, n, _ in ledger] == [
        ("g.json", 1),
        ("~0001~g.json", 0),
        ("~0001~g.json", 2),
    ]
    assert (1_000_000_000 in {m for _, _, m in ledger}) is True


def test_an_old_ledger_without_content_columns_keeps_working(spark, workspace: Workspace) -> None:
    table = workspace.configure(TABLE)["j"]
    paths = workspace.paths("j")
    workspace.land("j", "2024-01-01T20", "g.json", [row(1, 1)], file_format="json")
    run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    old_columns = ["batch", "file", "rows_staged", "rows_quarantined", "staged_at", "run_id"]
    old_rows = DeltaTable(str(paths.ledger)).to_pyarrow_table(columns=old_columns)
    shutil.rmtree(paths.ledger)
    write_deltalake(str(paths.ledger), old_rows, mode="append")
    rerun = run_stage(context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21"))
    assert (rerun.counts["new_files"], rerun.counts["staged"]) == (0, 0)  # hashed, not re-staged
    hashes = [h for (h,) in table_rows(paths.ledger, ["sha256"])]
    assert hashes[0] is not None and hashes[1] is None  # the old row, and the content recorded
    workspace.land("j", "2024-01-01T20", "g.json", [row(1, 5)], file_format="json")
    changed = run_stage(
        context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21")
    )
    assert (changed.counts["new_files"], changed.counts["staged"]) == (1, 1)


def test_a_file_changing_while_it_is_read_is_left_for_the_next_run(
    spark, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = workspace.configure(TABLE)["j"]
    paths = workspace.paths("j")
    workspace.land("j", "2024-01-01T20", "a.json", [row(1, 1)], file_format="json")
    growing = workspace.land("j", "2024-01-01T20", "b.json", [row(2, 1)], file_format="json")
    real_read = stage_rows.read_landing

    def read_then_append(*args: Any, **kwargs: Any) -> Any:
        result = real_read(*args, **kwargs)
        with growing.open("a") as handle:  # the writer is still at work after the listing
            handle.write(json.dumps(row(3, 1)) + "\n")
        return result

    monkeypatch.setattr(stage_rows, "read_landing", read_then_append)
    first = run_stage(context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21"))
    assert (first.counts["staged"], first.counts["files_deferred"]) == (1, 1)
    assert table_rows(paths.ledger, ["file"]) == [("a.json",)]
    monkeypatch.setattr(stage_rows, "read_landing", real_read)
    second, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert (second.counts["new_files"], second.counts["staged"]) == (1, 2)
    assert table_rows(paths.final, ["ID"]) == [(1,), (2,), (3,)]


PARQUET = {
    "name": "p",
    "file_format": "parquet",
    "keys": ["ID"],
    "sequence_by": ["TS"],
}


def parquet_rows(ids: list[Any], value: int = 1) -> pa.Table:
    when = datetime.fromisoformat("2024-01-01T20:00:00+00:00")
    return pa.table(
        {
            "FLAG": ["I"] * len(ids),
            "ID": ids,
            "V": [value] * len(ids),
            "TS": pa.array([when] * len(ids), pa.timestamp("us", tz="UTC")),
        }
    )


def test_bad_parquet_files_are_quarantined_alone(spark, workspace: Workspace) -> None:
    table = workspace.configure(PARQUET)["p"]
    folder = hour_folder(workspace, "p", "2024-01-01T20")
    pq.write_table(parquet_rows([1, 2]), folder / "a.parquet")
    pq.write_table(parquet_rows([3]), folder / "b.parquet")
    whole = (folder / "a.parquet").read_bytes()
    (folder / "c.parquet").write_bytes(whole[: len(whole) // 2])
    (folder / "d.parquet").write_bytes(b"")
    pq.write_table(parquet_rows(["7"]), folder / "e.parquet")  # ID as text: two files say bigint
    stage_report, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    counts = stage_report.counts
    assert (counts["new_files"], counts["files_refused"], counts["staged"]) == (5, 3, 3)
    paths = workspace.paths("p")
    size = len(whole) // 2
    magic = "Parquet magic bytes not found in footer. Either the file is corrupted or this is not a parquet file."
    assert table_rows(paths.quarantine, REFUSAL_COLUMNS) == sorted(
        [
            (
                "dt=2024-01-01/hr=20/c.parquet",
                f"unreadable Parquet file ({size} bytes): {magic}",
                "2024-01-01T20",
                "c.parquet",
                None,
            ),
            (
                "dt=2024-01-01/hr=20/d.parquet",
                "unreadable Parquet file (0 bytes): Parquet file size is 0 bytes",
                "2024-01-01T20",
                "d.parquet",
                None,
            ),
            (
                "dt=2024-01-01/hr=20/e.parquet",
                "Parquet schema refused: ID is string in this file but other files give bigint",
                "2024-01-01T20",
                "e.parquet",
                None,
            ),
        ],
        key=repr,
    )
    assert table_rows(paths.final, ["ID"]) == [(1,), (2,), (3,)]
    # The text file fixed in place is a new version: staged on the next run.
    pq.write_table(parquet_rows([7]), folder / "e.parquet")
    fixed, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert (fixed.counts["new_files"], fixed.counts["staged"], fixed.counts["quarantined"]) == (
        1,
        1,
        0,
    )
    assert table_rows(paths.final, ["ID", "_cdc_file"]) == [
        (1, "a.parquet"),
        (2, "a.parquet"),
        (3, "b.parquet"),
        (7, "~0001~e.parquet"),
    ]


def test_parquet_files_of_different_types_read_as_the_declared_columns(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(
        {**PARQUET, "columns": {"ID": "bigint", "V": "int", "TS": "timestamp"}}
    )["p"]
    folder = hour_folder(workspace, "p", "2024-01-01T20")
    pq.write_table(parquet_rows([1]), folder / "a.parquet")
    text = parquet_rows(["2", "x"]).set_column(2, "V", pa.array(["5", "6"]))
    pq.write_table(text, folder / "b.parquet")
    stage_report, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert (stage_report.counts["staged"], stage_report.counts["files_refused"]) == (2, 0)
    assert table_rows(workspace.paths("p").final, ["ID", "V"]) == [(1, 1), (2, 5)]
    assert table_rows(workspace.paths("p").quarantine, ["ID", "_cdc_reason"]) == [
        ("x", "unparsable value in ID: 'x' is not a valid bigint")
    ]


def test_a_changed_snapshot_extract_file_is_refused(spark, workspace: Workspace) -> None:
    snapshot = {
        "name": "j",
        "file_format": "json",
        "change_format": "snapshot",
        "columns": {"ID": "bigint", "N": "int"},
        "keys": ["ID"],
    }
    table = workspace.configure(snapshot)["j"]
    workspace.land("j", "2024-01-01T20", "x.json", [{"ID": 1, "N": 1}], file_format="json")
    run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    workspace.land("j", "2024-01-01T20", "x.json", [{"ID": 1, "N": 2}], file_format="json")
    with pytest.raises(InputError) as raised:
        run_stage(context(spark, workspace, table), interval("2024-01-01T20", "2024-01-01T21"))
    assert str(raised.value) == (
        "table j: [2024-01-01T20:00:00Z, 2024-01-01T21:00:00Z): the extract file "
        "dt=2024-01-01/hr=20/x.json changed after it was staged; snapshot extracts are compared "
        "as a whole: land the corrected extract in a later hour folder"
    )


def test_later_versions_of_a_file_sort_later_as_arrival_order_ranks_them() -> None:
    names = [landing.versioned_name("a.json", n) for n in (12, 1, 3, 2)]
    assert sorted([*names, "b.json", "zz.json", "Z.json", "9.json"]) == [
        "9.json",
        "Z.json",
        "b.json",
        "zz.json",
        "~0001~a.json",
        "~0002~a.json",
        "~0003~a.json",
        "~0012~a.json",
    ]
    assert [landing.split_version(n) for n in sorted(names)] == [
        ("a.json", (2, 1)),
        ("a.json", (2, 2)),
        ("a.json", (2, 3)),
        ("a.json", (2, 12)),
    ]
    # An older ledger's `name~v002` still reads as a version, before the hour-wide numbering.
    assert landing.split_version("a.json~v002") == ("a.json", (1, 2))
    assert landing.split_version("a.json") == ("a.json", (0, 0))
    assert landing.is_reserved_name("~0001~a.json") and not landing.is_reserved_name("~a.json")
    with pytest.raises(InputError):
        landing.versioned_name("a.json", 10_000)


def test_parquet_files_are_refused_by_the_majority_type_or_the_declared_one(
    tmp_path: Path,
) -> None:
    def landed(name: str, table: pa.Table) -> landing.LandingFile:
        pq.write_table(table, tmp_path / name)
        return landing.LandingFile("2024-01-01T20", tmp_path / name, name, 0, 0)

    ints = pa.table({"ID": pa.array([1], pa.int32()), "FLAG": ["I"]})
    longs = pa.table({"ID": pa.array([1], pa.int64()), "FLAG": ["I"]})
    text = pa.table({"ID": ["1"], "FLAG": ["I"]})
    nested = pa.table({"ID": [[1]], "FLAG": ["I"]})
    files = [landed("a", text), landed("b", ints), landed("c", longs), landed("d", nested)]
    inferred = landing.plan_parquet(files, None, "FLAG")
    assert [(r.file, r.reason) for r in inferred.refusals] == [
        ("a", "Parquet schema refused: ID is string in this file but other files give int"),
        ("d", "Parquet schema refused: ID is array<bigint> in this file but other files give int"),
    ]
    assert [[f.file for f in g] for g in inferred.groups] == [["b"], ["c"]]
    assert inferred.column_types == {"ID": "bigint", "FLAG": "string"}
    declared = landing.plan_parquet(files, {"ID": "bigint"}, "FLAG")
    assert [r.file for r in declared.refusals] == ["d"]
    assert declared.column_types == {"ID": "string", "FLAG": "string"}  # typed row by row


def corrupt_data_pages(path: Path) -> None:
    """Overwrite bytes in the middle of the first column chunk; the footer stays valid."""
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    middle = start + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def many_rows(first: int, count: int) -> pa.Table:
    """`count` changes with distinct keys (a first column chunk of several kilobytes)."""
    table = parquet_rows(list(range(first, first + count)))
    return table.select(["ID", "FLAG", "V", "TS"])


DATA_PAGES_CAUSE = "IOException: FAILED_TO_UNCOMPRESS(5)"
DATA_PAGES = (
    "unreadable Parquet file b.parquet ({size} bytes): its footer reads but its data does not "
    "({cause})"
)


def test_a_parquet_file_with_corrupt_data_pages_is_quarantined_alone(
    spark, workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    table = workspace.configure(PARQUET)["p"]
    folder = hour_folder(workspace, "p", "2024-01-01T20")
    pq.write_table(parquet_rows([1, 2]), folder / "a.parquet")
    pq.write_table(many_rows(100, 1000), folder / "b.parquet")
    corrupt_data_pages(folder / "b.parquet")
    pq.write_table(parquet_rows([3]), folder / "c.parquet")
    size = (folder / "b.parquet").stat().st_size
    landing.probe_parquet(landing.LandingFile("x", folder / "b.parquet", "b", size, 0))  # footer ok
    stage_report, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    counts = stage_report.counts
    assert (counts["new_files"], counts["files_refused"], counts["staged"]) == (3, 1, 3)
    assert counts["quarantined"] == 1
    paths = workspace.paths("p")
    [(raw, reason, batch, file, row_)] = table_rows(paths.quarantine, REFUSAL_COLUMNS)
    assert (raw, batch, file, row_) == (
        "dt=2024-01-01/hr=20/b.parquet",
        "2024-01-01T20",
        "b.parquet",
        None,
    )
    assert reason == DATA_PAGES.format(size=size, cause=DATA_PAGES_CAUSE)
    assert table_rows(paths.staging, ["ID", "_cdc_file"]) == [
        (1, "a.parquet"),
        (2, "a.parquet"),
        (3, "c.parquet"),
    ]
    assert table_rows(paths.final, ["ID"]) == [(1,), (2,), (3,)]
    on_disk = {str(p.relative_to(paths.staging)) for p in paths.staging.rglob("*.parquet")}
    assert on_disk == {unquote(p) for p in file_paths(paths.staging)}  # nothing half-written
    assert f"file dt=2024-01-01/hr=20/b.parquet refused (quarantined): {reason}" in (
        capsys.readouterr().err
    )
    # Fixed in place: the next run stages it as a new version.
    pq.write_table(many_rows(100, 3), folder / "b.parquet")
    fixed, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert (fixed.counts["new_files"], fixed.counts["staged"], fixed.counts["files_refused"]) == (
        1,
        3,
        0,
    )
    assert [r for r in table_rows(paths.final, ["ID", "_cdc_file"]) if r[0] >= 100] == [
        (100, "~0001~b.parquet"),
        (101, "~0001~b.parquet"),
        (102, "~0001~b.parquet"),
    ]


def test_exact_ties_go_to_the_later_staged_version_whatever_its_name(
    spark, workspace: Workspace
) -> None:
    table = workspace.configure(TABLE)["j"]
    paths = workspace.paths("j")

    def land_and_run(name: str, n: int) -> None:
        workspace.land("j", "2024-01-01T20", name, [row(1, n)], file_format="json")
        run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")

    # Key 1, the same sequence value in every file: only the arrival order decides.
    workspace.land("j", "2024-01-01T20", "a.json", [row(1, 1)], file_format="json")
    workspace.land("j", "2024-01-01T20", "b.json", [row(1, 2)], file_format="json")
    workspace.land("j", "2024-01-01T20", "~0009~z.json", [row(1, 9)], file_format="json")
    first, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert first.counts["unrecognised_entries"] == 1  # a version's name is never a landed file
    assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [(1, 2, "b.json")]
    # a.json rewritten after b.json was staged: its new version is the later arrival, although
    # `a` sorts before `b`.
    land_and_run("a.json", 3)
    assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [(1, 3, "~0001~a.json")]
    land_and_run("b.json", 4)
    assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [(1, 4, "~0002~b.json")]
    land_and_run("a.json", 5)  # a's third version after b's second
    assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [(1, 5, "~0003~a.json")]
    assert table_rows(paths.staging, ["N", "_cdc_file"]) == [
        (1, "a.json"),
        (2, "b.json"),
        (3, "~0001~a.json"),
        (4, "~0002~b.json"),
        (5, "~0003~a.json"),
    ]
    # A new file landed later ranks by its name among the hour's first versions.
    land_and_run("c.json", 6)
    assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [(1, 5, "~0003~a.json")]


def test_a_parquet_file_rewritten_with_other_types_after_its_probe_is_never_misread(
    spark, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its footer's types are given to Spark's read (no inference): a file replaced after the
    # probe by one of other types must fail the read or wait for the next run, never be read
    # as the old types.
    table = workspace.configure(PARQUET)["p"]
    folder = hour_folder(workspace, "p", "2024-01-01T20")
    pq.write_table(parquet_rows([1]), folder / "a.parquet")
    real_read = stage_rows.read_landing

    def rewrite_then_read(*args: Any, **kwargs: Any) -> Any:
        wide = parquet_rows([2]).set_column(2, "V", pa.array([2**40], pa.int64()))
        pq.write_table(wide.set_column(1, "ID", pa.array(["2"])), folder / "a.parquet")
        return real_read(*args, **kwargs)

    monkeypatch.setattr(stage_rows, "read_landing", rewrite_then_read)
    with pytest.raises(Exception, match=r"PARQUET_COLUMN_DATA_TYPE_MISMATCH.*a\.parquet"):
        run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")  # a retry's failure
    paths = workspace.paths("p")
    assert not paths.ledger.exists() and not paths.final.exists()  # nothing staged
    monkeypatch.setattr(stage_rows, "read_landing", real_read)
    retry, _ = run(spark, workspace, table, "2024-01-01T20", "2024-01-01T21")
    assert (retry.counts["new_files"], retry.counts["staged"]) == (1, 1)
    assert table_rows(paths.final, ["ID", "V"]) == [("2", 2**40)]
