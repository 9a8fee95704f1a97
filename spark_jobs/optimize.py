"""Step `optimize`: compact small files and Z-order final, only in partitions with several files."""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Sequence

from deltalake.exceptions import CommitFailedError

from cdc_pipeline.counts import OptimizeCounts
from cdc_pipeline.paths import Location
from spark_jobs import delta
from spark_jobs.runtime.args import StepArgs
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.entry import run_step
from spark_jobs.runtime.report import StepReport

# A file under half of delta-rs's 100 MiB optimize target is small: compacting it pays off.
SMALL_FILE_BYTES = 50 * 1024 * 1024


def partitions_needing_optimize(snapshot: delta.Snapshot) -> list[str | None] | None:
    """Partition values (as log strings) holding two or more small files; None: unpartitioned.

    Partitions whose files are already large, or that hold a single file, are left alone, so an
    optimize after a run rewrites only what the runs fragmented.
    """
    if not snapshot.partition_columns:
        return None
    column = snapshot.partition_columns[0]
    counts = Counter(
        delta.partition_value_string(f.partition_values.get(column))
        for f in snapshot.files
        if f.size < SMALL_FILE_BYTES
    )
    return sorted(
        (value for value, n in counts.items() if n > 1), key=lambda v: (v is None, v or "")
    )


def optimize_table(path: Location, zorder_by: Sequence[str] = ()) -> tuple[int, int, int]:
    """Bin-pack (and Z-order) a table where it has several files: (files before, after, partitions)."""

    def attempt(_: int) -> tuple[int, int, int] | None:
        snapshot = delta.load_snapshot(path)
        if snapshot.table is None:
            return 0, 0, 0
        before = len(snapshot.files)
        needy = partitions_needing_optimize(snapshot)
        small = sum(1 for f in snapshot.files if f.size < SMALL_FILE_BYTES)
        if (needy is None and small <= 1) or needy == []:
            return before, before, 0
        filters = None
        if needy is not None:
            filters = [(snapshot.partition_columns[0], "in", [v for v in needy if v is not None])]
        try:
            if zorder_by:
                snapshot.table.optimize.z_order(list(zorder_by), partition_filters=filters)
            else:
                snapshot.table.optimize.compact(partition_filters=filters)
        except CommitFailedError:
            return None
        after = len(delta.load_snapshot(path).files)
        return before, after, len(needy) if needy is not None else 1

    return delta.with_retries(f"{path}: optimize", attempt)


def add_table_properties(path: Location) -> None:
    """Give a table made before TABLE_PROPERTIES existed the ones it lacks (a property already
    set, perhaps by its owner, is kept); a commit that loses a race waits for the next optimize."""
    table = delta.open_table(path)
    if table is None:
        return
    configuration = table.metadata().configuration
    missing = {k: v for k, v in delta.TABLE_PROPERTIES.items() if k not in configuration}
    if missing:
        with contextlib.suppress(CommitFailedError):
            table.alter.set_table_properties(missing)


def checkpoint(path: Location) -> None:
    """Write a checkpoint so readers need not replay every commit."""
    snapshot = delta.load_snapshot(path)
    if snapshot.table is not None:
        snapshot.table.create_checkpoint()


def run_optimize(context: StepContext) -> StepReport[OptimizeCounts]:
    """Optimize final (Z-ordered by zorder_by), then compact staging, quarantine and tombstones;
    holding the table's lease (delta-rs commits two OPTIMIZEs of the same files, doubling
    their rows, and an overwrite after an OPTIMIZE of what it read)."""
    delta.inject_fault("optimize:before_lease")
    with delta.holding_lease(context.paths.leases, "optimize"):
        return _optimize_tables(context)


def _optimize_tables(context: StepContext) -> StepReport[OptimizeCounts]:
    """Optimize final, then compact the table's other Delta tables and checkpoint them."""
    delta.inject_fault("optimize:holding_lease")
    table, paths = context.table, context.paths
    add_table_properties(paths.final)
    before, after, partitions = optimize_table(paths.final, table.zorder_by)
    counts = OptimizeCounts(
        final_files_before=before, final_files_after=after, partitions_optimized=partitions
    )
    others = [
        ("staging", paths.staging),
        ("quarantine", paths.quarantine),
        ("tombstones", paths.tombstones),
        # Driver-side metadata appended by every run: a file and a commit each time.
        ("ledger", paths.ledger),
        ("applied", paths.applied),
    ]
    if table.history:
        others += [("history", paths.history), ("history_log", paths.history_log)]
    for name, path in others:
        add_table_properties(path)
        before, after, _ = optimize_table(path)
        counts.others[f"{name}_files"] = f"{before}->{after}"
    for path in (paths.final, paths.staging, paths.ledger, paths.applied):
        checkpoint(path)
    counts.final_version = delta.load_snapshot(paths.final).version
    return StepReport("optimize", table.name, "", counts)


def optimize_step(context: StepContext, args: StepArgs) -> StepReport[OptimizeCounts]:
    """`cdc optimize` body."""
    return run_optimize(context)


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: optimize TABLE."""
    return run_step("optimize", argv)


if __name__ == "__main__":
    sys.exit(main())
