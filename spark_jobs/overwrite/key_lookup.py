"""Overwrite-final's key lookup: the interval's changed keys, and the files of final that hold
them now.

The changed keys are collected once per run, on the driver as Arrow for small change sets or as
cached Spark frames above `overwrite_final.LOCAL_KEYS_MAX`, with the partitions the changes
name. A key is looked for only in the final files whose key statistics (min and max of each key
column) can hold it, so new keys above every file's range read no file, and of those files only
the key columns are read; when they are few rows (UNREAD_ROWS_MAX), not even those: they are
all replaced. A few keys of one column are matched by their values, a larger set by a join
with them (`with_keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from cdc_pipeline.columns import quoted
from spark_jobs import delta
from spark_jobs.overwrite.final_table import fits_one_task
from spark_jobs.rules.transforms import FLAG, persisted, unpersist_quietly
from spark_jobs.runtime.context import StepContext

# Up to this many distinct changed keys of one integer or string column, the rows of a changed
# key are picked by the keys' values (a set the scan's task holds) rather than by a join with
# them: a broadcast join first runs a Spark job of its own that reads the keys again. Each
# value is a literal of the plan, analysed with it: an anti join of a 200,000-row table took
# 0.39 s by 300 values against 0.58 s joined, the same by 3,000, 0.86 s against 0.47 s by
# 10,000 (a Connect server, 2026-12-05).
KEY_SET_MAX = 1_000
# Up to this many rows in all (by the files' own counts), the files whose key ranges can hold a
# changed key are all replaced, without the Spark query that reads their keys to find which
# do: at this size the query costs about what rewriting such a file costs, and a file in a
# changed key's range seldom lacks every changed key. A file replaced without one is copied
# as it is (the same rows, a new file).
UNREAD_ROWS_MAX = 100_000


@dataclass(frozen=True, kw_only=True)
class ChangedKeys:
    """The interval's changed keys and what the changes say about where they live."""

    # Every changed key: up to LOCAL_KEYS_MAX changes the changes' key columns, a key as often
    # as it changed (every use is a semi or anti join); above it a cached distinct of them.
    frame: DataFrame
    local: pa.Table | None  # the same keys on the driver (at most LOCAL_KEYS_MAX changes)
    # The partitions the changes name: the upserts' (with partition_stable also the deletes'
    # row images'); None: unpartitioned.
    partitions: set[Any] | None
    lookup: DataFrame  # the keys whose current partition is looked up in final
    lookup_local: pa.Table | None  # the same on the driver, with `local`
    broadcast: bool  # few enough to send to every task
    key_schema: StructType | None = None  # the key columns' types, when known without asking Spark

    @cached_property
    def match(self) -> Column | None:
        """`key_set` of the changed keys, made once for every use in a run; None on the Spark
        path or where they are joined."""
        return None if self.local is None else key_set(self.local, self.local.column_names)

    def release(self) -> None:
        """Drop the cached frames (the Spark path)."""
        if self.local is None:
            self.frame.unpersist()
            if self.lookup is not self.frame:
                self.lookup.unpersist()


def files_holding_keys(
    context: StepContext, final: delta.Snapshot, changed: ChangedKeys, *, everywhere: bool = False
) -> list[delta.DataFile]:
    """The files of final that hold at least one of the changed keys: the files a rewrite must
    replace (every other file keeps its rows as they are).

    Only the files whose key statistics can hold a changed key are read, and of them only the
    key columns. The partitions the changes name are looked in first: final holds each key
    once, so a key found there is nowhere else, and only the other keys (new keys, keys that
    moved, key-only deletes) are looked for in the other partitions; new keys above every
    file's range read no file. With `partition_stable`, a key without a delete lives in the
    partition its change names: outside those partitions only deleted keys are looked for.
    Where no key is looked for further, the candidate files of an unpartitioned table or of the
    partitions the changes name, at most UNREAD_ROWS_MAX rows in all, are replaced without
    reading their keys (a file among them holding no changed key is copied as it is); files of
    other partitions are always read, so a run rewrites no partition its changes do not touch.
    `everywhere` (a recompute after a lost commit race) looks for every key in every file, so a
    key that some other writer left in two partitions is found in both and healed.
    """
    column, broadcast = context.table.partition_column, changed.broadcast
    files = list(final.files)
    if not files:
        return []
    if column is None or everywhere:
        every_file = (context, final, files, changed.frame, changed.local)
        return _holding(*every_file, broadcast=broadcast, unread=not everywhere)[0]
    known = changed.partitions or set()
    inside = [f for f in files if f.partition_values.get(column) in known]
    outside = [f for f in files if f.partition_values.get(column) not in known]
    if changed.lookup_local is not None:
        # Outside, only the files whose ranges can hold a looked-up key (before any is found).
        outside = files_in_key_ranges(outside, changed.lookup_local)
    held, found = _holding(
        context,
        final,
        inside,
        changed.frame,
        changed.local,
        broadcast=broadcast,
        want_found=bool(outside),
        unread=not outside,
    )
    if not outside:
        return held
    rest, rest_local = changed.lookup, changed.lookup_local
    if isinstance(found, pa.Table) and rest_local is not None:
        rest_local = rest_local.join(
            found.cast(rest_local.schema), rest_local.column_names, join_type="left anti"
        )
        if not rest_local.num_rows:
            return held
        rest = delta.local_frame(context.spark, rest_local, changed.key_schema or rest.schema)
    elif isinstance(found, DataFrame):
        rest = rest.join(found, on=list(context.table.keys), how="left_anti")
    return held + _holding(context, final, outside, rest, rest_local, broadcast=broadcast)[0]


def _holding(
    context: StepContext,
    final: delta.Snapshot,
    files: list[delta.DataFile],
    keys_df: DataFrame,
    local_keys: pa.Table | None,
    *,
    broadcast: bool,
    want_found: bool = False,
    unread: bool = False,
) -> tuple[list[delta.DataFile], pa.Table | DataFrame | None]:
    """The `files` holding any of the keys (`local_keys`: the same keys on the driver, whose
    ranges are then checked there), and with `want_found` the keys found in them (Arrow on the
    driver path, else a frame). `unread`: candidates of at most UNREAD_ROWS_MAX rows are
    taken as they are, their keys not read (only where replacing a file that holds no changed
    key rewrites no partition the changes do not touch)."""
    keys = list(context.table.keys)
    if local_keys is not None:
        candidates = files_in_key_ranges(files, local_keys)
    elif files:
        candidates = files_that_may_hold(context, final, files, keys_df)
    else:
        candidates = []
    if not candidates:
        return [], None
    may_skip = unread and local_keys is not None and not want_found
    if may_skip and fits_one_task(0, candidates, limit=UNREAD_ROWS_MAX):
        return candidates, None
    located = with_keys(
        delta.read_snapshot(
            context.spark, final, columns=keys, with_file_name=True, files=candidates
        ),
        keys_df,
        key_set(local_keys, keys),
        keys,
        broadcast=broadcast,
        how="left_semi",
    )
    found: pa.Table | DataFrame | None = None
    if want_found and local_keys is not None:
        schema = final.schema or located.schema  # the log's (final has files: it has one)
        fields = [*[schema[k] for k in keys], StructField(delta.FILE_NAME_COLUMN, StringType())]
        typed = delta.with_known_schema(located, fields)
        rows = typed.toArrow()  # metadata: at most LOCAL_KEYS_MAX keys, with their file names
        names = set(pc.unique(rows[delta.FILE_NAME_COLUMN]).to_pylist())
        found = rows.select(keys)
    elif local_keys is not None:
        # A row per key found (at most LOCAL_KEYS_MAX), not their distinct: a distinct is a
        # shuffle, two Spark jobs more than the scan.
        located_names = delta.with_known_schema(
            located.select(delta.FILE_NAME_COLUMN),
            [StructField(delta.FILE_NAME_COLUMN, StringType())],
        )
        names = set(pc.unique(located_names.toArrow()[0]).to_pylist())  # metadata: file names
    else:
        distinct = located.select(delta.FILE_NAME_COLUMN).distinct()
        names = {row[0] for row in distinct.collect()}  # metadata: file names, one per file
        if want_found:
            found = located.select(*keys)
    return [f for f in candidates if f.name in names], found


def files_in_key_ranges(files: list[delta.DataFile], keys: pa.Table) -> list[delta.DataFile]:
    """The files whose key ranges (from their statistics) contain at least one of the keys, an
    Arrow table on the driver. A file is kept when a statistic is missing or does not compare
    with its key column's type, and for floating-point keys (NaN order)."""
    if keys.num_rows == 0:
        return []
    names = keys.column_names
    exact = not any(pa.types.is_floating(keys[k].type) for k in names)
    kept = []
    for file in files:
        if not exact or not all(k in file.min_values and k in file.max_values for k in names):
            kept.append(file)
            continue
        try:
            inside = None
            for k in names:
                column = keys[k]
                low = pa.scalar(file.min_values[k], column.type)
                high = pa.scalar(file.max_values[k], column.type)
                part = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
                inside = part if inside is None else pc.and_(inside, part)
            if pc.any(inside).as_py():
                kept.append(file)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError):
            kept.append(file)
    return kept


def files_that_may_hold(
    context: StepContext, final: delta.Snapshot, files: list[delta.DataFile], keys_df: DataFrame
) -> list[delta.DataFile]:
    """The files whose key ranges (from their statistics) contain at least one of the keys;
    files without statistics for every key column are always included."""
    spark, keys = context.spark, list(context.table.keys)
    ranged = [f for f in files if all(k in f.min_values and k in f.max_values for k in keys)]
    unranged = [f for f in files if f not in ranged]
    if not ranged or final.schema is None:
        return files
    fields = [StructField("__file", StringType(), False)]
    for key in keys:
        kind = final.schema[key].dataType
        fields += [StructField(f"__min_{key}", kind), StructField(f"__max_{key}", kind)]
    ranges = delta.local_frame(
        spark,
        [(f.name, *[v for k in keys for v in (f.min_values[k], f.max_values[k])]) for f in ranged],
        StructType(fields),
    )
    inside = [F.col(k).between(F.col(f"__min_{k}"), F.col(f"__max_{k}")) for k in keys]
    condition = inside[0]
    for part in inside[1:]:
        condition = condition & part
    hits = {
        row[0]
        for row in keys_df.join(F.broadcast(ranges), condition)
        .select("__file")
        .distinct()
        .collect()  # metadata: file names (at most one per file of the snapshot), not rows
    }
    return unranged + [f for f in ranged if f.name in hits]


def with_broadcast_hint(frame: DataFrame, *, broadcast: bool) -> DataFrame:
    """`frame` with a broadcast hint when it is known to be small."""
    return F.broadcast(frame) if broadcast else frame


def key_set(local: pa.Table | None, keys: Sequence[str]) -> Column | None:
    """Whether a row's key is one of `local`'s (never null), as a filter on its values, when
    `local` holds at most KEY_SET_MAX distinct keys of one signed integer or string column;
    else None. A null key matches nothing, as in a join."""
    if local is None or len(keys) != 1:
        return None
    column = local.column(keys[0])
    kind = column.type
    if not (pa.types.is_signed_integer(kind) or pa.types.is_string(kind)):
        return None
    values = pc.unique(column).drop_null()
    if len(values) > KEY_SET_MAX:
        return None
    return F.coalesce(F.col(quoted(keys[0])).isin(values.to_pylist()), F.lit(False))


def with_keys(
    frame: DataFrame,
    keys_df: DataFrame,
    match: Column | None,
    keys: Sequence[str],
    *,
    broadcast: bool,
    how: str,
) -> DataFrame:
    """`frame`'s rows whose key is (`how="left_semi"`) or is not (`"left_anti"`) one of the
    changed keys `keys_df`. With `match` (their `key_set`) a filter by value, which the scan's
    own task applies; else a join with their frame, which, even broadcast, is a Spark job more
    that reads them again."""
    if match is None:
        hinted = with_broadcast_hint(keys_df, broadcast=broadcast)
        return frame.join(hinted, on=list(keys), how=how)
    return frame.where(match if how == "left_semi" else ~match)


def changed_keys_in_spark(
    context: StepContext, changes: DataFrame, *, broadcast: bool
) -> ChangedKeys:
    """The changed keys as cached Spark frames, for change sets above LOCAL_KEYS_MAX."""
    table = context.table
    keys, column = list(table.keys), table.partition_column
    frame = persisted(changes.select(*keys).distinct())
    if column is None:
        return ChangedKeys(
            frame=frame,
            local=None,
            partitions=None,
            lookup=frame,
            lookup_local=None,
            broadcast=broadcast,
        )
    try:
        placed = changes if table.partition_stable else changes.filter(F.col(FLAG) != "D")
        partitions = delta.partition_values_of(placed, column) - {None}
    except Exception:
        unpersist_quietly(frame)
        raise
    if not table.partition_stable:
        return ChangedKeys(
            frame=frame,
            local=None,
            partitions=partitions,
            lookup=frame,
            lookup_local=None,
            broadcast=broadcast,
        )
    # A stable key lives in the partition its inserts and updates name: only keys with a
    # delete are looked up (a key-only delete names none; a row image may be partial).
    lookup = persisted(changes.filter(F.col(FLAG) == "D").select(*keys).distinct())
    return ChangedKeys(
        frame=frame,
        local=None,
        partitions=partitions,
        lookup=lookup,
        lookup_local=None,
        broadcast=broadcast,
    )


def changed_keys_on_driver(
    context: StepContext, changes: DataFrame, *, broadcast: bool
) -> ChangedKeys:
    """The changed keys as Arrow, and their partitions, from one Spark job over the changes;
    for the joins, the changes' key columns.

    For at most LOCAL_KEYS_MAX changes: their key ranges are checked on the driver. Beyond
    `key_set`'s values, the joins read the keys from the staging files again rather than from
    a local relation: Spark analyses its rows at every analysis of a plan naming it. And not
    their distinct: every join of them is a semi or anti join, which a key named twice leaves
    as it is, and a distinct is a shuffle, two more jobs before each broadcast of them.
    """
    table = context.table
    keys, column = list(table.keys), table.partition_column
    names = [*keys, *([column] if column else []), FLAG]
    known = changes.schema  # `apply_changes` asked already (the frame keeps it)
    wanted = delta.with_known_schema(changes.select(*names), [known[c] for c in names])
    summary = wanted.toArrow()  # metadata: at most LOCAL_KEYS_MAX rows of keys and flags
    distinct = summary.select(keys).group_by(keys).aggregate([])
    schema = StructType([known[k] for k in keys])
    frame = changes.select(*keys)
    if column is None:
        return ChangedKeys(
            frame=frame,
            local=distinct,
            partitions=None,
            lookup=frame,
            lookup_local=distinct,
            broadcast=broadcast,
            key_schema=schema,
        )
    stable = table.partition_stable
    placed = summary if stable else summary.filter(pc.not_equal(summary[FLAG], "D"))
    values = pc.unique(placed[column]).drop_null().to_pylist()
    partitions = {delta.canonical_partition_value(v) for v in values}
    if not stable:
        return ChangedKeys(
            frame=frame,
            local=distinct,
            partitions=partitions,
            lookup=frame,
            lookup_local=distinct,
            broadcast=broadcast,
            key_schema=schema,
        )
    # A stable key lives in the partition its inserts and updates name: only keys with a
    # delete are looked up (a key-only delete names none; a row image may be partial).
    deleted = summary.filter(pc.equal(summary[FLAG], "D")).select(keys)
    lookup = deleted.group_by(keys).aggregate([])
    deleted_keys = changes.filter(F.col(FLAG) == "D").select(*keys)
    return ChangedKeys(
        frame=frame,
        local=distinct,
        partitions=partitions,
        lookup=deleted_keys,
        lookup_local=lookup,
        broadcast=broadcast,
        key_schema=schema,
    )
