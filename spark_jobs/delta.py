"""The Delta adapter: Spark writes Parquet files, delta-rs commits them; snapshot reads for Spark.

Spark cannot load a Delta connector here, so the transaction log is delta-rs's: a step reads one
snapshot (the files of one table version), lets Spark compute and write new Parquet files, and
then commits add (and, by partition filter, remove) actions in one atomic delta-rs commit made
from that same snapshot, so delta-rs sees the concurrent commits it must check against.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from cdc_pipeline.errors import ConcurrentWriteError

TMP_DIR = "_cdc_tmp"
RUN_ID_KEY = "cdc_run_id"
STEP_KEY = "cdc_step"
FILE_NAME_COLUMN = "_cdc_file_name"
# Operations that rearrange files without changing what a table holds.
_NON_DATA_OPERATIONS = {
    # Not OPTIMIZE: it replaces files an overwrite may have read, and delta-rs lets that
    # overwrite commit, leaving the compacted copy beside its rewrite.
    "VACUUM START",
    "VACUUM END",
    "CREATE TABLE",
    "SET TBLPROPERTIES",
}


def new_run_id() -> str:
    """A unique id for one attempt of one step; also names the files it writes."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


_barriers_passed: set[str] = set()


def inject_fault(point: str) -> None:
    """Test hooks at named points of a step; inert unless the environment asks for them.

    CDC_FAULT=<point> kills the process with SIGKILL there (crash tests). CDC_BARRIER=
    <point>|<folder>|<n> makes the first arrival of each process wait until n processes have
    arrived, so concurrency tests commit from the same snapshot instead of by luck.
    """
    if os.environ.get("CDC_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
    barrier = os.environ.get("CDC_BARRIER", "")
    if barrier.startswith(point + "|") and point not in _barriers_passed:
        _barriers_passed.add(point)
        _, folder, count = barrier.split("|")
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / str(os.getpid())).touch()
        deadline = time.monotonic() + 120
        while len(list(Path(folder).iterdir())) < int(count) and time.monotonic() < deadline:
            time.sleep(0.05)


@dataclass(frozen=True)
class DataFile:
    """One file of a snapshot: path relative to the table root, partition values, row count."""

    path: str
    size: int
    partition_values: dict[str, Any]
    num_records: int | None
    min_values: dict[str, Any] = field(default_factory=dict)
    max_values: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The file's base name, unique within the table for files written by this project."""
        return self.path.rsplit("/", 1)[-1]


@dataclass
class Snapshot:
    """One version of a Delta table, held open so a commit can be made from exactly it."""

    path: Path
    table: DeltaTable | None
    version: int
    schema: StructType | None
    partition_columns: list[str]
    files: list[DataFile] = field(default_factory=list)

    @property
    def exists(self) -> bool:
        """False while no table has been created at the path."""
        return self.table is not None

    @property
    def num_records(self) -> int:
        """Rows in this version, from the log's statistics (no data read)."""
        return sum(f.num_records or 0 for f in self.files)

    def files_in(self, partitions: Iterable[Any] | None) -> list[DataFile]:
        """Files of the given values of the (single) partition column; all files for None."""
        if partitions is None:
            return list(self.files)
        wanted = set(partitions)
        column = self.partition_columns[0]
        return [f for f in self.files if f.partition_values.get(column) in wanted]

    def partition_values(self) -> set[Any]:
        """Distinct values of the partition column in this version."""
        if not self.partition_columns:
            return set()
        column = self.partition_columns[0]
        return {f.partition_values.get(column) for f in self.files}


def spark_schema_of(table: DeltaTable) -> StructType:
    """The table's schema as a Spark StructType (Delta's schema JSON is Spark's)."""
    return StructType.fromJson(json.loads(table.schema().to_json()))


def load_snapshot(path: Path) -> Snapshot:
    """The latest version of the table at `path`, or an empty Snapshot when there is none."""
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return Snapshot(path, None, -1, None, [])
    partition_columns = list(table.metadata().partition_columns)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    files = [
        DataFile(
            path=unquote(row["path"]),
            size=int(row["size_bytes"]),
            partition_values={
                c: canonical_partition_value(row.get(f"partition.{c}")) for c in partition_columns
            },
            num_records=row.get("num_records"),
            min_values={k[4:]: v for k, v in row.items() if k.startswith("min.") and v is not None},
            max_values={k[4:]: v for k, v in row.items() if k.startswith("max.") and v is not None},
        )
        for row in actions
    ]
    return Snapshot(path, table, table.version(), spark_schema_of(table), partition_columns, files)


def ensure_table(
    path: Path, schema: StructType, partition_by: Sequence[str], description: str | None = None
) -> None:
    """Create an empty Delta table at `path` unless one exists (safe when two runs race)."""
    try:
        DeltaTable(str(path))
        return
    except TableNotFoundError:
        pass
    path.mkdir(parents=True, exist_ok=True)
    delta_schema = Schema.from_json(schema.json())
    try:
        DeltaTable.create(
            str(path),
            delta_schema,
            mode="ignore",
            partition_by=list(partition_by) or None,
            description=description,
        )
    except (CommitFailedError, OSError):
        # Another run created it in the meantime: that table is as good as ours.
        DeltaTable(str(path))


def read_snapshot(
    spark: SparkSession,
    snapshot: Snapshot,
    partitions: Iterable[Any] | None = None,
    columns: Sequence[str] | None = None,
    with_file_name: bool = False,
    files: Sequence[DataFile] | None = None,
) -> DataFrame:
    """The snapshot's rows (optionally only some partitions, files and columns) with partition
    values.

    Delta data files do not hold partition values; they come from the log: as constants when
    every file read is in one partition, else joined on each row's file name (a small
    broadcast map of metadata, not row data).
    """
    if snapshot.schema is None:
        raise ValueError(f"no Delta table at {snapshot.path}")
    schema = snapshot.schema
    wanted = list(columns) if columns is not None else [f.name for f in schema.fields]
    files = list(files) if files is not None else snapshot.files_in(partitions)
    out_fields = [schema[c] for c in wanted]
    if with_file_name:
        out_fields.append(StructField(FILE_NAME_COLUMN, StringType(), True))
    if not files:
        return local_frame(spark, [], StructType(out_fields))
    if snapshot.partition_columns and len({f.name for f in files}) != len(files):
        # Partition values are joined on the file name, which must therefore be unique.
        raise RuntimeError(
            f"{snapshot.path}: two data files share a base name; cannot restore partitions"
        )
    data_fields = [f for f in schema.fields if f.name not in snapshot.partition_columns]
    paths = [str(snapshot.path / f.path) for f in files]
    df = spark.read.schema(StructType(data_fields)).parquet(*paths)
    needs_partition = [c for c in snapshot.partition_columns if c in wanted]
    values = {tuple(f.partition_values[c] for c in needs_partition) for f in files}
    if needs_partition and len(values) == 1:
        # One partition: its values are constants, no join needed.
        for column, value in zip(needs_partition, values.pop(), strict=True):
            constant = F.lit(partition_value_string(value)).cast(schema[column].dataType)
            df = df.withColumn(column, constant)
        needs_partition = []
    if needs_partition or with_file_name:
        df = df.withColumn(FILE_NAME_COLUMN, F.col("_metadata.file_name"))
    if needs_partition:
        map_schema = StructType([StructField(FILE_NAME_COLUMN, StringType(), False)])
        for column in needs_partition:
            map_schema.add(schema[column])
        rows = [(f.name, *[f.partition_values[c] for c in needs_partition]) for f in files]
        mapping = local_frame(spark, rows, map_schema)
        df = df.join(F.broadcast(mapping), on=FILE_NAME_COLUMN, how="inner")
    select = [F.col(c) for c in wanted]
    if with_file_name:
        select.append(F.col(FILE_NAME_COLUMN))
    return df.select(*select)


def local_frame(
    spark: SparkSession, rows: Sequence[Sequence[Any]] | pa.Table, schema: StructType
) -> DataFrame:
    """A small driver-side table (metadata such as file names and partition values) as a
    Spark local relation: joins broadcast it straight from the driver, with no Spark job.
    `rows`: tuples in the order of `schema`, or an Arrow table with its columns."""
    nullable = StructType([StructField(f.name, f.dataType, True) for f in schema.fields])
    if isinstance(rows, pa.Table):
        table = rows.select(schema.names)
    else:
        arrow_schema = to_arrow_schema(nullable, timezone="UTC")
        table = pa.Table.from_pylist(
            [dict(zip(schema.names, row, strict=True)) for row in rows], arrow_schema
        )
    if table.num_rows == 0:
        # Spark Connect cannot infer a schema from an empty table: give it the one wanted.
        return spark.createDataFrame([], nullable)
    return spark.createDataFrame(table).select(
        *[F.col(f.name).cast(f.dataType) for f in schema.fields]
    )


def canonical_partition_value(value: Any) -> Any:
    """A partition value in the one form every comparison uses: a timestamp as a naive UTC
    datetime (the log and Arrow give aware ones, and a naive and an aware datetime are never
    equal), anything else as it is."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def partition_values_of(frame: DataFrame, column: str) -> set[Any]:
    """The distinct values of `column` in `frame`, in canonical form (None included).

    Through Arrow, not `collect()`: Spark's Python rows turn timestamps into the local time of
    the Python process."""
    values = frame.select(column).distinct().toArrow()  # metadata: partition values
    return {canonical_partition_value(v) for v in values.column(0).to_pylist()}


def partition_value_string(value: Any) -> str | None:
    """A partition value as the Delta log stores it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


@dataclass(frozen=True)
class WrittenFiles:
    """Files one attempt wrote into a table folder, ready to commit (or to delete)."""

    table_path: Path
    actions: list[AddAction]

    @property
    def rows(self) -> int:
        """Rows in the written files, from their Parquet footers."""
        return sum(json.loads(a.stats)["numRecords"] for a in self.actions)

    def delete(self) -> None:
        """Remove the files (after a failed commit): they were never visible to readers."""
        for action in self.actions:
            (self.table_path / unquote(action.path)).unlink(missing_ok=True)


def write_files(
    df: DataFrame,
    table_path: Path,
    partition_by: Sequence[str],
    run_id: str,
    sort_within: Sequence[str] = (),
) -> WrittenFiles:
    """Write `df` as Parquet into the table folder (not yet committed) and describe the files.

    Spark writes into a private temporary folder; the files are then renamed into the table's
    partition folders under names carrying the run id, so a file name is unique in the table.
    """
    tmp = table_path / TMP_DIR / run_id
    _spark_write(df, tmp, partition_by, sort_within)
    written = _adopt_files(tmp, table_path, len(partition_by), run_id)
    shutil.rmtree(tmp, ignore_errors=True)
    return written


ROUTE_COLUMN = "_cdc_route"


def write_routed(
    df: DataFrame,
    routes: Mapping[str, tuple[Path, Sequence[str], Sequence[str]]],
    run_id: str,
    sort_within: Sequence[str] = (),
) -> dict[str, WrittenFiles]:
    """Write rows for several tables in one Spark job; each row's `_cdc_route` names its table.

    `routes` maps a route value to (table path, partition columns, data columns). The rows of
    every route carry the union of all routes' columns: a file holds only its route's data
    columns as read by that table's schema (other columns are null; readers select by schema)
    and its statistics cover only those columns. The first route's partition columns are the
    write's; a route without partition columns takes its files from every folder.
    """
    names = list(routes)
    first_path, first_partitions, _ = routes[names[0]]
    for _, partitions, _ in routes.values():
        if partitions and list(partitions) != list(first_partitions):
            raise ValueError("routed tables must share their partition columns or have none")
    tmp = first_path / TMP_DIR / run_id
    _spark_write(df, tmp, [ROUTE_COLUMN, *first_partitions], sort_within)
    written: dict[str, WrittenFiles] = {}
    for name in names:
        path, partitions, columns = routes[name]
        folder = tmp / f"{ROUTE_COLUMN}={name}"
        written[name] = _adopt_files(
            folder, path, len(partitions), run_id, keep_dirs=bool(partitions), columns=columns
        )
    shutil.rmtree(tmp, ignore_errors=True)
    return written


def _spark_write(
    df: DataFrame, tmp: Path, partition_by: Sequence[str], sort_within: Sequence[str]
) -> None:
    writer_df = df.sortWithinPartitions(*sort_within) if sort_within else df
    writer = writer_df.write.mode("overwrite").option("compression", "snappy")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(str(tmp))


def _adopt_files(
    tmp: Path,
    table_path: Path,
    partition_depth: int,
    run_id: str,
    keep_dirs: bool = True,
    columns: Sequence[str] | None = None,
) -> WrittenFiles:
    """Move the Parquet files Spark wrote under `tmp` into the table folder, as add actions."""
    actions: list[AddAction] = []
    counter = 0
    sources = sorted(tmp.rglob("*.parquet")) if tmp.exists() else []
    for source in sources:
        relative_dir = source.parent.relative_to(tmp)
        if any(
            part.startswith(".") or (part.startswith("_") and "=" not in part)
            for part in relative_dir.parts
        ):
            continue  # Spark's own bookkeeping, not data
        metadata = pq.read_metadata(source)
        rows = metadata.num_rows
        if rows == 0:
            source.unlink()
            continue
        counter += 1
        target_dir = relative_dir if keep_dirs else Path()
        relative = target_dir / f"part-{counter:05d}-{run_id}.snappy.parquet"
        target = table_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        values: dict[str, str | None] = {}
        for part in target_dir.parts[:partition_depth]:
            key, _, raw = part.partition("=")
            value = unquote(raw)
            values[key] = None if value == "__HIVE_DEFAULT_PARTITION__" else value
        stats = footer_stats(metadata)
        if columns is not None:
            wanted = set(columns)
            stats = {
                kind: {c: v for c, v in by.items() if c in wanted} for kind, by in stats.items()
            }
        stat = target.stat()
        actions.append(
            AddAction(
                path=relative.as_posix(),
                size=stat.st_size,
                partition_values=values,
                modification_time=int(stat.st_mtime * 1000),
                data_change=True,
                stats=json.dumps({"numRecords": rows, **stats}),
            )
        )
    return WrittenFiles(table_path, actions)


_MAX_STATS_STRING = 256


def _stats_value(value: Any) -> Any:
    """A footer min/max as Delta stats JSON holds it, or None for types not recorded."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return value if len(value) <= _MAX_STATS_STRING else None
    if isinstance(value, date) and not isinstance(value, datetime):
        return value.isoformat()
    return None


def footer_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta file statistics (minValues, maxValues, nullCount) from a Parquet footer.

    Recorded for integer, string and date columns whose every row group has statistics, so
    readers (and the moved-key lookup of overwrite-final) can skip files by value range.
    """
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for index in range(metadata.num_columns):
        name = metadata.schema.column(index).path
        if "." in name:
            continue  # nested: not recorded
        low = high = None
        null_count = 0
        complete = True
        for group in range(metadata.num_row_groups):
            column = metadata.row_group(group).column(index)
            stats = column.statistics
            if stats is None or not stats.has_null_count:
                complete = False
                break
            null_count += stats.null_count
            if not stats.has_min_max:
                if stats.null_count != column.num_values:
                    complete = False
                    break
                continue  # only nulls in this row group
            try:
                group_low, group_high = _stats_value(stats.min), _stats_value(stats.max)
            except (pa.ArrowNotImplementedError, ValueError):  # a type pyarrow cannot convert
                complete = False
                break
            if group_low is None or group_high is None:
                complete = False
                break
            low = group_low if low is None else min(low, group_low)
            high = group_high if high is None else max(high, group_high)
        if not complete:
            continue
        nulls[name] = null_count
        if low is not None and high is not None:
            mins[name], maxs[name] = low, high
    return {"minValues": mins, "maxValues": maxs, "nullCount": nulls}


@dataclass(frozen=True)
class CommitResult:
    """The version a commit produced and whether other data commits slipped in before it."""

    version: int
    interfering_versions: list[int]


def commit(
    snapshot: Snapshot,
    written: WrittenFiles,
    mode: str,
    step: str,
    run_id: str,
    partition_filters: list[tuple[str, str, Any]] | None = None,
    schema: StructType | None = None,
    exclusive: bool = False,
) -> CommitResult:
    """Commit the written files from `snapshot`'s version in one atomic delta-rs commit.

    mode "append" adds the files; mode "overwrite" also removes every file of the snapshot
    that matches `partition_filters` (all files when None), and may change the table's schema
    to `schema`. Raises CommitFailedError when a concurrent commit conflicts; the caller
    deletes its files and retries from a new snapshot.

    `exclusive`: commit only as the version right after the snapshot (delta-rs
    max_commit_retries=0), so any commit landing after the read fails this one. For rewrites:
    delta-rs lets an overwrite commit after commits it does not see as conflicts, an OPTIMIZE
    that compacted files the overwrite read (its copy of those rows would stay beside the
    rewrite), or another overwrite that created the same new partition.
    """
    if snapshot.table is None or snapshot.schema is None:
        raise ValueError(f"no Delta table at {snapshot.path}")
    actions: list[AddAction | RemoveAction] = list(written.actions)
    snapshot.table.create_write_transaction(
        actions,
        mode=mode,
        schema=Schema.from_json((schema or snapshot.schema).json()),
        partition_by=snapshot.partition_columns or None,
        partition_filters=partition_filters,
        commit_properties=CommitProperties(
            custom_metadata={RUN_ID_KEY: run_id, STEP_KEY: step},
            max_commit_retries=0 if exclusive else None,
        ),
    )
    return find_commit(snapshot.path, snapshot.version, run_id)


def find_commit(path: Path, read_version: int, run_id: str) -> CommitResult:
    """Locate our commit after `read_version` and list data commits made between the two.

    Reads the commit files of the log (the Delta protocol's `_delta_log/<version>.json`)
    instead of `DeltaTable.history`: delta-rs 1.6 labels history entries from the version
    the table object loaded, so a commit landing between that load and the call shifts every
    label (seen here under three concurrent runs: our commit "not found", or another run's
    commit taken for one made before our read).
    """
    between: list[int] = []
    version = read_version + 1
    while True:
        info = _commit_info(path, version)
        if info is None:
            raise RuntimeError(f"commit of run {run_id} not found in the log of {path}")
        if info.get(RUN_ID_KEY) == run_id:
            return CommitResult(version, between)
        if info.get("operation") not in _NON_DATA_OPERATIONS:
            between.append(version)
        version += 1


def _commit_info(path: Path, version: int) -> dict[str, Any] | None:
    """The commitInfo of one version of the table's log; None when there is no such version."""
    try:
        text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.startswith('{"commitInfo"'):
            info = json.loads(line)["commitInfo"]
            return info if isinstance(info, dict) else {}
    return {}


def try_commit(
    snapshot: Snapshot,
    written: WrittenFiles,
    mode: str,
    step: str,
    run_id: str,
    attempt: int,
    partition_filters: list[tuple[str, str, Any]] | None = None,
    exclusive: bool = False,
) -> CommitResult | None:
    """Commit, or after a conflict delete the written files, back off and return None (retry)."""
    try:
        return commit(snapshot, written, mode, step, run_id, partition_filters, exclusive=exclusive)
    except CommitFailedError:
        written.delete()
        sleep_before_retry(attempt)
        return None


def append_with_retries(
    frame: DataFrame,
    path: Path,
    step: str,
    max_attempts: int,
    fault_point: str | None = None,
) -> tuple[int, int]:
    """Append `frame` to the existing table at `path`; returns (rows, version), retrying conflicts."""
    for attempt in range(1, max_attempts + 1):
        snapshot = load_snapshot(path)
        run_id = new_run_id()
        written = write_files(frame, path, snapshot.partition_columns, run_id)
        if not written.actions:
            return 0, snapshot.version
        if fault_point is not None:
            inject_fault(fault_point)
        result = try_commit(snapshot, written, "append", step, run_id, attempt)
        if result is not None:
            return written.rows, result.version
    raise ConcurrentWriteError(
        f"{path}: {max_attempts} conflicting commits in a row; nothing was lost, run the step again"
    )


def remove_duplicate_rows(spark: SparkSession, path: Path, step: str, max_attempts: int) -> int:
    """Rewrite a small set-like table (tombstones) with one copy of each row; returns its version."""
    for attempt in range(1, max_attempts + 1):
        snapshot = load_snapshot(path)
        rows = read_snapshot(spark, snapshot)
        total = snapshot.num_records
        if rows.distinct().count() == total:
            return snapshot.version
        run_id = new_run_id()
        written = write_files(rows.distinct(), path, snapshot.partition_columns, run_id)
        result = try_commit(
            snapshot, written, "overwrite", f"{step}_deduplicate", run_id, attempt, exclusive=True
        )
        if result is not None and not result.interfering_versions:
            return result.version
    raise ConcurrentWriteError(f"{path}: could not remove duplicate rows; run the step again")


def evolved_schema(current: StructType, target: StructType) -> StructType:
    """`current` with the types of `target` where they differ, then `target`'s new columns."""
    wanted = {f.name: f for f in target.fields}
    fields = [
        StructField(f.name, wanted[f.name].dataType, True)
        if f.name in wanted and wanted[f.name].dataType != f.dataType
        else f
        for f in current.fields
    ]
    known = {f.name for f in current.fields}
    fields += [StructField(f.name, f.dataType, True) for f in target.fields if f.name not in known]
    return StructType(fields)


def evolve_table(
    spark: SparkSession, path: Path, target: StructType, max_attempts: int = 8
) -> list[str]:
    """Give the table at `path` the columns and types of `target`; returns what changed.

    New columns are a metadata-only commit (older files read them as null). A widened type
    rewrites the whole table with its values cast, in one overwrite commit that also sets the
    new schema, so every file matches the schema the log declares.
    """
    for attempt in range(1, max_attempts + 1):
        snapshot = load_snapshot(path)
        if snapshot.table is None or snapshot.schema is None:
            return []
        current = snapshot.schema
        new_schema = evolved_schema(current, target)
        if new_schema == current:
            return []
        known = {f.name: f.dataType for f in current.fields}
        widened = [
            f"{f.name} {known[f.name].simpleString()} -> {f.dataType.simpleString()}"
            for f in new_schema.fields
            if f.name in known and known[f.name] != f.dataType
        ]
        added = [
            f"{f.name} {f.dataType.simpleString()}"
            for f in new_schema.fields
            if f.name not in known
        ]
        changes = [f"add {a}" for a in added] + [f"widen {w}" for w in widened]
        run_id = new_run_id()
        if not widened:
            fields = Schema.from_json(
                StructType([f for f in new_schema.fields if f.name not in known]).json()
            ).fields
            try:
                snapshot.table.alter.add_columns(
                    fields,
                    commit_properties=CommitProperties(
                        custom_metadata={RUN_ID_KEY: run_id, STEP_KEY: "evolve_schema"}
                    ),
                )
            except CommitFailedError:
                sleep_before_retry(attempt)
                continue
            return changes
        rows = read_snapshot(spark, snapshot).select(
            *[
                (F.col(f.name) if f.name in known else F.lit(None)).cast(f.dataType).alias(f.name)
                for f in new_schema.fields
            ]
        )
        written = write_files(rows, path, snapshot.partition_columns, run_id)
        result = None
        try:
            result = commit(
                snapshot,
                written,
                "overwrite",
                "evolve_schema",
                run_id,
                schema=new_schema,
                exclusive=True,
            )
        except CommitFailedError:
            written.delete()
            sleep_before_retry(attempt)
        if result is not None:
            return changes
    raise ConcurrentWriteError(
        f"{path}: could not change the schema ({max_attempts} conflicting commits); run again"
    )


def retry_delay(attempt: int) -> float:
    """Back-off before attempt `attempt` (1-based) of a step that lost a commit race."""
    return min(8.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + (uuid.uuid4().int % 1000) / 1000)


def sleep_before_retry(attempt: int) -> None:
    """Sleep the back-off of `attempt`."""
    time.sleep(retry_delay(attempt))


def arrow_table_rows(path: Path, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a small metadata table (the ledger) read by delta-rs on the driver."""
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return []
    return pa.table(table.to_pyarrow_table(columns=columns)).to_pylist()
