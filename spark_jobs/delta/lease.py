"""A lease: one maintenance step of a table at a time, for commits that do not conflict.

delta-rs lets two OPTIMIZEs made from the same version of a table both commit (its conflict
check lets a file be removed twice when neither removal changes data), and an overwrite commit
after an OPTIMIZE of the files it read: either way the compacted copy of those rows stays beside
the other. Commit options cannot make OPTIMIZE exclusive (it ignores `max_commit_retries` and
app transactions), so the steps that OPTIMIZE or overwrite a table that others append to
(`optimize`, `reset-staging`) hold the table's lease; other steps' rewrites are exclusive.

The lease is a small Delta table of its own (`{warehouse}/{table}/leases`, no data files)
whose newest claim (holder, until when) or release says who holds it; any other commit after
it (an empty append of a second creator) is skipped. A claim or a release is committed only
as the version right after the one read, so of two claimants the second fails, reads the
claim and waits. A holder that died leaves its claim: it is taken over at once when the
holder was a process of this machine that no longer runs, else when it ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError

from cdc_pipeline.errors import ConcurrentWriteError
from cdc_pipeline.paths import Location
from spark_jobs.delta.committing import commit_info
from spark_jobs.delta.reading import TABLE_PROPERTIES, open_table

LEASE_KEY = "cdc_lease"  # commitInfo: the lease's name; with "holder" and "until" in a claim
_SCHEMA = pa.schema([("lease", pa.string())])  # the table holds no rows: its log is the lease
_POLL_SECONDS = 1.0
# How far back the newest claim or release is looked for (each step commits two in a row).
_SCAN_VERSIONS = 100
# The longest a step holds the lease (a holder on another machine that died is waited for
# this long), and how long another step waits for it.
HOLD_SECONDS = 3 * 3600
WAIT_SECONDS = 600


@contextlib.contextmanager
def holding(
    path: Location, name: str, *, hold: float = HOLD_SECONDS, wait: float = WAIT_SECONDS
) -> Iterator[None]:
    """Hold the lease of the lease table at `path` for step `name` while the block runs; a claim
    lasts at most `hold` seconds. Waits up to `wait` seconds for another holder to release it,
    then fails with ConcurrentWriteError naming it (transient: running the step later works)."""
    until = _claim(path, name, hold, wait)
    try:
        yield
    finally:
        _release(path, until)


def _claim(path: Location, name: str, hold: float, wait: float) -> int:
    """Commit a claim of `name` once no live holder has it; returns its end (epoch ms)."""
    deadline = time.monotonic() + wait
    while True:
        table, holder = _current(path)
        if holder is None or not _alive(holder):
            until = int((time.time() + hold) * 1000)
            claim = {LEASE_KEY: name, "holder": _me(), "until": str(until)}
            if _commit(table, claim):
                return until
            if time.monotonic() <= deadline:
                continue  # another claim or release came first: read it
            raise ConcurrentWriteError(
                f"{path}: the lease was not claimed in {wait:.0f} s: every claim lost its commit"
            )
        if time.monotonic() > deadline:
            ends = datetime.fromtimestamp(int(holder["until"]) / 1000, UTC)
            raise ConcurrentWriteError(
                f"{path}: another {holder.get(LEASE_KEY)} holds this table (process "
                f"{holder.get('holder')}) until {ends:%Y-%m-%d %H:%M:%S} UTC at the latest; "
                f"waited {wait:.0f} s. Run it again once that one has ended"
            )
        time.sleep(_POLL_SECONDS)


def _release(path: Location, until: int) -> None:
    """Release the claim that ends at `until` if it is still the newest claim (a claim that
    outlived its end may have been taken over: then it is not ours to release)."""
    for _ in range(5):
        table, holder = _current(path)
        if holder is None or holder.get("until") != str(until) or holder.get("holder") != _me():
            return
        if _commit(table, {LEASE_KEY: "released"}):
            return


def _current(path: Location) -> tuple[DeltaTable, dict[str, str] | None]:
    """The lease table (created if missing) and its live claim; None: nobody holds it. The
    newest claim or release decides, whatever else was committed after it."""
    table = _open(path)
    for version in range(table.version(), max(table.version() - _SCAN_VERSIONS, 0), -1):
        info = commit_info(path, version)
        if info is None:  # cleaned up behind a checkpoint: older than any claim that lasts
            break
        if LEASE_KEY not in info:
            continue
        if "until" not in info or int(info["until"]) <= time.time() * 1000:
            break  # a release, or a claim that has ended
        return table, {k: str(v) for k, v in info.items() if k in (LEASE_KEY, "holder", "until")}
    return table, None


def _open(path: Location) -> DeltaTable:
    """The lease table at `path`, created when there is none (of two creators one makes it,
    the other's creation fails: never an append); a damaged log is TableDamagedError naming
    the fix."""
    for _ in range(5):
        table = open_table(path)
        if table is not None:
            return table
        with contextlib.suppress(DeltaError):
            DeltaTable.create(str(path), _SCHEMA, mode="error", configuration=TABLE_PROPERTIES)
    return DeltaTable(str(path))


def _commit(table: DeltaTable, info: dict[str, str]) -> bool:
    """Commit `info` (no files) as the version right after the table's; False if taken."""
    try:
        table.create_write_transaction(
            [],
            mode="append",
            schema=table.schema(),
            commit_properties=CommitProperties(custom_metadata=info, max_commit_retries=0),
        )
    except CommitFailedError:
        return False
    return True


def _me() -> str:
    """This thread, as a claim names its holder: host:pid:thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def _alive(holder: dict[str, str]) -> bool:
    """Whether the holder may still run: a process of another machine is taken to run until its
    claim ends; one of this machine runs if its pid does (this thread's own claim is a leftover
    of a release that failed: claims do not nest)."""
    host, pid, thread = [*holder.get("holder", "").rsplit(":", 2), "", "", ""][:3]
    if host != socket.gethostname() or not pid.isdigit():
        return True
    if int(pid) == os.getpid():
        return thread != str(threading.get_ident())
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
