"""Commit: one atomic delta-rs commit from the snapshot a step read, and the one retry policy.

Every step that commits goes through `with_retries`: an attempt that loses a commit race deletes
what it wrote and returns None, and the attempt is made again from a new snapshot after a
jittered back-off, at most MAX_COMMIT_ATTEMPTS times.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Schema, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction, Transaction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from cdc_pipeline.errors import ConcurrentWriteError
from cdc_pipeline.paths import Location
from spark_jobs.delta.faults import inject_fault
from spark_jobs.delta.reading import (
    TABLE_PROPERTIES,
    DataFile,
    Snapshot,
    commit_file,
    finished,
    load_snapshot,
    open_table,
    partition_value_string,
    read_snapshot,
)
from spark_jobs.delta.writing import WrittenFiles, write_files
from spark_jobs.runtime.storage import store_for

RUN_ID_KEY = "cdc_run_id"


STEP_KEY = "cdc_step"


# Operations that rearrange files without changing what a table holds.
_NON_DATA_OPERATIONS = {
    # Not OPTIMIZE: it replaces files an overwrite may have read, and delta-rs lets that
    # overwrite commit, leaving the compacted copy beside its rewrite.
    "VACUUM START",
    "VACUUM END",
    "CREATE TABLE",
    "SET TBLPROPERTIES",
}


def new_run_id() -> str:
    """A unique id for one attempt of one step; also names the files it writes."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


# delta-rs' write modes: "append" adds the files; "overwrite" also removes every file of the
# snapshot that matches the commit's `partition_filters` (all files when None).
CommitMode = Literal["append", "overwrite"]


@dataclass(frozen=True)
class CommitResult:
    """The version a commit produced and whether other data commits slipped in before it."""

    version: int
    interfering_versions: list[int]


def commit(
    snapshot: Snapshot,
    written: WrittenFiles,
    mode: CommitMode,
    *,
    step: str,
    run_id: str,
    partition_filters: list[tuple[str, str, Any]] | None = None,
    schema: StructType | None = None,
    exclusive: bool = False,
    removed: Sequence[DataFile] = (),
    app_transactions: Sequence[Transaction] = (),
) -> CommitResult:
    """Commit the written files from `snapshot`'s version in one atomic delta-rs commit.

    `mode`: see CommitMode; an overwrite may also change the table's schema to `schema`.
    Raises CommitFailedError when a concurrent commit conflicts; the caller deletes its files
    and retries from a new snapshot.

    `removed`: files of the snapshot the commit also removes (mode "append" only: a rewrite of
    some files, their rows replaced by the written ones).

    `app_transactions`: Delta txn actions committed with the files (a Kafka table's staged
    offsets: `spark_jobs.kafka.offsets`); an append of no files may carry only them.

    `exclusive`: commit only as the version right after the snapshot (delta-rs
    max_commit_retries=0), so any commit landing after the read fails this one. For rewrites:
    delta-rs lets an overwrite commit after commits it does not see as conflicts, an OPTIMIZE
    that compacted files the overwrite read (its copy of those rows would stay beside the
    rewrite), or another overwrite that created the same new partition.
    """
    if snapshot.table is None or snapshot.schema is None:
        raise ValueError(f"no Delta table at {snapshot.path}")
    if removed and mode != "append":
        raise ValueError('commit: files are removed by name only in mode "append"')
    actions: list[AddAction | RemoveAction] = list(written.actions)
    now = int(time.time() * 1000)
    actions += [
        RemoveAction(
            path=f.path,  # as the log holds it (delta-rs encodes it again when it writes it)
            data_change=True,
            deletion_timestamp=now,
            size=f.size,
            partition_values={c: partition_value_string(v) for c, v in f.partition_values.items()},
        )
        for f in removed
    ]
    snapshot.table.create_write_transaction(
        actions,
        mode=mode,
        schema=Schema.from_json((schema or snapshot.schema).json()),
        partition_by=snapshot.partition_columns or None,
        partition_filters=partition_filters,
        commit_properties=CommitProperties(
            custom_metadata={RUN_ID_KEY: run_id, STEP_KEY: step},
            max_commit_retries=0 if exclusive else None,
            app_transactions=list(app_transactions) or None,
        ),
    )
    return find_commit(snapshot.path, snapshot.version, run_id)


def find_commit(path: Location, read_version: int, run_id: str) -> CommitResult:
    """Locate our commit after `read_version` and list data commits made between the two.

    Reads the commit files of the log (the Delta protocol's `_delta_log/<version>.json`)
    instead of `DeltaTable.history`: delta-rs 1.6 labels history entries from the version
    the table object loaded, so a commit landing between that load and the call shifts every
    label (seen here under three concurrent runs: our commit "not found", or another run's
    commit taken for one made before our read).
    """
    between: list[int] = []
    version = read_version + 1
    while True:
        info = commit_info(path, version)
        if info is None:
            raise RuntimeError(f"commit of run {run_id} not found in the log of {path}")
        if info.get(RUN_ID_KEY) == run_id:
            return CommitResult(version, between)
        if info.get("operation") not in _NON_DATA_OPERATIONS:
            between.append(version)
        version += 1


def data_commits_between(
    path: Location, after: int, upto: int, ignore: tuple[str, ...] = ()
) -> list[int]:
    """Versions in (after, upto] that may have changed what the table holds: every commit but
    the non-data operations and those of the steps named in `ignore`."""
    found = []
    for version in range(max(after, -1) + 1, upto + 1):
        info = commit_info(path, version) or {}
        if info.get("operation") in _NON_DATA_OPERATIONS or info.get(STEP_KEY) in ignore:
            continue
        found.append(version)
    return found


def commit_info(path: Location, version: int) -> dict[str, Any] | None:
    """The commitInfo of one version of the table's log; None when there is no such version."""
    text = store_for(path).read_text(commit_file(path, version))
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith('{"commitInfo"'):
            info = json.loads(line)["commitInfo"]
            return info if isinstance(info, dict) else {}
    return {}


def try_commit(
    snapshot: Snapshot,
    written: WrittenFiles,
    mode: CommitMode,
    *,
    step: str,
    run_id: str,
    partition_filters: list[tuple[str, str, Any]] | None = None,
    exclusive: bool = False,
    removed: Sequence[DataFile] = (),
    app_transactions: Sequence[Transaction] = (),
) -> CommitResult | None:
    """Commit, or after a conflict delete the written files and return None (`with_retries`
    then makes the next attempt)."""
    try:
        return commit(
            snapshot,
            written,
            mode,
            step=step,
            run_id=run_id,
            partition_filters=partition_filters,
            exclusive=exclusive,
            removed=removed,
            app_transactions=app_transactions,
        )
    except CommitFailedError:
        written.delete()
        return None


T = TypeVar("T")

# The one limit of every commit loop: attempts of a step that keeps losing commit races.
MAX_COMMIT_ATTEMPTS = 10


def with_retries(
    what: str, attempt_once: Callable[[int], T | None], max_attempts: int = MAX_COMMIT_ATTEMPTS
) -> T:
    """Call `attempt_once(1)`, `attempt_once(2)`, ... until one returns a result.

    An attempt returns None when it lost a commit race (having deleted the files it wrote);
    the next one starts from a new snapshot after `retry_delay`. After `max_attempts` lost
    races: ConcurrentWriteError naming `what` (nothing was committed; rerunning is safe).
    """
    for attempt in range(1, max_attempts + 1):
        result = attempt_once(attempt)
        if result is not None:
            return result
        if attempt < max_attempts:
            sleep_before_retry(attempt)
    raise ConcurrentWriteError(
        f"{what}: {max_attempts} conflicting commits in a row; nothing was lost, run the step again"
    )


def retry_delay(attempt: int) -> float:
    """Back-off before attempt `attempt` (1-based) of a step that lost a commit race."""
    return min(8.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + (uuid.uuid4().int % 1000) / 1000)


def sleep_before_retry(attempt: int) -> None:
    """Sleep the back-off of `attempt`."""
    time.sleep(retry_delay(attempt))


def append_with_retries(
    frame: DataFrame, path: Location, step: str, fault_point: str | None = None
) -> tuple[int, int]:
    """Append `frame` to the existing table at `path`; returns (rows, version), retrying conflicts."""

    def attempt(_: int) -> tuple[int, int] | None:
        snapshot = load_snapshot(path)
        run_id = new_run_id()
        written = write_files(frame, path, snapshot.partition_columns, run_id)
        if not written.actions:
            return 0, snapshot.version
        if fault_point is not None:
            inject_fault(fault_point)
        result = try_commit(snapshot, written, "append", step=step, run_id=run_id)
        return None if result is None else (written.rows, result.version)

    return with_retries(str(path), attempt)


def remove_duplicate_rows(spark: SparkSession, path: Location, step: str) -> int:
    """Rewrite a small set-like table (tombstones) with one copy of each row; returns its version."""

    def attempt(_: int) -> int | None:
        snapshot = load_snapshot(path)
        rows = read_snapshot(spark, snapshot)
        if rows.distinct().count() == snapshot.num_records:
            return snapshot.version
        run_id = new_run_id()
        written = write_files(rows.distinct(), path, snapshot.partition_columns, run_id)
        result = try_commit(
            snapshot,
            written,
            "overwrite",
            step=f"{step}_deduplicate",
            run_id=run_id,
            exclusive=True,
        )
        return None if result is None or result.interfering_versions else result.version

    return with_retries(f"{path}: removing duplicate rows", attempt)


# A driver-side table is compacted into one file when an append brings it to this many: every
# run appends one, and reading it is the driver opening each of them (100 files: ~0.1 CPU-s).
APPENDED_FILES_MAX = 10


def append_arrow(path: Location, rows: pa.Table) -> None:
    """Append a small driver-side table (the ledger, applied marks) to the Delta table at `path`,
    creating it; an older table gains new columns (merged schema). Appends never conflict with
    each other: delta-rs retries a lost race by itself, so no attempt loop is needed here.

    Every APPENDED_FILES_MAX appends the table's files are compacted into one (`compact`: the
    same rows, so readers of any version see what they saw); a compaction that loses a race to
    another is left to the next append.
    """
    if not rows.num_rows:
        return
    table = open_table(path)
    if table is None:
        write_deltalake(
            str(path), rows, mode="append", schema_mode="merge", configuration=TABLE_PROPERTIES
        )
        return
    # Written through the loaded table: no second load, and `table` then holds the new version.
    write_deltalake(table, rows, mode="append", schema_mode="merge")
    if len(table.file_uris()) >= APPENDED_FILES_MAX:
        compact(table)
    finished(path, table)


def compact(table: DeltaTable) -> bool:
    """Rewrite the rows of the table's version as one file, committed as the next version;
    False when anything else committed first (nothing written: the next append tries again).

    An overwrite of the rows it read, not delta-rs's OPTIMIZE: two OPTIMIZEs made from the same
    version both commit in delta-rs 1.6 (its conflict check lets a file be removed twice when
    neither removal changes data), so two runs compacting at once doubled every row. It is
    exclusive because delta-rs also lets an overwrite commit after an OPTIMIZE of the files it
    read (an `optimize` step's), which would leave both copies.
    """
    try:
        write_deltalake(
            table,
            table.to_pyarrow_table(),
            mode="overwrite",
            commit_properties=CommitProperties(
                custom_metadata={STEP_KEY: "compact"}, max_commit_retries=0
            ),
        )
    except CommitFailedError:
        return False
    return True
