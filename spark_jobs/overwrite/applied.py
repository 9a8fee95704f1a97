"""What final has applied: one row per staged file version whose changes overwrite-final applied.

The ledger says which file versions are in staging; this table says which of them final (and
history) has taken in. Their difference is what the next overwrite-final applies, whatever hour
folder the files came from and whichever run staged them: a file that lands in an old hour's
folder, or that a sub-hourly run staged after the hour's first run, is applied by the next run.

A mark is appended only after final's commit, so a crash between the two leaves the file
pending and the next run applies it again, which changes nothing (ranking against final's own
rows is idempotent: a tie goes to the copy already in final). Marks are a set: two runs that
applied the same file both mark it, harmlessly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_pipeline.paths import TablePaths
from spark_jobs import delta
from spark_jobs.landing import Ledger, LedgerEntry, read_ledger

APPLIED_SCHEMA = pa.schema(
    [
        ("batch", pa.string()),
        ("file", pa.string()),
        ("rows", pa.int64()),  # rows the ledger says were staged from the file version
        ("landed_mtime_ns", pa.int64()),  # the file's mtime when it was staged
        ("applied_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
        ("final_version", pa.int64()),  # final's version once the file's changes were in
    ]
)


@dataclass(frozen=True)
class Pending:
    """The staged file versions final has not applied yet, as read before staging's snapshot."""

    files: tuple[LedgerEntry, ...]
    # Every staged version of their batches is pending: the batches are read whole.
    whole_batches: bool = True

    @property
    def batches(self) -> list[str]:
        """The staging partitions (hour batches) holding them."""
        return sorted({f.batch for f in self.files})

    @property
    def idents(self) -> set[tuple[str, str]]:
        """(batch, file) of each."""
        return {f.ident for f in self.files}

    @property
    def rows(self) -> int:
        """Rows the ledger says were staged from them (after a reset-staging, staging may hold
        fewer: a pending change that lost to a later one was compacted away)."""
        return sum(f.rows_staged for f in self.files)


def applied_keys(paths: TablePaths) -> pa.Table:
    """(batch, file) of every mark, as Arrow columns (a version two runs marked appears twice)."""
    keys = delta.arrow_table(paths.applied, ["batch", "file"])
    return keys if keys is not None else APPLIED_SCHEMA.empty_table().select(["batch", "file"])


def pending_files(
    paths: TablePaths,
    *,
    whole_extracts: bool = False,
    ledger: Ledger | None = None,
    marks: pa.Table | None = None,
) -> Pending:
    """Staged file versions not applied yet (read the ledger before staging's snapshot: staging
    is committed before the ledger, so every version listed here has its rows there).

    A full-extract table also counts versions that staged no row (an empty extract deletes).
    Compared as Arrow columns: only the pending versions become Python objects. `ledger` and
    `marks` (applied's rows): already read by the caller, read after the ledger."""
    if ledger is None:
        ledger = read_ledger(delta.arrow_table(paths.ledger))
    staged = ledger.staged(whole_extracts=whole_extracts)
    done = applied_keys(paths) if marks is None else marks.select(["batch", "file"])
    pending = staged.join(done, ["batch", "file"], join_type="left anti")
    if pending.num_rows == 0:
        return Pending(())
    batches = pc.unique(pending["batch"])
    in_batches = staged.filter(pc.is_in(staged["batch"], value_set=batches))
    whole = in_batches.join(done, ["batch", "file"], join_type="left semi").num_rows == 0
    entries = Ledger(pending).entries()
    return Pending(tuple(entries[ident] for ident in sorted(entries)), whole)


def mark_applied(
    paths: TablePaths, pending: Pending, run_id: str, final_version: int | None
) -> None:
    """Record the pending file versions as applied (after final's commit)."""
    if not pending.files:
        return
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = [
        {
            "batch": f.batch,
            "file": f.file,
            "rows": f.rows_staged,
            "landed_mtime_ns": f.mtime_ns,
            "applied_at": now,
            "run_id": run_id,
            "final_version": final_version,
        }
        for f in pending.files
    ]
    delta.append_arrow(paths.applied, pa.Table.from_pylist(rows, APPLIED_SCHEMA))


def applied_marks(paths: TablePaths) -> pa.Table:
    """Every mark, as Arrow columns (empty when final applied nothing yet)."""
    marks = delta.arrow_table(paths.applied)
    return marks if marks is not None else APPLIED_SCHEMA.empty_table()


def distinct_versions(marks: pa.Table) -> int:
    """The file versions the marks name (a version two runs applied counts once)."""
    return marks.select(["batch", "file"]).group_by(["batch", "file"]).aggregate([]).num_rows
