"""Step `overwrite-final`: apply the interval's staged changes by rewriting only the files they
touch.

The final table already holds the winner of every earlier change and the tombstones table the
latest delete of every deleted key, so ranking the interval's changes against the final rows and
tombstones of the same keys gives the answer ranking all of staging would, at a cost that follows
the change set. A run replaces only the files of final that hold a changed key now (found by
their key statistics, then by their key columns), in whatever partition they are: a key that
moves, or is deleted by a key-only D, leaves its old file; new rows go to new files in the
partitions they name. Only the changed keys are ranked; the other rows of the replaced files are
copied as they are; every other file is kept. The files are replaced in one delta-rs commit
made as the version right after the snapshot that was read: if final changed meanwhile, the
attempt is recomputed from a new snapshot, and that recompute replaces the touched partitions
whole.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from cdc_pipeline.columns import RANK, TECHNICAL_PREFIX
from cdc_pipeline.config import TableConfig
from cdc_pipeline.counts import OverwriteCounts, count
from cdc_pipeline.errors import ConfigError
from cdc_pipeline.intervals import Interval
from cdc_pipeline.paths import Location
from spark_jobs import delta
from spark_jobs.overwrite import applied, catalog, history, ranking_sql
from spark_jobs.overwrite.absent import fill_absent
from spark_jobs.overwrite.append_only import append_inserts
from spark_jobs.overwrite.final_table import (
    ONE_TASK_ROWS,
    ONE_WRITER_ROWS,
    evolve_to_staging,
    final_schema,
    partition_filters,
    rows_in,
    tombstone_schema,
)
from spark_jobs.overwrite.key_lookup import (
    ChangedKeys,
    changed_keys_in_spark,
    changed_keys_on_driver,
    files_holding_keys,
    files_in_key_ranges,
    with_keys,
)
from spark_jobs.overwrite.truncates import Cut, at_or_after, truncate_cut
from spark_jobs.rules.transforms import (
    ABSENT,
    ARRIVAL,
    BATCH,
    FILE,
    FLAG,
    TRUNCATE,
    persisted,
    quoted,
    ranking_order,
)
from spark_jobs.runtime.args import StepArgs
from spark_jobs.runtime.context import StepContext
from spark_jobs.runtime.entry import run_step
from spark_jobs.runtime.notices import warn
from spark_jobs.runtime.report import StepReport
from spark_jobs.runtime.session import (
    new_observation,
    observe,
    observed_metrics,
    plan_run,
)

ROUTE = delta.ROUTE_COLUMN  # "final" or "tombstones": which table an output row is for
REMEMBERED = "_cdc_remembered"  # a ranked row that came from tombstones
FROM_CHANGE = "_cdc_from_change"  # a ranked row that came from the interval's changes
CURRENT_ROWS = "_cdc_current_rows"  # how many rows of final the ranked row's key has
MARKS = (REMEMBERED, FROM_CHANGE, CURRENT_ROWS)  # a ranked row's columns after the change's
# After sequence and arrival, (column, descending): a tie (the same delete staged again and
# already remembered) goes to the remembered copy, so a delete that wins is new exactly when it
# is not a remembered one; a tie between a change and its copy in final goes to the copy, so a
# change applied before is no change.
TIEBREAK = ((REMEMBERED, True), (FROM_CHANGE, False))
# Up to this many staged changes, their keys are broadcast to every join (a map-side filter of
# final, no shuffle of its rows); above it Spark chooses (adaptive execution, shuffle joins).
BROADCAST_CHANGES_MAX = 1_000_000
# Up to this many staged changes, the changed keys are collected to the driver (as Arrow, for
# the key-range checks) and the changes are not cached; above it the keys are a cached distinct
# of the changes.
LOCAL_KEYS_MAX = 100_000
# Up to this many changes a run is planned without adaptive execution (`plan_run`).
SMALL_RUN_CHANGES = 1_000


@dataclass
class Plan:
    """What one attempt will write: the files it replaces and the rows replacing them."""

    touched: set[Any] | None  # the partitions the rewrite writes to; None: unpartitioned
    output: DataFrame  # final's new rows and the new tombstones, told apart by ROUTE
    filled: DataFrame  # the changes with the values they did not carry filled in (for history)
    # The verdict's counts over every ranked row, collected by the write that reads them (no
    # Spark job of its own, and the ranking is not cached between two jobs).
    observation: Observation
    winners: DataFrame  # the ranked rows, observed (read again only if the counts are missing)
    forced: bool = False  # a new truncate: the rewrite changes final even if no change wins
    # The files of final the rewrite replaces; None: every file of the touched partitions.
    replaced: list[delta.DataFile] | None = None

    def verdict(self) -> tuple[bool, int]:
        """(whether the rewrite changed nothing, how many winning changes have a column no row
        of their key carried: null in final). Read after `output` was written.

        The rewrite changes nothing (gives final and tombstones exactly the rows they hold)
        when no change wins (a winning change is a new row image or a new delete),
        every winning row of final is its key's only row there, and no remembered delete wins
        over a row of final. Exact ties go to the copy already in final or tombstones, so a
        change applied before (a rerun, a second extract staged the same) does not count.
        """
        row = observed_metrics(self.observation)  # one row of three counts
        if row is None:
            # Not gathered by the write: adaptive execution drops the ranking, observation
            # included, when its input turns out empty at run time. Counted by a job of its own.
            # (A retried task can count its rows twice: the verdict asks only whether a count
            # is zero, which that cannot change.)
            counted = self.winners.agg(*verdict_counts(self.winners))
            row = counted.collect()[0].asDict()  # metadata: one row of three counts
        nothing = not self.forced and bool(row["winners"]) and not row["changing"]
        return nothing, int(row["unfilled"] or 0)


def verdict_counts(winners: DataFrame, has_absent: bool | None = None) -> list[Column]:
    """The verdict's three counts over the ranked rows (`has_absent`: whether they carry the
    absent-columns list, when known without asking Spark)."""
    if has_absent is None:
        has_absent = ABSENT in winners.columns
    unfilled = F.col(FROM_CHANGE) & F.col(ABSENT).isNotNull() if has_absent else F.lit(False)
    return [
        F.count(F.lit(1)).alias("winners"),
        F.sum(F.when(unfilled, 1).otherwise(0)).alias("unfilled"),
        F.sum(
            F.when(
                F.col(FROM_CHANGE)
                | (F.col(REMEMBERED) & (F.col(CURRENT_ROWS) > 0))
                | (~F.col(REMEMBERED) & (F.col(CURRENT_ROWS) != 1)),
                1,
            ).otherwise(0)
        ).alias("changing"),
    ]


def observed_verdict(winners: DataFrame, *, has_absent: bool) -> tuple[DataFrame, Observation]:
    """`winners` observed: the counts `Plan.verdict` reads, gathered as the write reads them."""
    observation = new_observation(winners.sparkSession, f"cdc_verdict_{uuid.uuid4().hex}")
    return observe(winners, observation, *verdict_counts(winners, has_absent)), observation


def as_changes(
    frame: DataFrame,
    columns: Sequence[str],
    flag: str,
    marks: Sequence[str] = (),
    present: Sequence[str] | None = None,
) -> DataFrame:
    """Rows of final or tombstones shaped like staged changes (`columns`, staging's), flagged
    `flag`: U for final's rows, D for tombstones (their other columns null); `marks`
    (expression texts) after them. One projection: each one more is analysed again on the
    driver. `present`: the frame's columns, when known without asking Spark (a table's
    snapshot schema)."""
    have = frame.columns if present is None else present
    return frame.selectExpr(*ranking_sql.as_changes(columns, flag, have, marks))


def plan_rewrite(
    context: StepContext,
    changes: DataFrame,
    *,
    changed: ChangedKeys,
    final: delta.Snapshot,
    tombstones: delta.Snapshot,
    attempt: int = 1,
    cut: Cut | None = None,
) -> Plan:
    """Rank the changes against the current rows and tombstones of their keys.

    Only the changed keys are ranked (in one task when few rows are read for it, else a
    shuffle the size of the change set; fewer still, and one task writes the run too); the
    other rows of the files replaced are copied through a filter by the changed keys' values
    when few, else a map-side anti join (broadcast keys when they are few enough), without a
    shuffle or sort. `attempt` > 1 is a recompute after another commit landed first: it looks
    up every key and ranks every row of the touched partitions, so it also heals any key left
    twice there.
    """
    table = context.table
    keys = list(table.keys)
    change_columns = changes.columns
    moved = cut is not None and cut.moved
    touched, final_rows, replaced = _touched_rows(context, changed, final, attempt, whole=moved)
    if moved and cut is not None:
        # A new truncate: every row whose change is before it goes, in every partition.
        final_rows = final_rows.filter(at_or_after(table.sequence_by, cut.values))
    # Every current row of a changed key is ranked, so a key left twice in the touched
    # partitions comes out once. A recompute (a commit landed before ours) ranks every row of
    # them: cheap insurance against rows doubled by a writer that is not this step, such as an
    # OPTIMIZE racing an overwrite that was not exclusive.
    heal = attempt > 1
    remembered, tombstone_columns, remembered_files = _remembered(context, tombstones, changed)
    present = (_columns(final, final_rows), tombstone_columns)
    current = final_rows if heal else _with_changed_keys(final_rows, changed, keys, "left_semi")
    candidates = _candidates(changes, change_columns, current, remembered, present)
    read = _rows_read(changed, replaced, remembered_files)
    one_task = read is not None and read <= ONE_TASK_ROWS
    if one_task:
        candidates = candidates.coalesce(1)
    filled, winners, observation = _ranked(table, candidates, changes, change_columns)
    output = _routed_output(
        table, winners, final_rows, changed, change_columns, heal=heal, one_task=one_task
    )
    if one_task and read is not None and read <= ONE_WRITER_ROWS:
        output = output.coalesce(1)  # a small run: one task writes it too (one job, one task)
    if moved and cut is not None and cut.rows is not None:
        # Remembered (keys null) so later runs drop changes ordered before it.
        output = output.unionByName(
            cut.rows.select(
                *[c for c in change_columns if c not in (FLAG, ABSENT)],
                F.lit("tombstones").alias(ROUTE),
            )
        )
    return Plan(touched, output, filled, observation, winners, forced=moved, replaced=replaced)


def _with_changed_keys(
    frame: DataFrame, changed: ChangedKeys, keys: list[str], how: str
) -> DataFrame:
    """`frame`'s rows of a changed key (`how="left_semi"`) or of another (`"left_anti"`)."""
    return with_keys(
        frame, changed.frame, changed.match, keys, broadcast=changed.broadcast, how=how
    )


def _remembered(
    context: StepContext, tombstones: delta.Snapshot, changed: ChangedKeys
) -> tuple[DataFrame, list[str], list[delta.DataFile]]:
    """The remembered deletes of the changed keys, the tombstones' columns and the files read.
    Only the files whose key ranges can hold a changed key are read (keys on the driver); with
    none, no join either."""
    files = tombstones.files
    if changed.local is not None:
        files = files_in_key_ranges(files, changed.local)
    rows = delta.read_snapshot(context.spark, tombstones, files=files)
    columns = _columns(tombstones, rows)
    if not files:
        return rows, columns, files
    keys = list(context.table.keys)
    return _with_changed_keys(rows, changed, keys, "left_semi"), columns, files


def _rows_read(
    changed: ChangedKeys,
    replaced: list[delta.DataFile] | None,
    remembered: list[delta.DataFile],
) -> int | None:
    """The rows a first attempt reads: its changed keys (on the driver) and the rows of the
    files it reads, by their own counts (only the files holding a changed key, `replaced`, and
    the remembered deletes'). None when not known so: a recompute, a truncate, keys counted in
    Spark (a large change set) or a file without a count. Up to ONE_TASK_ROWS one task ranks
    the changes; up to ONE_WRITER_ROWS one task writes the run."""
    if replaced is None or changed.local is None:
        return None
    return rows_in(changed.local.num_rows, [*replaced, *remembered])


def _columns(snapshot: delta.Snapshot, rows: DataFrame) -> list[str]:
    """The columns of a snapshot's rows: from its log when known (no request to Spark)."""
    return snapshot.schema.fieldNames() if snapshot.schema is not None else rows.columns


def _ranked(
    table: TableConfig, candidates: DataFrame, changes: DataFrame, change_columns: list[str]
) -> tuple[DataFrame, DataFrame, Observation]:
    """The changes with the values they did not carry filled in, the winner of every key
    (observed for the verdict), and the observation."""
    keys = list(table.keys)
    has_absent = ABSENT in change_columns
    columns = [*change_columns, REMEMBERED, FROM_CHANGE]
    filled = changes  # nothing to fill: the changes are what history logs
    if has_absent:
        tiebreak = [F.col(c).desc() if descending else F.col(c).asc() for c, descending in TIEBREAK]
        order = ranking_order(change_columns, table.sequence_by, tiebreak)
        candidates = fill_absent(candidates, keys, order, FROM_CHANGE)
        columns = candidates.columns
        filled = candidates.where(quoted(FROM_CHANGE)).selectExpr(
            *ranking_sql.names(change_columns)
        )
    ranking = ranking_sql.ranking(columns, keys, table.sequence_by, MARKS, RANK, TIEBREAK)
    latest = candidates.selectExpr("*", *ranking).where(f"{quoted(RANK)} = 1").drop(RANK)
    return (filled, *observed_verdict(latest, has_absent=has_absent))


def _touched_rows(
    context: StepContext,
    changed: ChangedKeys,
    final: delta.Snapshot,
    attempt: int,
    *,
    whole: bool = False,
) -> tuple[set[Any] | None, DataFrame, list[delta.DataFile] | None]:
    """The touched partitions (None: unpartitioned), final's rows the rewrite reads, and the
    files it replaces (None: every file of the touched partitions, or of the table).

    A first attempt replaces only the files holding a changed key; the touched partitions are
    those the changes name plus those of the files holding a key. A recompute (`attempt` > 1)
    looks up every key in every file and replaces the touched partitions whole; `whole` (a new
    truncate) replaces the whole table.
    """
    spark, table = context.spark, context.table
    column = table.partition_column
    heal = attempt > 1
    if whole or (heal and column is None):
        return None, delta.read_snapshot(spark, final), None
    if column is not None and changed.partitions is None:
        raise ValueError(f"table {table.name}: plan_rewrite needs the changes' partitions")
    holding = files_holding_keys(context, final, changed, everywhere=heal)
    touched = None
    if column is not None:
        touched = (changed.partitions or set()) | {f.partition_values.get(column) for f in holding}
    if heal:
        return touched, delta.read_snapshot(spark, final, partitions=touched), None
    return touched, delta.read_snapshot(spark, final, files=holding), holding


def _candidates(
    changes: DataFrame,
    change_columns: list[str],
    current: DataFrame,
    remembered: DataFrame,
    present: tuple[list[str], list[str]],
) -> DataFrame:
    """The rows ranked per key: the changes, the current rows (U) and the remembered deletes (D)
    of their keys, marked REMEMBERED / FROM_CHANGE. `present`: the columns of final's and of
    tombstones' rows."""
    marks = (REMEMBERED, FROM_CHANGE)
    # The three have the same columns in the same order: a union by position is the same
    # union, without the projection a union by name adds (and the driver analyses again).
    return (
        changes.selectExpr(
            *ranking_sql.names(change_columns),
            *ranking_sql.flags(marks, remembered=False, from_change=True),
        )
        .union(
            as_changes(
                current,
                change_columns,
                "U",
                ranking_sql.flags(marks, remembered=False, from_change=False),
                present[0],
            )
        )
        .union(
            as_changes(
                remembered,
                change_columns,
                "D",
                ranking_sql.flags(marks, remembered=True, from_change=False),
                present[1],
            )
        )
    )


def _routed_output(
    table: TableConfig,
    winners: DataFrame,
    final_rows: DataFrame,
    changed: ChangedKeys,
    change_columns: list[str],
    *,
    heal: bool,
    one_task: bool = False,
) -> DataFrame:
    """Final's new rows and the new tombstones in one frame, told apart by ROUTE: the winners,
    and (unless healing) the other rows of the files replaced copied as they are. `one_task`:
    the winners come from one task already."""
    keys = list(table.keys)
    output_columns = [c for c in change_columns if c not in (FLAG, ABSENT)]
    tombstone_columns = [*keys, *table.sequence_by, *ARRIVAL]
    # One ranking feeds both tables: the upserts go to final, the new deletes to tombstones
    # (with their other columns null); a delete already remembered goes nowhere.
    ranked = winners.where(
        f"NOT ({ranking_sql.is_delete()}) OR NOT {quoted(REMEMBERED)}"
    ).selectExpr(*ranking_sql.routed(output_columns, tombstone_columns, ROUTE))
    if table.partition_column is not None and not one_task:
        # One task per partition value: one new file per touched partition, not one per task
        # (the new tombstones, partition null, in one more).
        ranked = ranked.repartition(table.partition_column)
    unchanged = (
        final_rows.limit(0) if heal else _with_changed_keys(final_rows, changed, keys, "left_anti")
    ).selectExpr(*ranking_sql.names(output_columns), f"'final' AS {quoted(ROUTE)}")
    # Both tables' rows in one frame, written by one Spark job (the same columns in the same
    # order: a union by position).
    return unchanged.union(ranked)


def apply_changes(
    context: StepContext,
    changes: DataFrame,
    report: StepReport[OverwriteCounts],
    cut: Cut | None = None,
) -> DataFrame:
    """Upsert/delete path: rewrite the files of final the changes touch, retrying on conflicts.
    Returns the changes with the values they did not carry filled in (what history logs)."""
    table, paths = context.table, context.paths
    staging_schema = changes.schema
    partition_by = table.partition_by
    delta.ensure_table(paths.final, final_schema(staging_schema), partition_by)
    delta.ensure_table(paths.tombstones, tombstone_schema(staging_schema, table), [])
    evolve_to_staging(context, staging_schema, report)
    counts = report.result
    broadcast = count(counts.changes) <= BROADCAST_CHANGES_MAX
    if count(counts.changes) <= LOCAL_KEYS_MAX:
        changed = changed_keys_on_driver(context, changes, broadcast=broadcast)
    else:
        changed = changed_keys_in_spark(context, changes, broadcast=broadcast)
    routes = {
        "final": (paths.final, partition_by, final_schema(staging_schema).fieldNames()),
        "tombstones": (paths.tombstones, [], tombstone_schema(staging_schema, table).fieldNames()),
    }
    rewrite = _Rewrite(context, changes, changed, routes, report, cut)
    try:
        if changed.local is not None and changed.lookup_local is not None:
            counts.keys = changed.local.num_rows
            counts.keys_looked_up = changed.lookup_local.num_rows
        else:
            counts.keys = changed.frame.count()  # also caches the keys for the joins
            counts.keys_looked_up = (
                changed.lookup.count() if changed.lookup is not changed.frame else counts.keys
            )
        attempts = delta.with_retries(f"table {table.name}: final", rewrite.attempt_rewrite)
    finally:
        changed.release()
    counts.tombstones_added, counts.attempts = rewrite.tombstones_added, attempts
    return rewrite.filled if rewrite.filled is not None else changes


@dataclass
class _Rewrite:
    """The upsert/delete path's attempts at rewriting final, and the deletes they remembered."""

    context: StepContext
    changes: DataFrame
    changed: ChangedKeys
    routes: dict[str, tuple[Location, list[str], list[str]]]
    report: StepReport[OverwriteCounts]
    cut: Cut | None = None
    tombstones_added: int = 0
    filled: DataFrame | None = None

    def _plan(self, final: delta.Snapshot, tombstones: delta.Snapshot, attempt: int) -> Plan:
        plan = plan_rewrite(
            self.context,
            self.changes,
            changed=self.changed,
            final=final,
            tombstones=tombstones,
            attempt=attempt,
            cut=self.cut,
        )
        self.filled = plan.filled  # the last attempt's: what history logs
        return plan

    def attempt_rewrite(self, attempt: int) -> int | None:
        """One attempt from fresh snapshots; its number when done, None after a lost race."""
        context, report = self.context, self.report
        table, paths = context.table, context.paths
        final = delta.load_snapshot(paths.final)
        tombstones = delta.load_snapshot(paths.tombstones)  # after final: see the run order
        plan = self._plan(final, tombstones, attempt)
        run_id = delta.new_run_id()
        plain = delta.plain_columns(paths.final, final.files)
        written = delta.write_routed(plan.output, self.routes, run_id, table.zorder_by, plain)
        new_final, new_tombstones = written["final"], written["tombstones"]
        if _changes_nothing(plan, report, table.name):
            # A rerun of an applied interval: nothing to commit, final keeps its version (the
            # files written are the rows final and tombstones hold already).
            new_final.delete()
            new_tombstones.delete()
            report.result.rewrote(0, 0, final.version)
            return attempt
        if new_tombstones.actions:
            # Before final, so a delete is never applied without being remembered.
            remembered = delta.try_commit(
                tombstones, new_tombstones, "append", step="tombstones", run_id=run_id
            )
            if remembered is None:
                new_final.delete()
                return None
            self.tombstones_added += new_tombstones.rows
            if remembered.interfering_versions:
                # Another run may have remembered the same deletes: keep one copy of each.
                delta.remove_duplicate_rows(context.spark, paths.tombstones, "tombstones")
        if (plan.touched is not None and not plan.touched) or (
            plan.replaced == [] and not new_final.actions
        ):
            # Only deletes of keys final does not hold: remembered, final unchanged.
            new_final.delete()
            report.result.rewrote(0, 0, final.version)
            return attempt
        delta.inject_fault("overwrite_final:before_commit")
        result = _commit_final(table, final, new_final, plan, run_id)
        if result is None:
            return None
        delta.inject_fault("overwrite_final:after_commit")
        touched = len(plan.touched) if plan.touched is not None else 1
        report.result.rewrote(touched, new_final.rows, result.version)
        return attempt


def _commit_final(
    table: TableConfig,
    final: delta.Snapshot,
    new_final: delta.WrittenFiles,
    plan: Plan,
    run_id: str,
) -> delta.CommitResult | None:
    """Commit final's new files, removing the files the plan replaces (or its touched
    partitions whole), or None after a lost race.

    Exclusive: the result holds only if final did not change since it was read (an OPTIMIZE
    or another run creating the same partition would not conflict)."""
    if plan.replaced is None:
        return delta.try_commit(
            final,
            new_final,
            "overwrite",
            step="overwrite_final",
            run_id=run_id,
            partition_filters=partition_filters(table, plan.touched),
            exclusive=True,
        )
    return delta.try_commit(
        final,
        new_final,
        "append",
        step="overwrite_final",
        run_id=run_id,
        exclusive=True,
        removed=plan.replaced,
    )


def _changes_nothing(plan: Plan, report: StepReport[OverwriteCounts], table: str) -> bool:
    """The plan's verdict; changes left with values nothing carried are counted and warned."""
    nothing, unfilled = plan.verdict()
    if unfilled:
        report.result.changes_with_unknown_values = unfilled
        warn_unfilled(table, unfilled)
    return nothing


def warn_unfilled(table: str, count: int) -> None:
    """Changes that left out a column no earlier row of their key carried: null in final."""
    warn(
        f"table {table}: {count} change(s) left out columns (an unchanged TOASTed "
        "value) that no earlier change of their key carried and final did not hold: they are "
        "null in final. Capture the table's rows first (a Debezium snapshot, op r) so every "
        "key has a full row to keep values from."
    )


def history_seed(context: StepContext, columns: Sequence[str]) -> DataFrame | None:
    """What is known before history starts, as changes (staging's `columns`): every change still
    in staging, final's rows and the remembered deletes (seeding a new history log)."""
    spark, paths = context.spark, context.paths
    parts = []
    for path, flag in ((paths.staging, None), (paths.final, "U"), (paths.tombstones, "D")):
        snapshot = delta.load_snapshot(path)
        if snapshot.exists and snapshot.files:
            rows = delta.read_snapshot(spark, snapshot)
            if flag == "D":
                rows = rows.filter(F.col(context.table.keys[0]).isNotNull())  # not truncates
            elif flag is None:
                rows = rows.filter(F.col(FLAG) != TRUNCATE)
            parts.append(rows.select(*columns) if flag is None else as_changes(rows, columns, flag))
    if not parts:
        return None
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


@delta.reusing_tables()
def run_overwrite_final(
    context: StepContext, interval: Interval | None = None
) -> StepReport[OverwriteCounts]:
    """Apply every staged change final has not applied yet (whatever hour folder or run it came
    from), then mark its file versions applied. `interval` only labels the report."""
    table, paths = context.table, context.paths
    label = str(interval) if interval is not None else ""
    report = StepReport("overwrite-final", table.name, label, OverwriteCounts())
    # The ledger before staging: every file version it lists as staged has its rows in the
    # staging snapshot read next (stage commits staging before the ledger).
    pending = applied.pending_files(paths, whole_extracts=table.change_format == "snapshot")
    staging = delta.load_snapshot(paths.staging)
    batches = pending.batches
    if not pending.files or not staging.exists or not staging.files_in(batches):
        # Pending versions whose rows are all gone from staging lost to later changes in a
        # reset-staging: nothing of them is left to apply.
        applied.mark_applied(paths, pending, delta.new_run_id(), None)
        final = delta.load_snapshot(paths.final)
        report.result = OverwriteCounts(
            changes=0,
            keys=0,
            partitions_rewritten=0,
            rows_written=0,
            files_applied=len(pending.files),
            final_version=final.version,
        )
        if table.history:
            report.result.logged(0, 0, 0, delta.load_snapshot(paths.history).version)
        return report
    _check_zorder_columns(table, staging)
    delta.inject_fault("overwrite_final:before_first_write")
    changes = _pending_changes(context, staging, pending)
    report.result.changes = total = _count_changes(staging, pending, changes)
    plan_run(context.spark, small=total <= SMALL_RUN_CHANGES)
    # A large change set is read by several jobs (its keys, their partitions, the write): once,
    # into Spark's cache. A small one is read again instead: a few small files, where filling
    # the cache costs the first job ~40 ms.
    cached = total > LOCAL_KEYS_MAX
    changes = persisted(changes) if cached else changes
    try:
        if table.insert_only:
            append_inserts(context, changes, report)
        else:
            _apply_and_log(context, changes, report)
    finally:
        if cached:
            changes.unpersist()
    delta.inject_fault("overwrite_final:before_applied_marks")
    applied.mark_applied(paths, pending, delta.new_run_id(), report.result.final_version)
    report.result.files_applied = len(pending.files)
    if catalog.outlives_this_process(context.spark):
        catalog.register_tables(context.spark, table, paths)
    return report


def _apply_and_log(
    context: StepContext, changes: DataFrame, report: StepReport[OverwriteCounts]
) -> None:
    """Upserts, deletes and truncates into final, then (history: true) the log and history."""
    table, paths = context.table, context.paths
    cut = truncate_cut(context, changes)
    data_changes = changes.filter(F.col(FLAG) != TRUNCATE)
    applicable = data_changes
    if cut is not None:
        applicable = data_changes.filter(at_or_after(table.sequence_by, cut.values))
        if cut.moved:
            report.result.truncates_applied = cut.applied
    filled = apply_changes(context, applicable, report, cut)
    if not table.history:
        return
    # History logs every change with its values filled in (a change before a truncate too:
    # its version ends at the truncate).
    if cut is not None:
        filled = filled.unionByName(
            data_changes.filter(~at_or_after(table.sequence_by, cut.values))
        )
    seed = None
    if not delta.load_snapshot(paths.history_log).exists:
        seed = history_seed(context, changes.columns)
    history.update_history(context, filled, seed, report, recut_all=cut is not None and cut.moved)


def _check_zorder_columns(table: TableConfig, staging: delta.Snapshot) -> None:
    """zorder_by names columns of the data: without declared `columns`, `cdc validate` cannot
    know them, so the first run checks them against staging's schema (a ConfigError naming the
    field and the columns there are, before anything is written)."""
    if staging.schema is None or not table.zorder_by:
        return
    known = set(staging.schema.fieldNames()) | set(table.partition_by)
    missing = [c for c in table.zorder_by if c not in known]
    if missing:
        columns = ", ".join(
            c for c in staging.schema.fieldNames() if not c.startswith(TECHNICAL_PREFIX)
        )
        raise ConfigError(
            f"table {table.name}: zorder_by: {', '.join(missing)} is not a column of the data "
            f"(its columns: {columns}); name columns the change files carry"
        )


def _pending_changes(
    context: StepContext, staging: delta.Snapshot, pending: applied.Pending
) -> DataFrame:
    """The staged rows of the pending file versions (their hour partitions, then their files)."""
    rows = delta.read_snapshot(context.spark, staging, partitions=pending.batches)
    if context.table.change_format == "snapshot" or pending.whole_batches:
        return rows
    wanted = [f"{batch}/{file}" for batch, file in sorted(pending.idents)]
    return rows.filter(F.concat_ws("/", F.col(BATCH), F.col(FILE)).isin(wanted))


def _count_changes(staging: delta.Snapshot, pending: applied.Pending, changes: DataFrame) -> int:
    """How many changes are applied: from the log when whole batches are read (no Spark job)."""
    files = staging.files_in(pending.batches)
    if pending.whole_batches and all(f.num_records is not None for f in files):
        return sum(f.num_records or 0 for f in files)
    return changes.count()


def overwrite_final_step(context: StepContext, args: StepArgs) -> StepReport[OverwriteCounts]:
    """`cdc overwrite-final` body."""
    return run_overwrite_final(context, args.interval)


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: overwrite_final TABLE --start TS --end TS."""
    return run_step("overwrite_final", argv)


if __name__ == "__main__":
    sys.exit(main())
