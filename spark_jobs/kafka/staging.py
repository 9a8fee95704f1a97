"""Step `stage` of a Kafka table: the messages not staged yet into staging, exactly once.

Plan (`offsets.plan_ranges`: the staged offsets in staging's log against the broker's end
offsets now) -> read the ranges (`reading`) and parse them as the landed JSON lines are
(`formats.reading.read_json_changes`) -> type and split (`staging.rows.type_read`) -> quarantine
the bad rows -> one exclusive staging commit holding the good rows AND the new offsets -> the ledger (one
row per range: what overwrite-final applies, as for a landed file).

Quarantine is committed before staging: staging's commit is what marks the range consumed, so a
crash between the two reads the range again, and its bad rows already in quarantine are not
written twice. A crash after staging's commit and before the ledger's leaves ranges staged but
unrecorded: the next run finds them (`recover_unrecorded`) before it plans.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from deltalake.transaction import Transaction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.counts import StageCounts
from cdc_pipeline.intervals import Interval, batch_id
from spark_jobs import delta, landing
from spark_jobs.formats.reading import read_json_changes
from spark_jobs.kafka import broker
from spark_jobs.kafka.lag import require_properties
from spark_jobs.kafka.offsets import (
    FILE_PREFIX,
    KafkaPlan,
    OffsetRange,
    app_id,
    plan_ranges,
    range_of_file,
    staged_offsets,
)
from spark_jobs.kafka.reading import read_messages
from spark_jobs.rules.transforms import BATCH, FILE, ROW
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.report import StepReport
from spark_jobs.staging.commit import evolve_quarantine
from spark_jobs.staging.ledger import append_ledger
from spark_jobs.staging.rows import NEWEST, TypedRead, type_read

# `_cdc_file` up to the partition: "kafka-00003" (a message is its partition and offset).
_PARTITION_PREFIX = len(FILE_PREFIX) + 5


def run_kafka_stage(context: StepContext, interval: Interval) -> StepReport[StageCounts]:
    """Stage the messages of the table's topic not staged yet, up to the end offsets the broker
    has when the attempt starts (messages arriving during the run wait for the next one)."""
    table = context.table
    properties = require_properties(table)
    return delta.with_retries(
        f"table {table.name}: stage",
        lambda _: _attempt(context, interval, properties),
    )


def _attempt(
    context: StepContext, interval: Interval, properties: Mapping[str, str]
) -> StepReport[StageCounts] | None:
    """One plan-read-commit; None when another run committed to staging first."""
    table, paths = context.table, context.paths
    assert table.topic is not None
    staging = delta.load_snapshot(paths.staging)
    offsets = broker.topic_offsets(properties, table.topic)
    now, run_id = datetime.now(UTC), delta.new_run_id()
    recover_unrecorded(context, staging, list(offsets.partitions), now, run_id)
    plan = plan_ranges(table, staging, offsets, now)
    quarantine = delta.load_snapshot(paths.quarantine)
    if not plan.ranges:
        counts = StageCounts(
            messages=0,
            staged=0,
            quarantined=0,
            staging_version=staging.version,
            quarantine_version=quarantine.version,
        )
        return StepReport("stage", table.name, str(interval), counts)
    delta.inject_fault("stage:kafka_planned")
    try:
        committed, quarantined, quarantine_version, typed = _read_and_commit(
            context, interval, properties, plan, staging
        )
    except Exception as error:
        unreachable = broker.unreachable_during_read(error, properties, table.topic)
        if unreachable is None:
            raise
        raise unreachable from error
    if committed is None:
        return None
    staged, staging_version = committed
    delta.inject_fault("stage:before_ledger_commit")
    append_ledger(paths.ledger, _ledger_rows(plan, typed.per_file, now, run_id))
    counts = StageCounts(
        messages=plan.messages,
        messages_lost=plan.lost or None,
        rows_read=sum(int(r["good"]) + int(r["bad"]) for r in typed.per_file),
        staged=staged,
        quarantined=quarantined,
        skipped=typed.found.skipped,
        undeclared_columns_ignored=typed.found.undeclared_columns_ignored,
        columns_added=typed.found.columns_added,
        columns_widened=typed.found.columns_widened,
        staging_version=staging_version,
        quarantine_version=quarantine_version,
    )
    return StepReport("stage", table.name, str(interval), counts)


def _read_and_commit(
    context: StepContext,
    interval: Interval,
    properties: Mapping[str, str],
    plan: KafkaPlan,
    staging: delta.Snapshot,
) -> tuple[tuple[int, int] | None, int, int, TypedRead]:
    """Read the planned ranges, then commit quarantine and staging: (staging's (rows, version),
    None when another run committed first; quarantined rows; quarantine's version; the typed
    read)."""
    spark = context.spark
    messages = read_messages(spark, properties, plan)
    read = read_json_changes(spark, context.table, messages.lines, messages.tombstones)
    delta.inject_fault("stage:before_first_write")
    # A run read on the driver (tombstones counted there) is small enough for one task.
    small = messages.tombstones is not None
    typed = type_read(context, interval, read, read.frame, staging, [plan.batch], small=small)
    try:
        quarantined, quarantine_version = _commit_quarantine(context, typed, plan)
        delta.inject_fault("stage:before_staging_commit")
        committed = _commit_staging(context, typed.good, plan)
    finally:
        for done_with in [*typed.release, read.release]:
            done_with()
    return committed, quarantined, quarantine_version, typed


def _commit_quarantine(context: StepContext, typed: TypedRead, plan: KafkaPlan) -> tuple[int, int]:
    """Append the bad rows to quarantine, but not those of messages a crashed attempt already
    quarantined (same partition and offset); returns (rows, version)."""
    paths = context.paths
    quarantine = delta.load_snapshot(paths.quarantine)
    if not any(int(r["bad"]) for r in typed.per_file):
        delta.ensure_table(paths.quarantine, typed.bad.schema, [BATCH])
        return 0, delta.load_snapshot(paths.quarantine).version
    bad = typed.bad
    if quarantine.exists and quarantine.schema is not None:
        earlier = (
            delta.read_snapshot(context.spark, quarantine, columns=[FILE, ROW])
            .filter(F.col(FILE).startswith(FILE_PREFIX))
            .select(F.substring(F.col(FILE), 1, _PARTITION_PREFIX).alias("__partition"), ROW)
        )
        bad = bad.join(
            earlier,
            on=[
                F.substring(bad[FILE], 1, _PARTITION_PREFIX) == earlier["__partition"],
                bad[ROW] == earlier[ROW],
            ],
            how="left_anti",
        )
    evolve_quarantine(context.spark, paths.quarantine, bad.schema)
    delta.ensure_table(paths.quarantine, bad.schema, [BATCH])
    return delta.append_with_retries(bad, paths.quarantine, "quarantine")


def _commit_staging(
    context: StepContext, good: DataFrame, plan: KafkaPlan
) -> tuple[int, int] | None:
    """The good rows and the ranges' end offsets in one commit, the first data commit after the
    snapshot the run planned from (else None: plan again from the offsets now recorded)."""
    path = context.paths.staging
    delta.ensure_table(path, good.schema, [BATCH])
    current = delta.load_snapshot(path)
    if delta.data_commits_between(
        path, plan.staging.version, current.version, ignore=("evolve_schema",)
    ):
        return None
    run_id = delta.new_run_id()
    plain = delta.plain_columns(path, current.files)
    written = delta.write_files(good, path, current.partition_columns, run_id, plain=plain)
    millis = int(time.time() * 1000)
    transactions = [
        Transaction(app_id=app_id(plan.topic, r.partition), version=r.end, last_updated=millis)
        for r in plan.ranges
    ]
    result = delta.try_commit(
        current,
        written,
        "append",
        step="stage",
        run_id=run_id,
        exclusive=True,
        app_transactions=transactions,
    )
    return None if result is None else (written.rows, result.version)


def _ledger_rows(
    plan: KafkaPlan, per_file: Sequence[Mapping[str, Any]], now: datetime, run_id: str
) -> list[dict[str, Any]]:
    """One ledger row per range (a range with no good row too: the ledger then knows every
    offset the table consumed)."""
    counts = {(r[BATCH], r[FILE]): r for r in per_file}
    rows = []
    for offset_range in plan.ranges:
        found = counts.get((plan.batch, offset_range.file), {})
        newest = found.get(NEWEST)
        rows.append(
            _range_row(
                plan.batch,
                offset_range,
                staged=int(found.get("good") or 0),
                quarantined=int(found.get("bad") or 0),
                now=now,
                run_id=run_id,
                newest=datetime.fromisoformat(newest).replace(tzinfo=UTC) if newest else None,
            )
        )
    return rows


def _range_row(
    batch: str,
    offset_range: OffsetRange,
    *,
    staged: int,
    quarantined: int,
    now: datetime,
    run_id: str,
    newest: datetime | None = None,
) -> dict[str, Any]:
    """The ledger row of one range: its messages as the size; no mtime or hash."""
    row = landing.ledger_row(
        None,
        batch,
        offset_range.file,
        staged=staged,
        quarantined=quarantined,
        refused=None,
        now=now,
        run_id=run_id,
        newest_change=newest,
    )
    row["size"] = offset_range.messages
    return row


def recover_unrecorded(
    context: StepContext,
    staging: delta.Snapshot,
    partitions: list[int],
    now: datetime,
    run_id: str,
) -> None:
    """Ledger rows for ranges a crashed run committed to staging but not to the ledger.

    Each partition's staged offset is the end of the last range committed; when no ledger row
    ends there, staging's Kafka ranges missing from the ledger are looked up (a scan of
    staging's arrival columns, only then) and recorded, so overwrite-final applies them."""
    table, paths = context.table, context.paths
    assert table.topic is not None
    staged = staged_offsets(staging, table.topic, partitions)
    if not staged:
        return
    ledger = landing.read_ledger(delta.arrow_table(paths.ledger)).idents()
    ends: dict[int, set[int]] = {}
    for _, file in ledger:
        recorded = range_of_file(file)
        if recorded is not None:
            ends.setdefault(recorded.partition, set()).add(recorded.end)
    missing = {p for p, offset in staged.items() if offset not in ends.get(p, set())}
    if not missing:
        return
    found = (
        delta.read_snapshot(context.spark, staging, columns=[BATCH, FILE])
        .filter(F.col(FILE).startswith(FILE_PREFIX))
        .groupBy(BATCH, FILE)
        .count()
        .collect()  # metadata: one row per staged range
    )
    rows = []
    for row in found:
        recorded = range_of_file(row[FILE])
        if recorded is None or (row[BATCH], row[FILE]) in ledger:
            continue
        rows.append(
            _range_row(
                row[BATCH],
                recorded,
                staged=int(row["count"]),
                quarantined=0,
                now=now,
                run_id=run_id,
            )
        )
        ends.setdefault(recorded.partition, set()).add(recorded.end)
    # A committed range with no good row left nothing in staging: an empty range ending at the
    # staged offset records that the table consumed up to there.
    for partition in sorted(missing):
        offset = staged[partition]
        if offset not in ends.get(partition, set()):
            empty = OffsetRange(partition=partition, start=offset, end=offset)
            batch = batch_id(f"{now:%Y-%m-%d}", f"{now:%H}")
            rows.append(_range_row(batch, empty, staged=0, quarantined=0, now=now, run_id=run_id))
    if rows:
        append_ledger(paths.ledger, rows)
