"""A hostile landing through the real `cdc` command: links, broken and contradicting Parquet
files and stray entries are reported and quarantined; the good files are staged; a file fixed in
place is staged by the next run."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.landing import SYMLINK_REASON
from tests.cli.cdc import cdc, summary
from tests.helpers import Workspace, table_rows

pytestmark = pytest.mark.slow

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
        (3, "types.parquet~v002"),
    ]
    assert len(table_rows(paths.quarantine)) == 3
