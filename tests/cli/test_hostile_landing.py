"""A hostile landing through the real `cdc` command: links, broken and contradicting Parquet
files and stray entries are reported and quarantined; the good files are staged; a file fixed in
place is staged by the next run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.landing import SYMLINK_REASON
from tests.cli.cdc import CDC, cdc, environment, summary
from tests.helpers import Workspace, table_rows

pytestmark = [pytest.mark.cli, pytest.mark.slow]

TABLE = {"name": "p", "file_format": "parquet", "keys": ["ID"], "sequence_by": ["TS"]}
INTERVAL = ("--start", "2024-01-01T06:00:00Z", "--end", "2024-01-01T07:00:00Z")
WHERE = "warning: table p: [2024-01-01T06:00:00Z, 2024-01-01T07:00:00Z)"


def changes(ids: list[object]) -> pa.Table:
    when = datetime(2024, 1, 1, 6, tzinfo=UTC)
    return pa.table(
        {
            "FLAG": ["I"] * len(ids),
            "ID": ids,
            "TS": pa.array([when] * len(ids), pa.timestamp("us", tz="UTC")),
        }
    )


def test_hostile_landing_is_reported_and_the_good_files_are_staged(
    workspace: Workspace, tmp_path: Path
) -> None:
    workspace.configure(TABLE)
    hour = workspace.landing / "p" / "dt=2024-01-01" / "hr=06"
    hour.mkdir(parents=True)
    pq.write_table(changes([1, 2]), hour / "good.parquet")
    whole = (hour / "good.parquet").read_bytes()
    (hour / "truncated.parquet").write_bytes(whole[:100])
    pq.write_table(changes(["3"]), hour / "types.parquet")  # ID as text: good.parquet says bigint
    (hour / "passwd.parquet").symlink_to("/etc/passwd")
    (hour / "notes.txt").write_text("not a change file")
    (hour.parent / "hr=5").mkdir()

    staged = cdc(workspace, "stage", "p", *INTERVAL)
    assert staged.returncode == 0, staged.stderr
    counts = summary(staged)
    assert {
        k: counts[k]
        for k in (
            "files",
            "new_files",
            "staged",
            "quarantined",
            "files_refused",
            "symlinks_refused",
            "unrecognised_entries",
        )
    } == {
        "files": "3",
        "new_files": "3",
        "staged": "2",
        "quarantined": "3",
        "files_refused": "2",
        "symlinks_refused": "1",
        "unrecognised_entries": "2",
    }
    warnings = [line for line in staged.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"{WHERE}: not in the landing layout dt=YYYY-MM-DD/hr=HH/*.parquet, never read: "
        "dt=2024-01-01/hr=5/, dt=2024-01-01/hr=06/notes.txt",
        f"{WHERE}: symbolic links refused, never followed: dt=2024-01-01/hr=06/passwd.parquet",
        f"{WHERE}: file dt=2024-01-01/hr=06/truncated.parquet refused (quarantined): unreadable "
        "Parquet file (100 bytes): Parquet magic bytes not found in footer. Either the file is "
        "corrupted or this is not a parquet file.",
        f"{WHERE}: file dt=2024-01-01/hr=06/types.parquet refused (quarantined): Parquet schema "
        "refused: ID is string in this file but other files give bigint",
    ]
    paths = workspace.paths("p")
    assert table_rows(paths.quarantine, ["_cdc_raw", "_cdc_reason", "_cdc_file", "_cdc_row"]) == (
        sorted(
            [
                ("dt=2024-01-01/hr=06/passwd.parquet", SYMLINK_REASON, "passwd.parquet", None),
                (
                    "dt=2024-01-01/hr=06/truncated.parquet",
                    "unreadable Parquet file (100 bytes): Parquet magic bytes not found in "
                    "footer. Either the file is corrupted or this is not a parquet file.",
                    "truncated.parquet",
                    None,
                ),
                (
                    "dt=2024-01-01/hr=06/types.parquet",
                    "Parquet schema refused: ID is string in this file but other files give bigint",
                    "types.parquet",
                    None,
                ),
            ],
            key=repr,
        )
    )
    assert "root:" not in repr(table_rows(paths.quarantine))  # a link is never opened
    assert table_rows(paths.staging, ["ID", "_cdc_file"]) == [
        (1, "good.parquet"),
        (2, "good.parquet"),
    ]

    # types.parquet fixed in place: the rerun stages its new version and applies the interval.
    pq.write_table(changes([3]), hour / "types.parquet")
    ran = cdc(workspace, "run", "p", *INTERVAL)
    assert ran.returncode == 0, ran.stderr
    assert {k: summary(ran)[k] for k in ("new_files", "staged", "quarantined")} == {
        "new_files": "1",
        "staged": "1",
        "quarantined": "0",
    }
    assert table_rows(paths.final, ["ID", "_cdc_file"]) == [
        (1, "good.parquet"),
        (2, "good.parquet"),
        (3, "~0001~types.parquet"),
    ]
    assert len(table_rows(paths.quarantine)) == 3


SETPRIV = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
JSON_TABLE = {
    "name": "j",
    "file_format": "json",
    "columns": {"ID": "bigint", "N": "int", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
HOUR = "2024-01-01T06"
TS = "2024-01-01 06:00:00"


def json_changes(*rows: tuple[object, object]) -> list[dict[str, object]]:
    return [{"FLAG": "I", "ID": i, "N": n, "TS": TS} for i, n in rows]


@pytest.mark.parametrize("point", ["stage:before_quarantine_commit", "stage:before_ledger_commit"])
@pytest.mark.parametrize("changed", [True, False])
def test_a_file_changed_after_a_run_crashed_before_the_ledger_is_staged_again(
    workspace: Workspace, point: str, changed: bool
) -> None:
    """Staging commits, then quarantine, then the ledger: a run killed in between leaves the
    file in staging unknown to the ledger. The rerun must not take the file's new content for
    the rows already staged, nor stage or quarantine unchanged rows twice."""
    workspace.configure(JSON_TABLE)
    paths = workspace.paths("j")
    first = json_changes((1, 1), (None, 1))  # a good row and a null key
    workspace.land("j", HOUR, "a.json", first, file_format="json")
    killed = cdc(workspace, "run", "j", *INTERVAL, CDC_FAULT=point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert table_rows(paths.staging, ["ID", "N", "_cdc_file"]) == [(1, 1, "a.json")]
    assert not (paths.ledger / "_delta_log").is_dir()
    quarantined_before = [(None, "a.json")] if point == "stage:before_ledger_commit" else []
    if changed:
        workspace.land(
            "j", HOUR, "a.json", json_changes((1, 7), (2, 7), (None, 2)), file_format="json"
        )
    rerun = cdc(workspace, "run", "j", *INTERVAL)
    assert rerun.returncode == 0, rerun.stderr
    if changed:
        assert {k: summary(rerun)[k] for k in ("new_files", "staged", "quarantined")} == {
            "new_files": "1",
            "staged": "2",
            "quarantined": "1",
        }
        assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [
            (1, 7, "~0001~a.json"),
            (2, 7, "~0001~a.json"),
        ]
        assert table_rows(paths.staging, ["ID", "N", "_cdc_file"]) == [
            (1, 1, "a.json"),
            (1, 7, "~0001~a.json"),
            (2, 7, "~0001~a.json"),
        ]
        assert table_rows(paths.quarantine, ["ID", "_cdc_file"]) == sorted(
            [*quarantined_before, (None, "~0001~a.json")], key=repr
        )
        # The crashed run's version is recorded (content unknown), then the new one.
        assert table_rows(paths.ledger, ["file", "rows_staged", "rows_quarantined"]) == [
            ("a.json", 1, len(quarantined_before)),
            ("~0001~a.json", 2, 1),
        ]
    else:
        assert {k: summary(rerun)[k] for k in ("new_files", "staged", "quarantined")} == {
            "new_files": "1",
            "staged": "0",
            "quarantined": str(1 - len(quarantined_before)),
        }
        assert table_rows(paths.final, ["ID", "N", "_cdc_file"]) == [(1, 1, "a.json")]
        assert table_rows(paths.staging, ["ID", "N", "_cdc_file"]) == [(1, 1, "a.json")]
        assert table_rows(paths.quarantine, ["ID", "_cdc_file"]) == [(None, "a.json")]
        assert table_rows(paths.ledger, ["file", "rows_staged", "rows_quarantined"]) == [
            ("a.json", 1, 1)
        ]
    again = cdc(workspace, "run", "j", *INTERVAL)
    assert again.returncode == 0, again.stderr
    assert summary(again)["new_files"] == "0"


def test_a_parquet_file_whose_data_pages_are_corrupt_is_quarantined_and_the_hour_staged(
    workspace: Workspace,
) -> None:
    workspace.configure(TABLE)
    hour = workspace.landing / "p" / "dt=2024-01-01" / "hr=06"
    hour.mkdir(parents=True)
    pq.write_table(changes([1, 2]), hour / "a.parquet")
    pq.write_table(changes(list(range(100, 1100))).select(["ID", "FLAG", "TS"]), hour / "b.parquet")
    chunk = pq.ParquetFile(hour / "b.parquet").metadata.row_group(0).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray((hour / "b.parquet").read_bytes())
    middle = start + chunk.total_compressed_size // 2
    data[middle : middle + 64] = b"\xff" * 64
    (hour / "b.parquet").write_bytes(bytes(data))
    ran = cdc(workspace, "run", "p", *INTERVAL)
    assert ran.returncode == 0, ran.stderr
    counts = summary(ran)
    assert {
        k: counts[k] for k in ("files", "new_files", "staged", "quarantined", "files_refused")
    } == {
        "files": "2",
        "new_files": "2",
        "staged": "2",
        "quarantined": "1",
        "files_refused": "1",
    }
    paths = workspace.paths("p")
    [(raw, reason, file)] = table_rows(paths.quarantine, ["_cdc_raw", "_cdc_reason", "_cdc_file"])
    assert (raw, file) == ("dt=2024-01-01/hr=06/b.parquet", "b.parquet")
    assert reason.startswith(f"unreadable Parquet file b.parquet ({len(data)} bytes): ")
    assert table_rows(paths.final, ["ID"]) == [(1,), (2,)]


@pytest.mark.classic_only  # the reading process is `cdc` itself (a Connect server reads as its own user)
def test_a_landing_file_the_run_cannot_read_is_quarantined_and_the_rest_staged() -> None:
    """Run as uid 65534 (root reads every file): a file it may not read is one quarantine row."""
    root = Path(tempfile.mkdtemp(prefix="cdc-unreadable-", dir="/tmp"))
    try:
        workspace = Workspace(root)
        workspace.configure(JSON_TABLE)
        workspace.land("j", HOUR, "a.json", json_changes((1, 1)), file_format="json")
        secret = workspace.land("j", HOUR, "b.json", json_changes((2, 2)), file_format="json")
        (root / "home").mkdir()
        for path in [root, *root.rglob("*")]:
            os.chown(path, 65534, 65534)
        root.chmod(0o755)
        os.chown(secret, 0, 0)
        secret.chmod(0o600)
        env = environment(workspace, HOME=str(root / "home"))
        ran = subprocess.run(
            [*SETPRIV, str(CDC), "run", "j", *INTERVAL],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        counts = summary(ran)
        assert {k: counts[k] for k in ("files", "new_files", "staged", "files_refused")} == {
            "files": "2",
            "new_files": "2",
            "staged": "1",
            "files_refused": "1",
        }
        paths = workspace.paths("j")
        size = secret.stat().st_size
        assert table_rows(paths.quarantine, ["_cdc_raw", "_cdc_reason", "_cdc_file"]) == [
            (
                "dt=2024-01-01/hr=06/b.json",
                f"unreadable file ({size} bytes): Permission denied",
                "b.json",
            )
        ]
        assert table_rows(paths.final, ["ID", "N"]) == [(1, 1)]
        assert (
            f"{WHERE}: file dt=2024-01-01/hr=06/b.json refused (quarantined): unreadable file "
            f"({size} bytes): Permission denied"
        ).replace("table p:", "table j:") in ran.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
