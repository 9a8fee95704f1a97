"""Stage's commits: the good rows to staging (first after the run's plan, or not at all), the bad
rows and refused entries to quarantine, and a whole batch refused for its schema."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import InputError
from cdc_pipeline.intervals import Interval
from cdc_pipeline.paths import Location
from spark_jobs import delta
from spark_jobs.formats.json_lines import ChangeRead
from spark_jobs.landing import Refusal
from spark_jobs.rules.transforms import (
    BATCH,
    FILE,
    RAW,
    REASON,
    ROW,
    quarantined_changes,
    type_changes,
)
from spark_jobs.runtime.context import StepContext
from spark_jobs.staging.plan import Committed, StageRows


def _commit_append(
    path: Location, frame: DataFrame, partition_by: list[str], step: str, fault_point: str
) -> tuple[int, int]:
    """Append `frame` to the table at `path` (created if needed); returns (rows, version)."""
    delta.ensure_table(path, frame.schema, partition_by)
    return delta.append_with_retries(frame, path, step, fault_point)


def _commit_staging(
    path: Location, frame: DataFrame, planned: delta.Snapshot
) -> tuple[int, int] | None:
    """Append the staged rows as the first data commit after the snapshot the run planned from
    (its own schema evolution aside); None when another run's commit came first: it may hold
    the same file versions, so the caller plans again instead of staging them twice."""
    current = delta.load_snapshot(path)
    if not current.exists:  # (the frame's schema only then: a request to Spark)
        delta.ensure_table(path, frame.schema, [BATCH])
        current = delta.load_snapshot(path)
    if delta.data_commits_between(
        path, planned.version, current.version, ignore=("evolve_schema",)
    ):
        return None
    run_id = delta.new_run_id()
    plain = delta.plain_columns(path, current.files)
    written = delta.write_files(frame, path, current.partition_columns, run_id, plain=plain)
    if not written.actions:
        return 0, current.version
    delta.inject_fault("stage:before_staging_commit")
    result = delta.try_commit(
        current, written, "append", step="stage", run_id=run_id, exclusive=True
    )
    return None if result is None else (written.rows, result.version)


def commit_rows(
    context: StepContext,
    rows: StageRows,
    in_quarantine: set[tuple[str, str]],
    quarantine: delta.Snapshot,
) -> Committed | None:
    """Append the good rows to staging, then the bad rows and the new refusals to quarantine;
    None when another run staged first (nothing was committed: plan again)."""
    spark, table, paths = context.spark, context.table, context.paths
    plan, good, bad = rows.plan, rows.good, rows.bad
    new_refusals = [r for r in plan.refusals if (r.batch, r.file) not in in_quarantine]
    if good is not None:
        appended = _commit_staging(paths.staging, good, plan.staging)
        if appended is None:
            return None
        staged, staging_version = appended
    else:
        staged, staging_version = 0, plan.staging.version
    if not new_refusals and not any(int(r["bad"]) for r in rows.per_file):
        # Nothing to quarantine (the per-file counts say so): no Spark job, no commit; the
        # table is created if it is missing, as an append of no rows did.
        if not quarantine.exists:
            schema = bad.schema if bad is not None else _quarantine_schema(table, quarantine)
            delta.ensure_table(paths.quarantine, schema, [BATCH])
        return Committed(staged, staging_version, 0, delta.load_snapshot(paths.quarantine).version)
    schema = bad.schema if bad is not None else _quarantine_schema(table, quarantine)
    if new_refusals or bad is None:
        refused_rows = _refusal_rows(spark, new_refusals, schema)
        bad = refused_rows if bad is None else bad.unionByName(refused_rows)
    evolve_quarantine(spark, paths.quarantine, bad.schema)
    quarantined, quarantine_version = _commit_append(
        paths.quarantine, bad, [BATCH], "quarantine", "stage:before_quarantine_commit"
    )
    return Committed(staged, staging_version, quarantined, quarantine_version)


def _quarantine_schema(table: TableConfig, quarantine: delta.Snapshot) -> StructType:
    """The quarantine's columns, for file-level rows when no row was read."""
    if quarantine.schema is not None:
        return quarantine.schema
    text = [*(table.columns or {}), table.flag_source, RAW, REASON, BATCH, FILE]
    fields = [StructField(c, StringType(), True) for c in text]
    return StructType([*fields, StructField(ROW, LongType(), True)])


def _refusal_rows(
    spark: SparkSession, refusals: Sequence[Refusal], schema: StructType
) -> DataFrame:
    """One quarantine row per refused entry: null data, the path in `_cdc_raw`, the reason."""
    values = {RAW: "relative", REASON: "reason", BATCH: "batch", FILE: "file"}
    rows = [
        tuple(getattr(r, values[f.name]) if f.name in values else None for f in schema.fields)
        for r in refusals
    ]
    return delta.local_frame(spark, rows, schema)


def evolve_quarantine(spark: SparkSession, path: Location, incoming: StructType) -> None:
    """Quarantine keeps every column as text: add the columns a batch brings (never narrows)."""
    snapshot = delta.load_snapshot(path)
    if snapshot.schema is None:
        return
    known = set(snapshot.schema.fieldNames())
    new = [f for f in incoming.fields if f.name not in known]
    if new:
        delta.evolve_table(spark, path, StructType(new))


def refuse_batch(
    context: StepContext,
    interval: Interval,
    read: ChangeRead,
    *,
    flag_present: bool,
    problems: list[str],
    in_quarantine: set[tuple[str, str]],
) -> None:
    """Quarantine every row of a batch whose schema cannot be applied, then fail the step.

    Staging and final are not touched and the files are not recorded as staged, so once the
    config row says how to read them (columns, on_schema_change) a rerun stages them.
    """
    spark, table, paths = context.spark, context.table, context.paths
    batch_types = {name: kind or "string" for name, kind in read.batch_types.items()}
    reason = "schema change refused: " + "; ".join(problems)
    typed = type_changes(read.frame, table, batch_types, flag_present=flag_present).withColumn(
        REASON, F.lit(reason)
    )
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    rows = quarantined_changes(typed, table, batch_types).filter(
        ~file_key.isin([f"{b}/{n}" for b, n in in_quarantine])
    )
    evolve_quarantine(spark, paths.quarantine, rows.schema)
    quarantined, _ = _commit_append(
        paths.quarantine, rows, [BATCH], "quarantine", "stage:before_quarantine_commit"
    )
    raise InputError(
        f"table {table.name}: {interval}: {reason}. The batch's rows are in quarantine "
        f"({quarantined} new); staging and final are unchanged. Declare the column types in "
        "the config row's columns, then rerun the interval"
    )
