"""Write files: Spark writes Parquet into a table folder, not yet committed, described as add actions."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame

from cdc_pipeline.paths import Location
from spark_jobs.delta.reading import DataFile
from spark_jobs.runtime.storage import store_for

TMP_DIR = "_cdc_tmp"
# A file of fewer rows tells little of a column's values: parquet rejects a dictionary for a
# handful of rows even when the column has a few distinct values.
PLAIN_SAMPLE_MIN_ROWS = 1_000
# The name `_adopt_files` gives a file; group 1 is the run id's time, so names sort by age.
_WRITTEN_HERE = re.compile(r"part-\d{5,}-(\d{8}T\d{6})-[0-9a-f]{12}\.snappy\.parquet")


@dataclass(frozen=True)
class WrittenFiles:
    """Files one attempt wrote into a table folder, ready to commit (or to delete)."""

    table_path: Location
    actions: list[AddAction]

    @property
    def rows(self) -> int:
        """Rows in the written files, from their Parquet footers."""
        return sum(json.loads(a.stats)["numRecords"] for a in self.actions)

    def delete(self) -> None:
        """Remove the files (after a failed commit): they were never visible to readers."""
        store = store_for(self.table_path)
        for action in self.actions:
            store.remove(self.table_path / unquote(action.path))


def plain_columns(table_path: Location, files: Sequence[DataFile]) -> list[str]:
    """The columns Spark's Parquet writer last wrote without a dictionary in this table: it
    tried one and dropped it (the values are mostly distinct: keys, ids, measures).

    A write told these columns (`plain`) skips building a dictionary it would throw away, which
    is most of the CPU of writing such columns; the others keep theirs, so the files are the
    same size. Learnt from the newest file of at least PLAIN_SAMPLE_MIN_ROWS rows that a Spark
    step wrote (parquet-mr drops a dictionary that does not pay from the first page; delta-rs's
    OPTIMIZE keeps one until it is 1 MiB, so its files tell nothing). Nothing is learnt (an
    empty list) when there is no such file or it cannot be read.
    """
    ours = [
        (found[1], f.size, f)
        for f in files
        if (f.num_records or 0) >= PLAIN_SAMPLE_MIN_ROWS
        and (found := _WRITTEN_HERE.fullmatch(f.name)) is not None
    ]
    if not ours:
        return []
    newest = max(ours, key=lambda item: item[:2])[2]
    try:
        with store_for(table_path).open_read(table_path / newest.path) as handle:
            metadata = pq.read_metadata(handle)
    except (OSError, pa.ArrowException):
        return []  # vacuumed meanwhile, or unreadable: every column tries a dictionary
    if not (metadata.created_by or "").startswith("parquet-mr"):
        return []
    plain = []
    for index in range(metadata.num_columns):
        name = metadata.schema.column(index).path
        chunks = [metadata.row_group(g).column(index) for g in range(metadata.num_row_groups)]
        if "." not in name and chunks and not any(c.has_dictionary_page for c in chunks):
            plain.append(name)
    return plain


def write_files(
    df: DataFrame,
    table_path: Location,
    partition_by: Sequence[str],
    run_id: str,
    sort_within: Sequence[str] = (),
    plain: Sequence[str] = (),
) -> WrittenFiles:
    """Write `df` as Parquet into the table folder (not yet committed) and describe the files.

    Spark writes into a private temporary folder; the files are then renamed into the table's
    partition folders under names carrying the run id, so a file name is unique in the table.
    `plain`: columns written without a dictionary (see `plain_columns`).
    """
    tmp = table_path / TMP_DIR / run_id
    _spark_write(df, tmp, partition_by, sort_within, plain)
    written = _adopt_files(tmp, table_path, len(partition_by), run_id)
    store_for(tmp).remove_tree(tmp)
    return written


ROUTE_COLUMN = "_cdc_route"


def write_routed(
    df: DataFrame,
    routes: Mapping[str, tuple[Location, Sequence[str], Sequence[str]]],
    run_id: str,
    sort_within: Sequence[str] = (),
    plain: Sequence[str] = (),
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
    _spark_write(df, tmp, [ROUTE_COLUMN, *first_partitions], sort_within, plain)
    written: dict[str, WrittenFiles] = {}
    for name in names:
        path, partitions, columns = routes[name]
        folder = tmp / f"{ROUTE_COLUMN}={name}"
        written[name] = _adopt_files(
            folder, path, len(partitions), run_id, keep_dirs=bool(partitions), columns=columns
        )
    store_for(tmp).remove_tree(tmp)
    return written


def _spark_write(
    df: DataFrame,
    tmp: Location,
    partition_by: Sequence[str],
    sort_within: Sequence[str],
    plain: Sequence[str] = (),
) -> None:
    writer_df = df.sortWithinPartitions(*sort_within) if sort_within else df
    writer = writer_df.write.mode("overwrite").option("compression", "snappy")
    for column in plain:
        # parquet-mr's per-column setting, passed through the write's Hadoop configuration.
        writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(str(tmp))


def _adopt_files(
    tmp: Location,
    table_path: Location,
    partition_depth: int,
    run_id: str,
    *,
    keep_dirs: bool = True,
    columns: Sequence[str] | None = None,
) -> WrittenFiles:
    """Move the Parquet files Spark wrote under `tmp` into the table folder, as add actions."""
    actions: list[AddAction] = []
    counter = 0
    store = store_for(tmp)
    prefix = f"{tmp}/"
    sources = [e for e in store.walk(tmp) if e.is_file() and e.name.endswith(".parquet")]
    for source in sorted(sources, key=lambda e: str(e.location)):
        relative_dir = PurePosixPath(str(source.location)[len(prefix) :]).parent
        if any(
            part.startswith(".") or (part.startswith("_") and "=" not in part)
            for part in relative_dir.parts
        ):
            continue  # Spark's own bookkeeping, not data
        with store.open_read(source.location) as handle:
            metadata = pq.read_metadata(handle)
        rows = metadata.num_rows
        if rows == 0:
            store.remove(source.location)
            continue
        counter += 1
        target_dir = relative_dir if keep_dirs else PurePosixPath()
        relative = target_dir / f"part-{counter:05d}-{run_id}.snappy.parquet"
        target = table_path
        for part in relative.parts:
            target = target / part
        store.move(source.location, target)
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
        adopted = store.info(target)
        if adopted is None:
            raise FileNotFoundError(f"{target}: the file just written is gone")
        actions.append(
            AddAction(
                path=relative.as_posix(),
                size=adopted.size,
                partition_values=values,
                modification_time=(adopted.mtime_ns or 0) // 1_000_000,
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
