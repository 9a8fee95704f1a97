"""Step `vacuum`: delete files no table version within the retention needs (delta-rs, no Spark)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from cdc_pipeline.config import VACUUM_SAFE_HOURS
from cdc_pipeline.counts import VacuumCounts
from cdc_pipeline.errors import UsageError
from cdc_pipeline.paths import Location
from spark_jobs import delta
from spark_jobs.runtime.args import StepArgs
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.entry import run_step
from spark_jobs.runtime.report import StepReport
from spark_jobs.runtime.storage import store_for

SAFE_RETENTION_HOURS = VACUUM_SAFE_HOURS  # one number: the config check says the same


def run_vacuum(
    context: StepContext, retention_hours: int | None, *, force: bool
) -> StepReport[VacuumCounts]:
    """Vacuum every Delta table of the table, and abandoned temporary write folders."""
    table, paths = context.table, context.paths
    hours = table.vacuum_retention_hours if retention_hours is None else retention_hours
    if hours < 0:
        raise UsageError(f"--retention-hours must not be negative (got {hours})")
    if hours < SAFE_RETENTION_HOURS and not force:
        raise UsageError(
            f"retention of {hours} h is below {SAFE_RETENTION_HOURS} h: files a running job or reader "
            "still needs could be deleted; add --force if no run is in progress"
        )
    counts = VacuumCounts(retention_hours=hours)
    for name, path in (
        ("final", paths.final),
        ("staging", paths.staging),
        ("quarantine", paths.quarantine),
        ("tombstones", paths.tombstones),
        ("ledger", paths.ledger),
        ("applied", paths.applied),
        ("history", paths.history),
        ("history_log", paths.history_log),
    ):
        snapshot = delta.load_snapshot(path)
        if snapshot.table is None:
            continue
        # full: also files never committed (left by a crashed run), not only removed ones.
        deleted = snapshot.table.vacuum(
            retention_hours=hours, dry_run=False, enforce_retention_duration=not force, full=True
        )
        counts.deleted[f"{name}_files_deleted"] = len(deleted) + remove_abandoned_writes(
            path, hours
        )
    return StepReport("vacuum", table.name, "", counts)


def remove_abandoned_writes(table_path: Location, hours: int) -> int:
    """Delete temporary write folders of crashed runs older than the retention (by their newest
    file: object storage has no folder times)."""
    tmp = table_path / delta.TMP_DIR
    store = store_for(tmp)
    cutoff = int((time.time() - hours * 3600) * 1e9)
    removed = 0
    for folder in store.list_dir(tmp):
        if not folder.is_dir or folder.is_link:
            continue
        files = list(store.walk(folder.location))
        newest = max((f.mtime_ns or 0 for f in files), default=folder.mtime_ns or 0)
        if newest <= cutoff:
            removed += len(files)
            store.remove_tree(folder.location)
    return removed


def vacuum_step(context: StepContext, args: StepArgs) -> StepReport[VacuumCounts]:
    """`cdc vacuum` body."""
    return run_vacuum(context, args.retention_hours, force=args.force)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry: vacuum TABLE [--retention-hours H] [--force]."""
    return run_step("vacuum", argv)


if __name__ == "__main__":
    sys.exit(main())
