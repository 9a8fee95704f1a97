"""Crash recovery of stage: file versions a killed run left in staging or quarantine but not in
the ledger are settled (dropped when this run holds the same rows, renumbered when the file
changed since), and files that changed while Spark read them are left for the next run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import InputError
from cdc_pipeline.intervals import Interval
from spark_jobs import delta, landing
from spark_jobs.landing import LandingFile
from spark_jobs.rules.transforms import BATCH, FILE, REASON, quoted
from spark_jobs.runtime.context import StepContext
from spark_jobs.staging.notices import listed, warn
from spark_jobs.staging.plan import StageRows
from spark_jobs.staging.readers import arrival_names


def settle_crashed_run(
    context: StepContext,
    rows: StageRows,
    in_staging: set[tuple[str, str]],
    in_quarantine: set[tuple[str, str]],
    now: datetime,
    run_id: str,
) -> StageRows:
    """Change files only: settle the file versions a crashed run left in staging or quarantine
    but not in the ledger (their rows dropped, their ledger rows in `recorded`)."""
    plan = rows.plan
    if rows.good is None or rows.bad is None or plan.snapshot_batch is not None:
        return rows
    # A crash between the staging, quarantine and ledger commits leaves file versions in
    # staging or quarantine that the ledger does not know; their file may have changed since.
    settled = settle_unrecorded(
        context,
        plan.ledger,
        pending=plan.pending,
        good=rows.good,
        bad=rows.bad,
        per_file=rows.per_file,
        in_staging=in_staging,
        in_quarantine=in_quarantine,
        files=plan.files,
        refused=plan.refused,
    )
    return replace(
        rows,
        plan=replace(plan, pending=settled.pending),
        good=settled.good,
        bad=settled.bad,
        per_file=settled.per_file,
        recorded=[
            landing.ledger_row(
                None,
                batch,
                file,
                staged=staged_rows,
                quarantined=quarantined_rows,
                refused=None,
                now=now,
                run_id=run_id,
            )
            for batch, file, staged_rows, quarantined_rows in settled.recorded
        ],
    )


def leave_changed_files(table: TableConfig, interval: Interval, rows: StageRows) -> StageRows:
    """Drop the rows of files that changed while Spark read them: the next run stages their next
    version (a changed extract file stops the run instead)."""
    plan = rows.plan
    if rows.good is None or rows.bad is None:
        return rows
    changed = [f for f in plan.to_read if landing.has_changed(f)]
    if changed and plan.snapshot_batch is not None:
        raise InputError(
            f"table {table.name}: {interval}: the extract file {changed[0].relative} changed "
            "while it was read; nothing was staged: rerun the interval once it is complete"
        )
    moved = [f for f in plan.pending if f.path in {c.path for c in changed}]
    if not moved:
        return rows
    warn(
        f"table {table.name}: {interval}: files changed while they were read, left for "
        "the next run: " + listed([f.relative for f in moved])
    )
    skipped = [f"{f.batch}/{f.file}" for f in moved]
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    return replace(
        rows,
        plan=replace(
            plan, pending=[f for f in plan.pending if f"{f.batch}/{f.file}" not in skipped]
        ),
        good=rows.good.filter(~file_key.isin(skipped)),
        bad=rows.bad.filter(~file_key.isin(skipped)),
        per_file=[r for r in rows.per_file if f"{r[BATCH]}/{r[FILE]}" not in skipped],
        changed_while_read=len(moved),
    )


@dataclass
class Settled:
    """Change rows after the versions an earlier, crashed run left unrecorded were settled."""

    good: DataFrame
    bad: DataFrame
    per_file: list[dict[str, Any]]
    pending: list[LandingFile]
    recorded: list[tuple[str, str, int, int]] = field(default_factory=list)  # for the ledger


def settle_unrecorded(
    context: StepContext,
    ledger: dict[tuple[str, str], landing.LedgerEntry],
    *,
    pending: list[LandingFile],
    good: DataFrame,
    bad: DataFrame,
    per_file: list[dict[str, Any]],
    in_staging: set[tuple[str, str]],
    in_quarantine: set[tuple[str, str]],
    files: landing.FilePlan,
    refused: frozenset[tuple[str, str]],
) -> Settled:
    """Drop the rows staging or quarantine already hold, and give changed files a new version.

    Staging commits before quarantine, and both before the ledger. A run killed in between leaves
    a file version in staging (and maybe quarantine) that the ledger does not know. When the file
    still holds the same rows, this run's copy is dropped table by table; when it changed since,
    it is a new version (numbered after every version the tables hold), never mistaken for the
    one already staged; the unrecorded version gets its ledger row (content unknown). A version
    only quarantine holds (a file without good rows, or a batch refused for its schema) keeps
    its identity; its rows are dropped when quarantine holds exactly them. The rows are compared
    only on this recovery path (a few actions per file)."""
    spark, paths = context.spark, context.paths
    settled = Settled(good, bad, per_file, list(pending))
    staged_unrecorded = in_staging - set(ledger)
    quarantined_unrecorded = in_quarantine - set(ledger)
    if not staged_unrecorded and not quarantined_unrecorded:
        return settled
    renames: dict[tuple[str, str], str] = {}
    skip_staging: set[tuple[str, str]] = set()
    skip_quarantine: set[tuple[str, str]] = set()
    recorded: set[tuple[str, str]] = set()
    staging, quarantine = delta.load_snapshot(paths.staging), delta.load_snapshot(paths.quarantine)
    held = in_staging | in_quarantine
    for index, landing_file in enumerate(settled.pending):
        if landing_file.ident in refused:
            continue
        crashed = sorted(
            (
                file
                for batch, file in staged_unrecorded
                if batch == landing_file.batch
                and landing.split_version(file)[0] == landing_file.name
            ),
            key=lambda file: landing.split_version(file)[1],
        )
        if not crashed:
            if landing_file.ident in quarantined_unrecorded and _holds_same_rows(
                spark, quarantine, bad, landing_file, landing_file.file
            ):
                skip_quarantine.add(landing_file.ident)
            continue
        last = crashed[-1]
        ident = (landing_file.batch, last)
        same = _holds_same_rows(spark, staging, good, landing_file, last) and (
            ident not in in_quarantine
            or _holds_same_rows(spark, quarantine, bad, landing_file, last)
        )
        if same:
            target = last
            skip_staging.add(ident)
            if ident in in_quarantine:
                skip_quarantine.add(ident)
            recorded |= {(landing_file.batch, file) for file in crashed[:-1]}
        else:
            files.numbers.holds(landing_file.batch, (f for b, f in held if b == landing_file.batch))
            target = files.numbers.next_name(landing_file.batch, landing_file.name)
            recorded |= {(landing_file.batch, file) for file in crashed}
        if target != landing_file.file:
            renames[landing_file.ident] = target
            arrival = None if target == landing_file.name else target
            settled.pending[index] = replace(landing_file, arrival=arrival)
    if renames:
        settled.good = settled.good.withColumn(FILE, arrival_names(renames))
        settled.bad = settled.bad.withColumn(FILE, arrival_names(renames))
        settled.per_file = [
            {**r, FILE: renames.get((r[BATCH], r[FILE]), r[FILE])} for r in settled.per_file
        ]
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    if skip_staging:
        settled.good = settled.good.filter(~file_key.isin([f"{b}/{f}" for b, f in skip_staging]))
    if skip_quarantine:
        settled.bad = settled.bad.filter(~file_key.isin([f"{b}/{f}" for b, f in skip_quarantine]))
    in_tables = (
        _row_counts(spark, staging, sorted(recorded)),
        _row_counts(spark, quarantine, sorted(recorded)),
    )
    settled.recorded = [
        (batch, file, in_tables[0].get((batch, file), 0), in_tables[1].get((batch, file), 0))
        for batch, file in sorted(recorded)
    ]
    return settled


def _holds_same_rows(
    spark: SparkSession,
    snapshot: delta.Snapshot,
    rows: DataFrame,
    landing_file: LandingFile,
    held_as: str,
) -> bool:
    """Whether the table holds, as `held_as`, exactly the rows (as text) this run read from the
    file."""
    current = rows.filter(
        (F.col(BATCH) == landing_file.batch) & (F.col(FILE) == landing_file.file)
    ).withColumn(FILE, F.lit(held_as))
    if snapshot.schema is None:
        return current.limit(1).count() == 0
    # Not the reason: a max_sequence_ahead reason names the time of its run.
    columns = [c for c in current.columns if c in snapshot.schema.fieldNames() and c != REASON]
    stored = delta.read_snapshot(
        spark, snapshot, partitions=[landing_file.batch], columns=columns
    ).filter(F.col(FILE) == held_as)
    as_text = [F.col(quoted(c)).cast("string").alias(c) for c in columns]
    mine, theirs = current.select(*as_text), stored.select(*as_text)
    return mine.exceptAll(theirs).limit(1).count() == 0 and (
        theirs.exceptAll(mine).limit(1).count() == 0
    )


def _row_counts(
    spark: SparkSession, snapshot: delta.Snapshot, idents: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """Rows a staging-like table holds for each (batch, file)."""
    if not idents or not snapshot.exists:
        return {}
    batches = sorted({b for b, _ in idents})
    if not snapshot.files_in(batches):
        return {}
    frame = delta.read_snapshot(spark, snapshot, partitions=batches, columns=[BATCH, FILE])
    keys = [f"{b}/{f}" for b, f in idents]
    rows = (
        frame.filter(F.concat_ws("/", F.col(BATCH), F.col(FILE)).isin(keys))
        .groupBy(BATCH, FILE)
        .count()
        .collect()  # metadata: one row per file
    )
    return {(r[BATCH], r[FILE]): int(r["count"]) for r in rows}
