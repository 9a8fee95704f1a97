"""Truncates of the event formats (wal2json action T, Debezium op t): every row whose change is
ordered before the latest truncate is gone.

A truncate is staged as a change with flag T, no key and its sequence. overwrite-final keeps
the latest applied truncate as a row of tombstones with null keys (written, like every delete,
before final's commit), so a change that arrives later but is ordered before it is dropped on
every later run too. A run whose truncates move that cut rewrites the whole final table: the
rows whose change is before the cut go, the interval's later changes are applied, in one
commit. History ends the versions a truncate removes at it (`history.cut_versions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from cdc_pipeline.config import EVENT_FORMATS, TableConfig
from spark_jobs import delta
from spark_jobs.rules.transforms import FLAG, TRUNCATE, quoted
from spark_jobs.runtime.context import StepContext


@dataclass(frozen=True)
class Cut:
    """The latest truncate's sequence values, and whether this run's truncates moved it."""

    values: tuple[Any, ...]
    moved: bool
    rows: DataFrame | None  # the run's truncate changes (keys null), for tombstones; or None
    applied: int = 0  # how many truncates the run applies (0 when the cut did not move)


def at_or_after(sequence_by: Sequence[str], values: Sequence[Any]) -> Column:
    """True for a row whose sequence is not before `values` (lexicographic over sequence_by)."""
    result = F.lit(True)
    for column, value in reversed(list(zip(sequence_by, values, strict=True))):
        col = F.col(quoted(column))
        result = (col > F.lit(value)) | ((col == F.lit(value)) & result)
    return result


def remembered_truncates(context: StepContext) -> DataFrame | None:
    """The truncates tombstones remember (rows with null keys), or None (not an event format,
    no tombstones)."""
    if context.table.change_format not in EVENT_FORMATS:
        return None
    tombstones = delta.load_snapshot(context.paths.tombstones)
    if not tombstones.exists or not tombstones.files:
        return None
    rows = delta.read_snapshot(context.spark, tombstones)
    return rows.filter(F.col(quoted(context.table.keys[0])).isNull())


def _latest(frame: DataFrame, sequence_by: Sequence[str]) -> tuple[tuple[Any, ...] | None, int]:
    """(the latest truncate's sequence values or None, how many truncates) of `frame`."""
    latest = F.max(F.struct(*[F.col(quoted(c)) for c in sequence_by])).alias("m")
    row = frame.agg(latest, F.count(F.lit(1)).alias("n")).collect()[0]  # metadata: 2 values
    return (tuple(row["m"]) if row["m"] is not None else None), int(row["n"])


def truncate_cut(context: StepContext, changes: DataFrame) -> Cut | None:
    """The cut the interval's changes are applied under (None: no truncate ever applied)."""
    table: TableConfig = context.table
    if not table.apply_truncates or table.change_format not in EVENT_FORMATS:
        return None
    sequence_by = table.sequence_by
    new = changes.filter(F.col(FLAG) == TRUNCATE)
    latest_new, count = _latest(new, sequence_by)
    remembered = remembered_truncates(context)
    latest_old = _latest(remembered, sequence_by)[0] if remembered is not None else None
    if latest_new is None and latest_old is None:
        return None
    # A pending truncate equal to the remembered one is cut again: tombstones are committed
    # before final, so a run killed between the two remembers a cut final never got (cutting
    # twice removes nothing more).
    if latest_new is not None and (latest_old is None or latest_new >= latest_old):
        return Cut(latest_new, True, new, count)
    assert latest_old is not None
    return Cut(latest_old, False, None)
