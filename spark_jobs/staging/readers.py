"""Reading landed change files for stage: Parquet, CSV and JSON lines into one frame with the
arrival columns (`_cdc_batch`, `_cdc_file`, `_cdc_row`), and finding the Parquet files Spark
cannot read when a batch fails."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession, Window
from pyspark.sql import functions as F

from cdc_pipeline.columns import quoted
from cdc_pipeline.config import TableConfig
from cdc_pipeline.intervals import HOUR_FOLDER_PATTERN
from spark_jobs import landing
from spark_jobs.formats.csv import read_csv_changes
from spark_jobs.formats.json_lines import ChangeRead
from spark_jobs.formats.reading import read_json_changes
from spark_jobs.landing import LandingFile, ParquetPlan, Refusal
from spark_jobs.rules.transforms import ARRIVAL, BATCH, FILE, ROW

# Up to this many bytes of landed files (Spark's smallest split is 4 MB), a run is read in one
# task: its text lines are numbered without a shuffle by file and its rows counted without one
# (each shuffle is two Spark jobs more), at no cost in parallelism.
ONE_TASK_BYTES = 4 * 1024 * 1024


def read_in_one_task(files: Sequence[LandingFile]) -> bool:
    """Whether a run's landed files are few enough bytes to read in one task."""
    return sum(f.size for f in files) <= ONE_TASK_BYTES


def _with_arrival(df: DataFrame, row_position: str, *, one_task: bool = False) -> DataFrame:
    """Add `_cdc_batch` (from the dt=/hr= folder), `_cdc_file` and `_cdc_row` to a file scan."""
    path = F.col("_metadata.file_path")
    pattern = HOUR_FOLDER_PATTERN + r"/[^/]*$"
    # Spark gives file names URL-encoded (a space as %20, % as %25) and leaves + as it is:
    # decoded back to the landed name (+ protected first, as the decoder reads it as a space),
    # so `_cdc_file` is what the ledger calls the file.
    name = F.url_decode(F.replace(F.col("_metadata.file_name"), F.lit("+"), F.lit("%2B")))
    # intervals.batch_id in Spark: the day, "T", the hour.
    batch = F.concat(
        F.regexp_extract(path, pattern, 1), F.lit("T"), F.regexp_extract(path, pattern, 2)
    )
    if row_position == "row_index":
        return df.select(
            "*",
            batch.alias(BATCH),
            name.alias(FILE),
            F.col("_metadata.row_index").alias(ROW),
        )
    # Text formats have no row index: order each file's rows by split offset, then by the
    # scan's increasing id (increasing within a split), and number them.
    scanned = df.select(
        "*",
        batch.alias(BATCH),
        name.alias(FILE),
        path.alias("__path"),
        F.col("_metadata.file_block_start").alias("__block"),
        F.monotonically_increasing_id().alias("__scan_id"),
    )
    if one_task:
        # One partition already groups every file's lines: the numbering needs no shuffle. (The
        # ids are still increasing within each split: the one task reads them in turn.)
        scanned = scanned.coalesce(1)
    window = Window.partitionBy("__path").orderBy("__block", "__scan_id")
    return scanned.withColumn(ROW, F.row_number().over(window) - 1).drop(
        "__path", "__block", "__scan_id"
    )


def read_landing(
    spark: SparkSession,
    table: TableConfig,
    files: Sequence[LandingFile],
    parquet: ParquetPlan | None = None,
) -> ChangeRead:
    """The change rows of `files` as read (csv/json values as text) with arrival columns;
    Parquet files as `parquet` groups them (probed here when not given)."""
    paths = _spark_paths(files)
    one_task = read_in_one_task(files)
    if table.file_format == "json":
        lines = _with_arrival(spark.read.text(paths), "scan", one_task=one_task)
        return read_json_changes(spark, table, lines)
    if table.file_format == "parquet":
        return _read_parquet(spark, table, files, parquet)
    # CSV: each line parsed against its file's header (spark_jobs/formats/csv.py).
    return read_csv_changes(
        spark,
        table,
        [f.path for f in files],
        lambda df: _with_arrival(df, "scan", one_task=one_task),
    )


def _read_parquet(
    spark: SparkSession,
    table: TableConfig,
    files: Sequence[LandingFile],
    parquet: ParquetPlan | None,
) -> ChangeRead:
    """Each group of same-schema files read on its own, cast to the run's column types, then
    unioned: a column that is an int in one file and a string in another never fails the read."""
    plan = parquet or landing.plan_parquet(files, table.columns, table.flag_source)
    technical = {table.flag_source, *ARRIVAL}
    nanos = plan.nanos
    if nanos:
        spark.conf.set(NANOS_AS_LONG, "true")  # else Spark refuses the column
    frames = [
        _nanos_as_text(
            _with_arrival(_parquet_reader(spark, types).parquet(*_spark_paths(group)), "row_index"),
            _nanos_columns(group) if nanos else set(),
        )
        for group, types in zip(plan.groups, plan.exact, strict=True)
    ]
    # The nanosecond columns are text in every group, typed (and checked) row by row.
    read_types = {c: "string" if c in nanos else t for c, t in plan.column_types.items()}
    found = {c: _without_nanos(t) for c, t in plan.column_types.items()}
    if len(frames) == 1:
        frame = frames[0]
        # The types Spark reads: known without asking it when the footers gave them exactly.
        read = plan.exact[0] or {f.name: f.dataType.simpleString() for f in frame.schema.fields}
        found = {
            name: found[name] if name in nanos else kind
            for name, kind in read.items()
            if name not in technical
        }
        # The frame's columns: the file's, then the arrival columns (`_with_arrival`).
        columns = [*plan.exact[0], *ARRIVAL] if plan.exact[0] else None
        return _flat_read(table, frame, found, columns)
    cast = [
        frame.select(
            *[
                F.col(f"`{f.name}`").cast(read_types[f.name]).alias(f.name)
                if f.name in read_types and f.dataType.simpleString() != read_types[f.name]
                else F.col(f"`{f.name}`")
                for f in frame.schema.fields
            ]
        )
        for frame in frames
    ]
    result = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), cast)
    found = {c: t for c, t in found.items() if c not in technical}
    return _flat_read(table, result, found)


def _spark_paths(group: Sequence[LandingFile]) -> list[str]:
    return [landing.spark_path(f.path) for f in group]


def _parquet_reader(spark: SparkSession, exact: dict[str, str] | None) -> DataFrameReader:
    """A Parquet reader given the files' types when the footers gave them exactly
    (`landing.probe.exact_types`): Spark then runs no job of its own to read the footers again
    (its inference does, even for one file). Else Spark infers them, merging the group's files."""
    if exact:
        return spark.read.schema(", ".join(f"{quoted(c)} {t}" for c, t in exact.items()))
    return spark.read.option("mergeSchema", "true")


# Spark reads a Parquet timestamp in nanoseconds only as its count since the epoch.
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"
NANOS_TEXT = (
    "concat(date_format(timestamp_seconds((`{c}` - pmod(`{c}`, 1000000000)) div 1000000000), "
    "'yyyy-MM-dd HH:mm:ss'), '.', lpad(CAST(pmod(`{c}`, 1000000000) AS STRING), 9, '0'))"
)


def _without_nanos(spark_type: str) -> str:
    return spark_type.removesuffix(landing.NANOS)


def _nanos_columns(group: Sequence[LandingFile]) -> set[str]:
    """The group's timestamp columns stored in nanoseconds (its first file's footer: a group's
    files share one schema)."""
    types = landing.probe_parquet(group[0])
    return {c for c, t in types.items() if t.endswith(landing.NANOS)}


def _nanos_as_text(frame: DataFrame, columns: set[str]) -> DataFrame:
    """Nanosecond counts as the exact time text (`2024-01-01 00:00:00.123456789`, UTC): typed
    from it, whole microseconds are kept and finer digits quarantined, never truncated."""
    for column in sorted(columns):
        frame = frame.withColumn(column, F.expr(NANOS_TEXT.format(c=column)))
    return frame


def _flat_read(
    table: TableConfig, frame: DataFrame, found: dict[str, str], columns: list[str] | None = None
) -> ChangeRead:
    """A parquet or csv read: declared columns win; undeclared ones are reported. `columns`:
    the frame's, when known without asking Spark."""
    if table.columns is None:
        return ChangeRead(frame, dict(found), columns=columns)
    undeclared = sorted(set(found) - set(table.columns))
    return ChangeRead(frame, dict(table.columns), undeclared=undeclared, columns=columns)


def arrival_names(versions: dict[tuple[str, str], str]) -> Column:
    """`_cdc_file` of later versions of a file: `name~v002`, ... (so they rank after the first)."""
    column = F.col(FILE)
    for (batch, name), file in versions.items():
        column = F.when((F.col(BATCH) == batch) & (F.col(FILE) == name), F.lit(file)).otherwise(
            column
        )
    return column


def files_spark_cannot_read(
    spark: SparkSession, files: Sequence[LandingFile], error: Exception
) -> list[Refusal]:
    """The Parquet files whose data Spark cannot read on their own: one full read of each (only
    after the whole hour's read failed); re-raises `error` when every file reads alone."""
    refusals = []
    for landing_file in files:
        try:
            # The noop sink reads every row of every column and writes nothing.
            frame = spark.read.parquet(landing.spark_path(landing_file.path))
            frame.write.format("noop").mode("overwrite").save()
        except Exception as own:
            reason = (
                f"unreadable Parquet file {landing_file.name} ({landing_file.size} bytes): its "
                f"footer reads but its data does not ({_spark_cause(own)})"
            )
            refusals.append(
                Refusal(
                    landing_file.batch,
                    landing_file.file,
                    landing_file.relative,
                    reason,
                    landing_file,
                )
            )
    if not refusals:
        raise error
    return refusals


def _spark_cause(error: Exception) -> str:
    """The innermost cause a Spark error names, in a few words (never a path or a trace)."""
    text = str(error)
    causes = re.findall(r"Caused by: ([\w.$]+(?:Exception|Error))(?:: ([^\n]*))?", text)
    if causes:
        kind, message = causes[-1]
        short = kind.rsplit(".", 1)[-1]
        message = re.sub(r"(file:)?/\S+", "<file>", message or "").strip()
        return f"{short}: {message}"[:200].rstrip(": ")
    error_class = re.search(r"\[([A-Z_.]+)\]", text)
    return error_class.group(1) if error_class else type(error).__name__
