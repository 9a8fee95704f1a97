"""Step `stage`: the interval's landed change files into the staging table (bad rows to quarantine)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from cdc_pipeline.config import TableConfig
from cdc_pipeline.errors import ConfigError, InputError
from cdc_pipeline.intervals import Interval
from cdc_pipeline.paths import TablePaths
from cdc_pipeline.schema import plan_schema
from spark_jobs import delta, snapshots
from spark_jobs.common import StepArgs, StepContext, StepReport, run_step
from spark_jobs.formats import ChangeRead, read_json_changes
from spark_jobs.transforms import (
    ARRIVAL,
    BATCH,
    FILE,
    FLAG,
    REASON,
    ROW,
    good_changes,
    quarantined_changes,
    type_changes,
)

EXTENSIONS = {"parquet": (".parquet",), "csv": (".csv",), "json": (".json", ".jsonl", ".ndjson")}
MAX_COMMIT_ATTEMPTS = 8
LEDGER_SCHEMA = pa.schema(
    [
        ("batch", pa.string()),
        ("file", pa.string()),
        ("rows_staged", pa.int64()),
        ("rows_quarantined", pa.int64()),
        ("staged_at", pa.timestamp("us", tz="UTC")),
        ("run_id", pa.string()),
    ]
)


@dataclass(frozen=True)
class LandingFile:
    """One landed change file of one hour folder."""

    batch: str
    path: Path

    @property
    def name(self) -> str:
        """File name within its hour folder (the `_cdc_file` of its rows)."""
        return self.path.name

    @property
    def ident(self) -> tuple[str, str]:
        """(batch, file name): how staging, quarantine and the ledger name a file."""
        return (self.batch, self.path.name)


def list_landing_files(
    paths: TablePaths, interval: Interval, file_format: str
) -> list[LandingFile]:
    """Every change file in the hour folders of the interval, in arrival order."""
    found = []
    for hour in interval.hours():
        folder = paths.landing / hour.folder
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith((".", "_")) or not entry.is_file():
                continue
            if entry.name.lower().endswith(EXTENSIONS[file_format]):
                found.append(LandingFile(hour.batch_id, entry))
    return found


def _with_arrival(df: DataFrame, row_position: str) -> DataFrame:
    """Add `_cdc_batch` (from the dt=/hr= folder), `_cdc_file` and `_cdc_row` to a file scan."""
    path = F.col("_metadata.file_path")
    pattern = r"dt=(\d{4}-\d{2}-\d{2})/hr=(\d{2})/[^/]*$"
    batch = F.concat(
        F.regexp_extract(path, pattern, 1), F.lit("T"), F.regexp_extract(path, pattern, 2)
    )
    if row_position == "row_index":
        return df.select(
            "*",
            batch.alias(BATCH),
            F.col("_metadata.file_name").alias(FILE),
            F.col("_metadata.row_index").alias(ROW),
        )
    # Text formats have no row index: order each file's rows by split offset, then by the
    # scan's increasing id (increasing within a split), and number them.
    scanned = df.select(
        "*",
        batch.alias(BATCH),
        F.col("_metadata.file_name").alias(FILE),
        path.alias("__path"),
        F.col("_metadata.file_block_start").alias("__block"),
        F.monotonically_increasing_id().alias("__scan_id"),
    )
    window = Window.partitionBy("__path").orderBy("__block", "__scan_id")
    return scanned.withColumn(ROW, F.row_number().over(window) - 1).drop(
        "__path", "__block", "__scan_id"
    )


def _csv_header(path: Path) -> tuple[str, ...]:
    """Column names from a CSV file's first line (metadata read on the driver)."""
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        first = handle.readline().strip().lstrip("\ufeff")
    return tuple(name.strip().strip('"') for name in first.split(",")) if first else ()


def read_landing(
    spark: SparkSession, table: TableConfig, files: Sequence[LandingFile]
) -> ChangeRead:
    """The change rows of `files` as read (csv/json values as text) with arrival columns."""
    paths = [str(f.path) for f in files]
    if table.file_format == "json":
        lines = _with_arrival(spark.read.text(paths), "scan")
        return read_json_changes(spark, table, lines)
    if table.file_format == "parquet":
        frame = _with_arrival(spark.read.option("mergeSchema", "true").parquet(*paths), "row_index")
        technical = {table.flag_source, *ARRIVAL}
        found = {
            f.name: f.dataType.simpleString()
            for f in frame.schema.fields
            if f.name not in technical
        }
        return _flat_read(table, frame, found)
    # CSV: group the files by header so each file's columns are matched by name, not position.
    groups: dict[tuple[str, ...], list[str]] = {}
    for landing_file in files:
        groups.setdefault(_csv_header(landing_file.path), []).append(str(landing_file.path))
    frames = []
    for header, group in groups.items():
        if not header:
            continue
        schema = StructType([StructField(c, StringType(), True) for c in header])
        frame = (
            spark.read.schema(schema)
            .option("header", "true")
            .option("enforceSchema", "true")
            .csv(group)
        )
        frames.append(_with_arrival(frame, "scan"))
    if not frames:
        raise InputError(f"table {table.name}: the CSV files of the interval have no header line")
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame, allowMissingColumns=True)
    found = {c: "string" for c in result.columns if c not in {table.flag_source, *ARRIVAL}}
    return _flat_read(table, result, found)


def _flat_read(table: TableConfig, frame: DataFrame, found: dict[str, str]) -> ChangeRead:
    """A parquet or csv read: declared columns win; undeclared ones are reported."""
    if table.columns is None:
        return ChangeRead(frame, dict(found))
    undeclared = sorted(set(found) - set(table.columns))
    return ChangeRead(frame, dict(table.columns), undeclared=undeclared)


def table_column_types(table: TableConfig, staging: delta.Snapshot) -> dict[str, str] | None:
    """Staging's data columns and types (None before staging exists)."""
    if staging.schema is None:
        return None
    technical = {*ARRIVAL, FLAG, table.partition_column, *snapshots.HASH_COLUMNS}
    return {
        f.name: f.dataType.simpleString() for f in staging.schema.fields if f.name not in technical
    }


def staging_columns(table: TableConfig, column_types: dict[str, str]) -> list[str]:
    """Staging's columns: data columns (and a snapshot's hashes), the partition column, the flag
    and the arrival columns."""
    partition = [table.partition_column] if table.partition_column else []
    hashes = list(snapshots.HASH_COLUMNS) if table.change_format == "snapshot" else []
    return [*column_types, *hashes, *partition, FLAG, *ARRIVAL]


def _files_in(
    spark: SparkSession, snapshot: delta.Snapshot, batches: Sequence[str]
) -> set[tuple[str, str]]:
    """(batch, file) pairs that have rows in a staging-like table (partitioned by `_cdc_batch`)."""
    if not snapshot.exists or not snapshot.files_in(batches):
        return set()
    rows = read_snapshot_distinct_files(spark, snapshot, batches)
    return {(r[BATCH], r[FILE]) for r in rows}


def read_snapshot_distinct_files(
    spark: SparkSession, snapshot: delta.Snapshot, batches: Sequence[str]
) -> list:
    """Distinct (batch, file) of the given batches; a small metadata result."""
    frame = delta.read_snapshot(spark, snapshot, partitions=batches, columns=[BATCH, FILE])
    return frame.distinct().collect()  # metadata: one row per file


def _commit_append(
    path: Path, frame: DataFrame, partition_by: list[str], step: str, fault_point: str
) -> tuple[int, int]:
    """Append `frame` to the table at `path` (created if needed); returns (rows, version)."""
    delta.ensure_table(path, frame.schema, partition_by)
    return delta.append_with_retries(frame, path, step, MAX_COMMIT_ATTEMPTS, fault_point)


def run_stage(context: StepContext, interval: Interval) -> StepReport:
    """Stage the interval's change files not yet staged; quarantine the rows that cannot be applied."""
    spark, table, paths = context.spark, context.table, context.paths
    report = StepReport("stage", table.name, str(interval))
    landing = list_landing_files(paths, interval, table.file_format)
    batches = sorted({f.batch for f in landing})
    ledger = {
        (r["batch"], r["file"]) for r in delta.arrow_table_rows(paths.ledger, ["batch", "file"])
    }
    pending = [f for f in landing if f.ident not in ledger]
    staging = delta.load_snapshot(paths.staging)
    snapshot_batch = None
    if pending and table.change_format == "snapshot":
        batch_ledger = {batch for batch, _ in ledger}
        snapshot_batch = snapshots.check_order(
            context, interval, [f.batch for f in pending], batch_ledger, staging
        )
    counts = report.counts
    counts.update(files=len(landing), new_files=len(pending), rows_read=0, staged=0, quarantined=0)
    quarantine = delta.load_snapshot(paths.quarantine)
    if not pending:
        counts.update(staging_version=staging.version, quarantine_version=quarantine.version)
        return report
    # A crash between the staging, quarantine and ledger commits leaves a file recorded in some
    # of them: each table takes only the rows of files it does not hold yet.
    in_staging = _files_in(spark, staging, batches)
    in_quarantine = _files_in(spark, quarantine, batches)
    delta.inject_fault("stage:before_first_write")
    # A full extract is compared as a whole: all its files, also those staged before.
    to_read = [f for f in landing if f.batch == snapshot_batch] if snapshot_batch else pending
    read = read_landing(spark, table, to_read)
    raw = read.frame
    if snapshot_batch is not None:
        raw = raw.withColumn(snapshots.SNAPSHOT_AT, snapshots.snapshot_time(F.col(BATCH)))
        read.batch_types[snapshots.SNAPSHOT_AT] = "timestamp"
    counts.update(read.ignored)
    if read.undeclared:
        counts["undeclared_columns_ignored"] = len(read.undeclared)
        warn(
            f"table {table.name}: {interval}: columns not in the config row are ignored: "
            + ", ".join(read.undeclared)
        )
    is_snapshot = table.change_format == "snapshot"
    flag_present = not is_snapshot and table.flag_source in raw.columns
    if not flag_present and not table.insert_only and not is_snapshot:
        raise InputError(
            f"table {table.name}: the change files of {interval} have no flag column {table.flag_column}"
        )
    policy = table.on_schema_change if table.columns is None else "evolve"
    plan = plan_schema(table_column_types(table, staging), read.batch_types, policy)
    if plan.refused:
        refuse_batch(context, interval, read, flag_present, plan.refused, in_quarantine)
    column_types = plan.columns
    try:
        typed = type_changes(raw, table, column_types, flag_present)
        if is_snapshot:
            typed = snapshots.with_hashes(typed, table, list(column_types))
        typed = typed.persist()
        per_file = (
            typed.groupBy(BATCH, FILE)
            .agg(
                F.sum(F.when(F.col(REASON).isNull(), 1).otherwise(0)).alias("good"),
                F.sum(F.when(F.col(REASON).isNotNull(), 1).otherwise(0)).alias("bad"),
            )
            .collect()  # metadata: one row per file
        )
    except AnalysisException as error:
        message = str(error).strip().splitlines()[0]
        raise ConfigError(f"table {table.name}: partition_expression: {message}") from None
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    columns = staging_columns(table, column_types)
    if plan.changes and staging.exists:
        changed = delta.evolve_table(spark, paths.staging, typed.select(*columns).schema)
        counts.update(columns_added=len(plan.added), columns_widened=len(plan.widened))
        warn(f"table {table.name}: {interval}: staging schema evolved: {', '.join(changed)}")
    good = good_changes(typed, columns)
    derived = None
    if snapshot_batch is not None:
        held = typed.filter(F.col(REASON).isNotNull())  # quarantined rows whose key is known
        for key in table.keys:
            held = held.filter(F.col(key).isNotNull())
        derived, operations = snapshots.derive_changes(context, good, held, snapshot_batch, columns)
        counts.update(operations)
        good = derived
        # Rows of files staged before were read to compare the whole extract, not to restage.
        per_file = [r for r in per_file if (r[BATCH], r[FILE]) in {f.ident for f in pending}]
    good = good.filter(~file_key.isin([f"{b}/{n}" for b, n in in_staging]))
    bad = quarantined_changes(typed, table, column_types).filter(
        ~file_key.isin([f"{b}/{n}" for b, n in in_quarantine])
    )
    _evolve_quarantine(spark, paths.quarantine, bad.schema)
    staged, staging_version = _commit_append(
        paths.staging, good, [BATCH], "stage", "stage:before_staging_commit"
    )
    quarantined, quarantine_version = _commit_append(
        paths.quarantine, bad, [BATCH], "quarantine", "stage:before_quarantine_commit"
    )
    typed.unpersist()
    if derived is not None:
        derived.unpersist()
    read.release()
    delta.inject_fault("stage:before_ledger_commit")
    now = datetime.now(UTC)
    run_id = delta.new_run_id()
    ledger_rows = [
        {
            "batch": r[BATCH],
            "file": r[FILE],
            "rows_staged": int(r["good"]),
            "rows_quarantined": int(r["bad"]),
            "staged_at": now,
            "run_id": run_id,
        }
        for r in per_file
    ]
    done = {(r[BATCH], r[FILE]) for r in per_file}
    ledger_rows += [
        {
            "batch": f.batch,
            "file": f.name,
            "rows_staged": 0,
            "rows_quarantined": 0,
            "staged_at": now,
            "run_id": run_id,
        }
        for f in pending
        if f.ident not in done
    ]
    write_deltalake(
        str(paths.ledger), pa.Table.from_pylist(ledger_rows, LEDGER_SCHEMA), mode="append"
    )
    counts.update(
        rows_read=sum(int(r["good"]) + int(r["bad"]) for r in per_file),
        staged=staged,
        quarantined=quarantined,
        staging_version=staging_version,
        quarantine_version=quarantine_version,
    )
    return report


def warn(message: str) -> None:
    """A warning line on stderr (the task log); the summary line stays the one line on stdout."""
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _evolve_quarantine(spark: SparkSession, path: Path, incoming: StructType) -> None:
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
    typed = type_changes(read.frame, table, batch_types, flag_present).withColumn(
        REASON, F.lit(reason)
    )
    file_key = F.concat_ws("/", F.col(BATCH), F.col(FILE))
    rows = quarantined_changes(typed, table, batch_types).filter(
        ~file_key.isin([f"{b}/{n}" for b, n in in_quarantine])
    )
    _evolve_quarantine(spark, paths.quarantine, rows.schema)
    quarantined, _ = _commit_append(
        paths.quarantine, rows, [BATCH], "quarantine", "stage:before_quarantine_commit"
    )
    raise InputError(
        f"table {table.name}: {interval}: {reason}. The batch's rows are in quarantine "
        f"({quarantined} new); staging and final are unchanged. Declare the column types in "
        "the config row's columns, then rerun the interval"
    )


def stage_step(context: StepContext, args: StepArgs) -> StepReport:
    """`cdc stage` body."""
    return run_stage(context, args.interval())


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: stage TABLE --start TS --end TS."""
    return run_step(argv, "stage", "interval", stage_step)


if __name__ == "__main__":
    sys.exit(main())
