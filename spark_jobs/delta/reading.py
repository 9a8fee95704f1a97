"""Read a snapshot: one version of a Delta table, its files, and its rows for Spark."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from cdc_pipeline.columns import quoted, string_literal
from cdc_pipeline.errors import TableDamagedError, damaged_table_fix
from cdc_pipeline.paths import Location
from spark_jobs.runtime.storage import store_for

FILE_NAME_COLUMN = "_cdc_file_name"
FILE_NAME_SOURCE = "_metadata.file_name"  # the name of the file Spark read a row from
# A read of several partitions gives each row its partition values by a CASE over its file name
# up to this many set lookups (rows times the values before theirs); above it by joining a map
# of the files, a broadcast that costs a Spark job in every query (about 20-40 ms here).
PARTITION_CASE_MAX = 2_000_000

# Properties of every table the steps create. A checkpoint every 10 commits (delta-rs writes it
# after the commit that reaches the interval; the default is 100): a table loads from its last
# checkpoint plus at most 9 commits, so a step's log reads do not grow with the runs of the day
# (a `*/15` table makes 96 commits a day in staging, final, the ledger and applied each).
TABLE_PROPERTIES = {"delta.checkpointInterval": "10"}


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

    path: Location
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


# Tables opened and finished with during one step (`reusing_tables`), by location, in the
# step's thread: opening one of them again brings it up to date (a listing of the log after its
# version: 0.4 ms of the client's CPU here) instead of loading it anew (the last checkpoint and
# every commit since: 2-6 ms, and several requests on object storage). A step opens final and
# tombstones three times each (ensure, the schema check, the snapshot), the ledger and applied
# twice.
_step = threading.local()  # .finished: {location: (table, its version, _commit_identity)}


@contextmanager
def reusing_tables() -> Iterator[None]:
    """Within (in this thread): `open_table` reuses a table a reader finished with (`finished`),
    brought up to date. A step's scope: no table is kept longer than the step that opened it. A
    nested scope is the outer one."""
    if getattr(_step, "finished", None) is not None:
        yield
        return
    _step.finished = {}
    try:
        yield
    finally:
        _step.finished = None


def commit_file(path: Location, version: int) -> Location:
    """The commit file of `version` in the log of the table at `path` (the Delta protocol's
    `_delta_log/<version, 20 digits>.json`)."""
    return path / "_delta_log" / f"{version:020d}.json"


def _commit_identity(path: Location, version: int) -> tuple[int, int | None] | None:
    """(size, mtime) of the table's commit file of `version`; None when there is none. (Object
    storage keeps mtimes in seconds: a log deleted and written again within the same second,
    that commit the same size, would pass.)"""
    commit = commit_file(path, version)
    entry = store_for(commit).info(commit)
    return None if entry is None else (entry.size, entry.mtime_ns)


def finished(path: Location, table: DeltaTable) -> None:
    """`table` (opened at `path`) is not used any further by its holder: the next open of
    `path` in this step may take it. Never a Snapshot's table: its version is what it commits
    against, so it must not move under it."""
    tables = getattr(_step, "finished", None)
    if tables is None:
        return
    version = table.version()
    identity = _commit_identity(path, version)
    if identity is not None:
        tables[str(path)] = (table, version, identity)


def _reopened(path: Location) -> DeltaTable | None:
    """A finished table of `path`, up to date, taken from the step's tables (each goes to one
    holder at a time); None when there is none or it cannot be trusted: the commit file of the
    version it had is gone or another file now (the log deleted, or made again: a table brought
    up to date only reads the commits after its version). Then it is opened anew."""
    tables = getattr(_step, "finished", None)
    found = tables.pop(str(path), None) if tables is not None else None
    if found is None:
        return None
    table, version, identity = found
    if _commit_identity(path, version) != identity:
        return None
    try:
        table.update_incremental()
    except (DeltaError, OSError):  # a damaged commit since: opened anew, it names it
        return None
    return table


def open_table(path: Location) -> DeltaTable | None:
    """The Delta table at `path` (None when there is none).

    Raises TableDamagedError naming the path when its log cannot be read: a corrupt or truncated
    commit file fails every run the same way, so it must not look like a passing glitch.
    """
    reopened = _reopened(path)
    if reopened is not None:
        return reopened
    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None
    except DeltaError as error:
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        damaged = damaged_commit(path)
        where = f"version {damaged[0]}, {damaged[1]}" if damaged else "its log (_delta_log)"
        # A table's folders are {warehouse}/<table>/<folder>: the fix names both.
        fix = damaged_table_fix(path.name, path.parent.name)
        raise TableDamagedError(
            f"the Delta table {path} cannot be read ({cause}): {where} is damaged. Retrying "
            f"does not help: {fix}",
            where=where,
            cause=cause,
        ) from None


# How many of a log's newest commit files are parsed to name a damaged one.
DAMAGE_SCAN_COMMITS = 200


def damaged_commit(path: Location) -> tuple[int, str] | None:
    """(version, file) of the newest commit file of the table's log that is not JSON lines (a
    truncated or overwritten commit), among its newest DAMAGE_SCAN_COMMITS; None if none is."""
    log_dir = path / "_delta_log"
    store = store_for(log_dir)
    try:
        names = sorted(
            (e.name for e in store.list_dir(log_dir) if e.name.endswith(".json")), reverse=True
        )
    except OSError:
        return None
    for name in names[:DAMAGE_SCAN_COMMITS]:
        stem = name[: -len(".json")]
        if not stem.isdigit():
            continue
        try:
            text = store.read_text(log_dir / name) or ""
            for line in text.splitlines():
                if line.strip():
                    json.loads(line)
        except (OSError, ValueError):
            return int(stem), f"_delta_log/{name}"
    return None


def load_snapshot(path: Location) -> Snapshot:
    """The latest version of the table at `path`, or an empty Snapshot when there is none."""
    table = open_table(path)
    if table is None:
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
    path: Location, schema: StructType, partition_by: Sequence[str], description: str | None = None
) -> None:
    """Create an empty Delta table at `path` unless one exists (safe when two runs race)."""
    table = open_table(path)  # a damaged log: TableDamagedError, not a raw DeltaError
    if table is not None:
        finished(path, table)
        return
    store_for(path).make_dirs(path)
    delta_schema = Schema.from_json(schema.json())
    try:
        DeltaTable.create(
            str(path),
            delta_schema,
            mode="ignore",
            partition_by=list(partition_by) or None,
            description=description,
            configuration=TABLE_PROPERTIES,
        )
    except (CommitFailedError, OSError):
        # Another run created it in the meantime: that table is as good as ours.
        open_table(path)


def read_snapshot(
    spark: SparkSession,
    snapshot: Snapshot,
    partitions: Iterable[Any] | None = None,
    columns: Sequence[str] | None = None,
    *,
    with_file_name: bool = False,
    files: Sequence[DataFile] | None = None,
) -> DataFrame:
    """The snapshot's rows (optionally only some partitions, files and columns) with partition
    values.

    Delta data files do not hold partition values; they come from the log: as constants when
    every file read is in one partition, else from each row's file name, by a CASE over the
    names (`partition_value_texts`) or, for many rows in many partitions, by joining a small
    broadcast map of the files (metadata, not row data).
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
        # Partition values come by the file name, which must therefore be unique.
        raise RuntimeError(
            f"{snapshot.path}: two data files share a base name; cannot restore partitions"
        )
    data_fields = [f for f in schema.fields if f.name not in snapshot.partition_columns]
    paths = [str(snapshot.path / f.path) for f in files]
    df = spark.read.schema(StructType(data_fields)).parquet(*paths)
    needs_partition = [c for c in snapshot.partition_columns if c in wanted]
    values = partition_value_texts(files, needs_partition, schema)
    select = [values.get(c, quoted(c)) for c in wanted]
    if with_file_name:
        select.append(f"{FILE_NAME_SOURCE} AS {quoted(FILE_NAME_COLUMN)}")
    if len(values) < len(needs_partition):
        # Many rows in several partitions: each row's values from a broadcast map of its file.
        map_schema = StructType([StructField(FILE_NAME_COLUMN, StringType(), False)])
        for column in needs_partition:
            map_schema.add(schema[column])
        rows = [(f.name, *[f.partition_values[c] for c in needs_partition]) for f in files]
        mapping = local_frame(spark, rows, map_schema)
        df = df.withColumn(FILE_NAME_COLUMN, F.col(FILE_NAME_SOURCE))
        df = df.join(F.broadcast(mapping), on=FILE_NAME_COLUMN, how="inner")
        select = [quoted(c) for c in [*wanted, *([FILE_NAME_COLUMN] if with_file_name else [])]]
    # Expression texts: a classic session sends each `F.col` to the JVM as requests of its own.
    return df.selectExpr(*select)


def partition_value_texts(
    files: Sequence[DataFile], columns: Sequence[str], schema: StructType
) -> dict[str, str]:
    """Each partition column's value for the rows of `files`, as expression text (`column` ->
    text): a constant when the files share one value, else a CASE over each row's file name.
    Empty when some column cannot have one: the CASE adds a set lookup per row for each value
    before the row's, so it is kept under PARTITION_CASE_MAX lookups a read (unknown row counts
    count as over), and a file name or value that would need escaping (a quote, a backslash)
    has none."""
    counts = [f.num_records for f in files]
    rows = PARTITION_CASE_MAX + 1 if None in counts else sum(c or 0 for c in counts)
    texts: dict[str, str] = {}
    lookups = 0
    for column in columns:
        groups: dict[str | None, list[str]] = {}
        for file in files:
            value = partition_value_string(file.partition_values[column])
            groups.setdefault(value, []).append(file.name)
        values = {v: "NULL" if v is None else string_literal(v) for v in groups}
        names = {v: [string_literal(n) for n in group] for v, group in groups.items()}
        if len(groups) > 1:
            lookups += rows * (len(groups) - 1)
            if lookups > PARTITION_CASE_MAX or any(None in n for n in names.values()):
                return {}
        if None in values.values():
            return {}
        kind = schema[column].dataType.simpleString()
        casts = {v: f"CAST({values[v]} AS {kind})" for v in groups}
        whens = [
            f"WHEN {FILE_NAME_SOURCE} IN ({', '.join(str(n) for n in names[v])}) THEN {casts[v]}"
            for v in groups
        ]
        text = casts.popitem()[1] if len(groups) == 1 else f"CASE {' '.join(whens)} END"
        texts[column] = f"{text} AS {quoted(column)}"
    return texts


def local_frame(
    spark: SparkSession, rows: Sequence[Sequence[Any]] | pa.Table, schema: StructType
) -> DataFrame:
    """A small driver-side table (metadata such as file names and partition values) as a
    Spark local relation: it reaches a join straight from the driver, with no Spark job to read
    it (a broadcast of it still runs one). `rows`: tuples in the order of `schema`, or an Arrow
    table with its columns.

    Built from Arrow in both modes: a classic session's `createDataFrame` of Python rows gives
    an RDD instead, whose empty tasks each query then schedules. Columns whose Arrow type is
    already the wanted one are not cast: the cast is a projection the optimizer evaluates over
    every row of the relation again in each query that uses it.
    """
    nullable = StructType([StructField(f.name, f.dataType, True) for f in schema.fields])
    arrow_schema = to_arrow_schema(nullable, timezone="UTC")
    if isinstance(rows, pa.Table):
        table = rows.select(schema.names)
    else:
        table = pa.Table.from_pylist(
            [dict(zip(schema.names, row, strict=True)) for row in rows], arrow_schema
        )
    if table.num_rows == 0:
        # With the schema wanted: Spark Connect cannot infer one from an empty table.
        return spark.createDataFrame(arrow_schema.empty_table(), nullable)
    if table.schema.types == arrow_schema.types:
        # Given the schema, Spark takes its types as they are (inferred from Arrow, a naive
        # timestamp would become a session-zone timestamp, not timestamp_ntz).
        return spark.createDataFrame(table, nullable)
    return spark.createDataFrame(table).select(
        *[F.col(f.name).cast(f.dataType) for f in schema.fields]
    )


def arrow_and_schema(frame: DataFrame) -> tuple[pa.Table, StructType]:
    """`frame`'s rows as Arrow and its schema, from one request under Connect (its `toArrow`
    first asks the server for the schema, a request of its own that analyses the whole plan;
    the query's response carries it)."""
    from spark_jobs.runtime.session import is_connect

    if is_connect(frame.sparkSession):
        rows, schema = frame._to_table()  # type: ignore[operator]
        if schema is not None:
            return rows, schema
    return frame.toArrow(), frame.schema


def with_known_schema(frame: DataFrame, fields: Sequence[StructField]) -> DataFrame:
    """`frame` told its columns (`fields`, made nullable), known without asking Spark: before
    a Connect client's `toArrow` runs a query it asks the server for the frame's schema, a
    request of its own that analyses the whole plan."""
    return frame.to(StructType([StructField(f.name, f.dataType, True) for f in fields]))


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


def arrow_table(path: Location, columns: list[str] | None = None) -> pa.Table | None:
    """A small metadata table (the ledger, applied) read by delta-rs on the driver, as Arrow
    columns (None when there is no table)."""
    table = open_table(path)
    if table is None:
        return None
    rows = pa.table(table.to_pyarrow_table(columns=columns))
    finished(path, table)
    return rows


def arrow_table_rows(path: Location, columns: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows of a small metadata table read by delta-rs on the driver (Python objects: 10-20 us
    a row, use `arrow_table` for one that grows with every run)."""
    table = arrow_table(path, columns)
    return [] if table is None else table.to_pylist()
