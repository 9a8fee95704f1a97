"""Step `stage`: the interval's landed change files into the staging table (bad rows to quarantine).

Plan (`staging.plan`) -> read and type (`staging.rows`) -> settle a crashed run's leftovers
(`staging.recovery`) -> commit staging, then quarantine (`staging.commit`) -> the ledger
(`staging.ledger`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from cdc_pipeline.counts import StageCounts, count
from cdc_pipeline.intervals import Interval
from spark_jobs import delta, landing
from spark_jobs.runtime.args import StepArgs
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.entry import run_step
from spark_jobs.runtime.report import StepReport
from spark_jobs.staging.commit import commit_rows
from spark_jobs.staging.ledger import append_ledger, staged_ledger_rows
from spark_jobs.staging.notices import warn_landing, warn_outside_window
from spark_jobs.staging.plan import files_in, plan_stage, planned_counts, refused_files
from spark_jobs.staging.recovery import leave_changed_files, settle_crashed_run
from spark_jobs.staging.rows import read_planned


@delta.reusing_tables()
def run_stage(context: StepContext, interval: Interval) -> StepReport[StageCounts]:
    """Stage every landed file version not staged yet in the hours the run lists (the
    late-arrival window up to the interval's end); quarantine the rows that cannot be applied and
    the entries that cannot be read (links, unreadable files, contradicting Parquet schemas).

    Runs of one table may overlap (their windows do): staging takes one run's files at a time.
    An attempt whose staging commit is not the first after its plan plans again, and finds the
    other run's files in staging instead of staging them twice.

    A Kafka table stages its topic's messages instead (`kafka.staging`)."""
    if context.table.source == "kafka":
        from spark_jobs.kafka.staging import run_kafka_stage

        return run_kafka_stage(context, interval)
    return delta.with_retries(
        f"table {context.table.name}: stage", lambda _: _stage_attempt(context, interval)
    )


def _stage_attempt(context: StepContext, interval: Interval) -> StepReport[StageCounts] | None:
    """One plan-read-commit of the stage step; None when another run staged first."""
    spark, table, paths = context.spark, context.table, context.paths
    plan = plan_stage(context, interval)
    planned = planned_counts(plan)
    warn_landing(table, interval, plan.listing, plan.files, plan.refusals)
    warn_outside_window(table, interval, plan.outside_window)
    quarantine = delta.load_snapshot(paths.quarantine)
    now, run_id = datetime.now(UTC), delta.new_run_id()
    ledger_rows = [
        landing.ledger_row(
            f,
            f.batch,
            f.file,
            staged=0,
            quarantined=0,
            refused=entry.refused,
            now=now,
            run_id=run_id,
        )
        for f, entry in plan.files.touched
    ]
    if not plan.pending and not plan.refusals:
        append_ledger(paths.ledger, ledger_rows)
        counts = replace(
            planned, staging_version=plan.staging.version, quarantine_version=quarantine.version
        )
        return StepReport("stage", table.name, str(interval), counts)
    # A crash between the staging, quarantine and ledger commits leaves a file recorded in some
    # of them: each table takes only the rows of files it does not hold yet.
    batches = sorted({f.batch for f in plan.pending} | {r.batch for r in plan.refusals})
    in_staging = files_in(spark, plan.staging, batches)
    in_quarantine = files_in(spark, quarantine, batches)
    delta.inject_fault("stage:before_first_write")
    rows = read_planned(context, interval, plan, in_staging)
    try:
        rows = settle_crashed_run(context, rows, in_staging, in_quarantine, now, run_id)
        rows = leave_changed_files(table, interval, rows)
        committed = commit_rows(context, rows, in_quarantine, quarantine)
    finally:
        for done_with in rows.release:
            done_with()
    if committed is None:
        return None
    delta.inject_fault("stage:before_ledger_commit")
    append_ledger(paths.ledger, ledger_rows + staged_ledger_rows(rows, now, run_id))
    counts = replace(
        planned.with_reported(rows.found),
        rows_read=sum(int(r["good"]) + int(r["bad"]) for r in rows.per_file),
        staged=committed.staged,
        quarantined=committed.quarantined,
        files_refused=refused_files(rows.plan),
        files_deferred=count(planned.files_deferred) + rows.changed_while_read,
        staging_version=committed.staging_version,
        quarantine_version=committed.quarantine_version,
    )
    return StepReport("stage", table.name, str(interval), counts)


def stage_step(context: StepContext, args: StepArgs) -> StepReport[StageCounts]:
    """`cdc stage` body."""
    return run_stage(context, args.required_interval())


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: stage TABLE --start TS --end TS."""
    return run_step("stage", argv)


if __name__ == "__main__":
    sys.exit(main())
