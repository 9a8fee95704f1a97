"""The machine, not the data: a full disk, a read-only warehouse, a driver out of memory.

Each fails the step with one line saying which and what to do, leaves every committed table as
it was, and (disk and storage) the same hour applies exactly once the machine is fixed. The
warehouse lives on its own small tmpfs, mounted by the test and unmounted by it (the tests run
as root on this project's machines; elsewhere these are skipped, saying why).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.cdc import cdc
from tests.helpers import Workspace, table_rows, ts

pytestmark = [pytest.mark.cli, pytest.mark.slow]

HOUR_0 = ("--start", "2024-01-01T00:00:00Z", "--end", "2024-01-01T01:00:00Z")
HOUR_1 = ("--start", "2024-01-01T01:00:00Z", "--end", "2024-01-01T02:00:00Z")
NOTHING_PAST = "nothing past the last commit the summary reports was written"


def land(workspace: Workspace, hour: str, name: str, text: str) -> None:
    folder = workspace.landing / "j" / "dt=2024-01-01" / f"hr={hour}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def configure(workspace: Workspace) -> None:
    workspace.configure(
        {
            "name": "j",
            "file_format": "json",
            "columns": {"ID": "bigint", "V": "string", "TS": "timestamp"},
            "keys": ["ID"],
            "sequence_by": ["TS"],
        }
    )


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def small_warehouse(workspace: Workspace) -> Iterator[Path]:
    """The workspace's warehouse on a 64 MB tmpfs of its own."""
    workspace.warehouse.mkdir(parents=True, exist_ok=True)
    try:
        mount("-t", "tmpfs", "-o", "size=64m", "tmpfs", str(workspace.warehouse))
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {error}")
    try:
        yield workspace.warehouse
    finally:
        subprocess.run(["umount", str(workspace.warehouse)], check=False)


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_a_full_disk_and_a_read_only_warehouse_say_so_and_leave_final_as_it_was(
    workspace: Workspace, small_warehouse: Path
) -> None:
    configure(workspace)
    land(
        workspace, "00", "a.json", '{"FLAG": "I", "ID": 1, "V": "a", "TS": "2024-01-01 00:00:00"}\n'
    )
    assert cdc(workspace, "run", "j", *HOUR_0, timeout=900).returncode == 0
    before = [(1, "a", ts("2024-01-01T00:00:00Z"))]
    final = workspace.paths("j").final
    assert table_rows(final, ["ID", "V", "TS"]) == before
    land(
        workspace, "01", "b.json", '{"FLAG": "U", "ID": 1, "V": "b", "TS": "2024-01-01 01:00:00"}\n'
    )
    after = [(1, "b", ts("2024-01-01T01:00:00Z"))]

    filler = small_warehouse / "filler"
    subprocess.run(["fallocate", "-l", "64m", str(filler)], check=False, capture_output=True)
    with filler.open("ab") as out:  # fallocate stops short of full on tmpfs: top it up
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    result = cdc(workspace, "run", "j", *HOUR_1, timeout=900)
    assert result.returncode == 1, result.stderr
    assert last_line(result) == (
        "error: run j: disk full (No space left on device): free space where CDC_WAREHOUSE "
        "lives and in Spark's scratch directory (spark.local.dir, default /tmp), then rerun; "
        + NOTHING_PAST
    )
    filler.unlink()
    assert table_rows(final, ["ID", "V", "TS"]) == before

    mount("-o", "remount,ro", str(small_warehouse))
    try:
        result = cdc(workspace, "run", "j", *HOUR_1, timeout=900)
    finally:
        mount("-o", "remount,rw", str(small_warehouse))
    assert result.returncode == 1, result.stderr
    assert last_line(result) == (
        "error: run j: storage is read-only (Read-only file system): CDC_WAREHOUSE must be "
        "writable; remount it read-write or point CDC_WAREHOUSE elsewhere, then rerun; "
        + NOTHING_PAST
    ), result.stderr
    assert table_rows(final, ["ID", "V", "TS"]) == before

    result = cdc(workspace, "run", "j", *HOUR_1, timeout=900)
    assert result.returncode == 0, result.stderr
    assert table_rows(final, ["ID", "V", "TS"]) == after
    assert cdc(workspace, "check", "j").returncode == 0


@pytest.mark.classic_only  # the `cdc` process's own driver: a Connect client has none
def test_a_driver_out_of_memory_names_the_setting(workspace: Workspace) -> None:
    """A 300 MB change line in a 500 MB driver (CDC_SPARK_DRIVER_MEMORY): one line with the
    setting, exit 1, nothing committed. (200,000 lines of 1 KB were once enough; since flat
    JSON lines are read in one pass, 400,000 are not. The line is past CDC_MAX_LINE_BYTES's
    default, which refuses the file before Spark reads it: the limit is raised to reach Spark.)"""
    configure(workspace)
    folder = workspace.landing / "j" / "dt=2024-01-01" / "hr=00"
    folder.mkdir(parents=True)
    with (folder / "big.json").open("w") as out:
        out.write('{"FLAG": "I", "ID": 1, "V": "a", "TS": "2024-01-01 00:00:00"}\n')
        out.write('{"FLAG": "I", "ID": 2, "V": "' + "x" * 300_000_000 + '", "TS": "2024-01-01"}\n')
    result = cdc(
        workspace,
        "run",
        "j",
        *HOUR_0,
        timeout=900,
        CDC_SPARK_DRIVER_MEMORY="500m",
        CDC_MAX_LINE_BYTES=str(400 << 20),
    )
    assert result.returncode == 1, result.stderr
    assert last_line(result) == (
        "error: run j: Spark ran out of memory (java.lang.OutOfMemoryError): driver memory is "
        f"500m: set CDC_SPARK_DRIVER_MEMORY higher, e.g. 4g; {NOTHING_PAST}"
    )
    assert not (workspace.paths("j").final / "_delta_log").exists()


@pytest.mark.classic_only
def test_a_driver_memory_that_is_not_a_size_is_refused(workspace: Workspace) -> None:
    configure(workspace)
    result = cdc(workspace, "run", "j", *HOUR_0, CDC_SPARK_DRIVER_MEMORY="lots")
    assert result.returncode == 2, result.stderr
    assert last_line(result) == (
        "error: run: CDC_SPARK_DRIVER_MEMORY='lots' must be a JVM memory size such as 2g or 4096m"
    )
