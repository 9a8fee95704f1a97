"""Step `reset-staging`: staging := final + tombstones (plus changes not applied yet), atomically.

Staging is replaced by the latest change per key over staging, final and tombstones: once every
staged interval is applied that is exactly final plus the remembered deletes; a change staged
but not yet applied that still wins is kept, so a later overwrite-final of its interval applies
it. A file appended while the reset runs is not in the snapshot it replaces and survives it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame

from cdc_pipeline.counts import ResetCounts
from spark_jobs import delta
from spark_jobs.overwrite import history
from spark_jobs.overwrite_final import as_changes
from spark_jobs.rules.transforms import (
    BATCH,
    latest_arrival_per_key_and_sequence,
    latest_change_per_key,
)
from spark_jobs.runtime.args import StepArgs
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.entry import run_step
from spark_jobs.runtime.report import StepReport


def compacted_staging(context: StepContext, staging: delta.Snapshot) -> DataFrame:
    """What staging holds after the reset."""
    spark, table, paths = context.spark, context.table, context.paths
    staged = delta.read_snapshot(spark, staging)
    columns = staged.columns
    final = delta.load_snapshot(paths.final)
    current = delta.read_snapshot(spark, final) if final.exists else None
    if table.insert_only:
        # Events are never replaced: keep only staged events final does not hold yet.
        pending = latest_arrival_per_key_and_sequence(staged, table.keys, table.sequence_by)
        if current is None:
            return pending
        identity = [*table.keys, *table.sequence_by]
        return pending.join(current.select(*identity), on=identity, how="left_anti")
    candidates = staged
    if current is not None:
        candidates = candidates.unionByName(as_changes(current, columns, "U"))
    tombstones = delta.load_snapshot(paths.tombstones)
    if tombstones.exists:
        candidates = candidates.unionByName(
            as_changes(delta.read_snapshot(spark, tombstones), columns, "D")
        )
    return latest_change_per_key(candidates, table.keys, table.sequence_by).select(*columns)


def run_reset_staging(context: StepContext) -> StepReport[ResetCounts]:
    """Replace staging by its compacted form in one overwrite commit, holding the table's lease:
    delta-rs lets an overwrite commit after an optimize's OPTIMIZE of the files it read, which
    would leave the old rows beside the new (a stage's append meanwhile is kept, as it should)."""
    delta.inject_fault("reset_staging:before_lease")
    with delta.holding_lease(context.paths.leases, "reset-staging"):
        return _reset_staging(context)


def _reset_staging(context: StepContext) -> StepReport[ResetCounts]:
    """Replace staging by its compacted form in one overwrite commit."""
    paths = context.paths
    report = StepReport("reset-staging", context.table.name, "", ResetCounts())

    def attempt(number: int) -> StepReport[ResetCounts] | None:
        staging = delta.load_snapshot(paths.staging)
        if not staging.exists:
            report.result.reset(0, 0, -1)
            return report
        if context.table.history and number == 1:
            history.flush_staging(context, delta.read_snapshot(context.spark, staging), report)
        rows = compacted_staging(context, staging)
        run_id = delta.new_run_id()
        written = delta.write_files(rows, paths.staging, [BATCH], run_id)
        delta.inject_fault("reset_staging:before_commit")
        result = delta.try_commit(
            staging, written, "overwrite", step="reset_staging", run_id=run_id
        )
        if result is None:
            return None
        report.result.reset(staging.num_records, written.rows, result.version)
        return report

    return delta.with_retries(f"table {context.table.name}: reset-staging", attempt)


def reset_staging_step(context: StepContext, args: StepArgs) -> StepReport[ResetCounts]:
    """`cdc reset-staging` body."""
    return run_reset_staging(context)


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: reset_staging TABLE."""
    return run_step("reset_staging", argv)


if __name__ == "__main__":
    sys.exit(main())
