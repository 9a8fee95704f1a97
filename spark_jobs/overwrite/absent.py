"""Columns a change did not carry keep the key's previous value (absent is not NULL).

PostgreSQL does not send an unchanged TOASTed value (large text, jsonb, bytea) in an update:
wal2json leaves the column out of `columns`, Debezium sends its unavailable-value placeholder.
Stage records such columns in `_cdc_absent`; overwrite-final fills them before ranking, from
the latest earlier row of the same key that carried them: an earlier change of the batch, else
the key's row in final. A delete carries nothing, so a change after it never takes a value from
before it, and the delete's own fill is the key's last state: a primary-key change (a D of the
old key and a change of the new key at the same source position: one wal2json line, or
Debezium's delete and create events of one update, which share their LSN) gives the new key
the old key's values that way, in further passes run only when such a change is left unfilled
(one per link of a chain of key changes).

"Earlier" is the order the ranking uses (sequence_by, then arrival, then the ranking's
tiebreaks), so a change applied again (a rerun) or out of order fills exactly as in order. The
cost follows the ranked rows: one more window over the same partitioning as the ranking.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from cdc_pipeline.columns import POSITION
from spark_jobs.rules.transforms import (
    ABSENT,
    ARRIVAL,
    FLAG,
    absent_list,
    fillable,
    persisted,
    quoted,
)

FILL = "__fill_"  # the struct holding a column's filled value
SYNTHETIC = "__cdc_seed"  # a later pass's row carrying the old key's values to the new key
MAX_PASSES = 20  # links of a chain of key changes resolved in one step (more stay unfilled)
LINK = "__cdc_link"  # where a change was at the source: pairs a key change's D and new row


def _link(columns: Sequence[str]) -> Column:
    """A change's source position (the LSN, or binlog file:pos:row), else its arrival (a line
    without one: wal2json without include-lsn)."""
    arrival = F.concat_ws("/", *[F.col(c).cast("string") for c in ARRIVAL])
    if POSITION not in columns:
        return arrival
    return F.when(F.col(POSITION) != "", F.col(POSITION)).otherwise(arrival)


def fill_absent(
    candidates: DataFrame, keys: Sequence[str], order: Sequence[Column], from_change: str
) -> DataFrame:
    """`candidates` with every absent value filled; `_cdc_absent` then lists the columns no
    earlier row carried (null when none): the caller counts them.

    `order` is the ranking's order, latest first; `from_change` the boolean column telling the
    interval's changes from the rows of final and tombstones.
    """
    if ABSENT not in candidates.columns:
        return candidates
    columns = fillable(candidates.columns, keys)
    if not columns:
        return candidates
    candidates = candidates.withColumn(LINK, _link(candidates.columns))
    first = _fill_pass(candidates.withColumn(SYNTHETIC, F.lit(False)), keys, order, columns)
    absent = absent_list()
    # Changes some of whose absent columns no earlier row of their key carried.
    unfilled = F.exists(absent, lambda n: _any_unfilled(n, columns))
    moved = persisted(
        first.filter(F.col(from_change) & (F.col(FLAG) != "D") & unfilled)
        .select(LINK)
        .join(
            first.filter(F.col(from_change) & (F.col(FLAG) == "D")).select(LINK),
            on=LINK,
            how="left_semi",
        )
    )
    try:
        left = moved.count()  # metadata: key changes that need the old key's values
        if not left:
            return _resolved(first, columns)
        # Each further pass seeds every such change's new key with what its old key held one
        # pass before (a seed row ordered just after the change); a chain of key changes
        # resolves one link per pass, until no pass fills more.
        current = first
        for _ in range(MAX_PASSES):
            seeds = _seeds(candidates, current, moved, columns, from_change)
            both = candidates.withColumn(SYNTHETIC, F.lit(False)).unionByName(seeds)
            current = _fill_pass(both, keys, order, columns).filter(~F.col(SYNTHETIC))
            still = (
                current.filter(F.col(from_change) & (F.col(FLAG) != "D") & unfilled)
                .join(moved, on=LINK, how="left_semi")
                .count()
            )  # metadata: how many are still unfilled
            if still == 0 or still >= left:
                break
            left = still
        return _resolved(current, columns)
    finally:
        moved.unpersist()


def _seeds(
    candidates: DataFrame,
    filled: DataFrame,
    moved: DataFrame,
    columns: Sequence[str],
    from_change: str,
) -> DataFrame:
    """One row per key change: the new key's change, with the old key's filled values."""
    old_keys = filled.filter(F.col(from_change) & (F.col(FLAG) == "D")).select(
        LINK, *[F.col(FILL + c).alias("__old_" + c) for c in columns]
    )
    pairs = moved.join(old_keys, on=LINK, how="inner")
    return (
        candidates.filter(F.col(from_change) & (F.col(FLAG) != "D"))
        .join(pairs, on=LINK, how="inner")
        .select(
            *[
                F.col("__old_" + c)["v"].alias(c)
                if c in columns
                else (
                    F.array_compact(
                        F.array(*[F.when(F.col("__old_" + n).isNull(), F.lit(n)) for n in columns])
                    ).alias(c)
                    if c == ABSENT
                    else F.col(quoted(c))
                )
                for c in candidates.columns
            ],
        )
        .withColumn(SYNTHETIC, F.lit(True))
    )


def _any_unfilled(name: Column, columns: Sequence[str]) -> Column:
    result = F.lit(False)
    for c in columns:
        result = result | ((name == F.lit(c)) & F.col(FILL + c).isNull())
    return result


def _fill_pass(
    rows: DataFrame, keys: Sequence[str], order: Sequence[Column], columns: Sequence[str]
) -> DataFrame:
    """Each row gets, per column, the value of the latest row before it (in the ranking's order)
    that carried the column, as a struct (null: none did); a delete before it gives a null value
    (the key started empty after it). A delete's own fill is the key's state before it."""
    window = (
        Window.partitionBy(*[F.col(quoted(k)) for k in keys])
        .orderBy(*order, F.col(SYNTHETIC).asc())
        .rowsBetween(1, Window.unboundedFollowing)
    )
    absent = absent_list()
    return rows.select(
        "*",
        *[
            F.first(
                F.when(
                    F.col(FLAG) == "D",
                    F.struct(F.lit(None).cast(rows.schema[c].dataType).alias("v")),
                ).when(
                    ~F.array_contains(absent, c),
                    F.struct(F.col(quoted(c)).alias("v")),
                ),
                ignorenulls=True,
            )
            .over(window)
            .alias(FILL + c)
            for c in columns
        ],
    )


def _resolved(rows: DataFrame, columns: Sequence[str]) -> DataFrame:
    """The filled values in place; `_cdc_absent` left with the columns nothing carried."""
    absent = absent_list()
    unfilled = F.array_compact(
        F.array(
            *[
                F.when(F.array_contains(absent, c) & F.col(FILL + c).isNull(), F.lit(c))
                for c in columns
            ]
        )
    )
    filled = {
        c: F.when(F.array_contains(absent, c), F.col(FILL + c)["v"]).otherwise(F.col(quoted(c)))
        for c in columns
    }
    out = rows.select(
        *[
            filled[c].alias(c)
            if c in filled
            else (
                F.when(F.size(unfilled) > 0, unfilled).cast("array<string>").alias(ABSENT)
                if c == ABSENT
                else F.col(quoted(c))
            )
            for c in rows.columns
            if not c.startswith(FILL) and c not in (SYNTHETIC, LINK)
        ]
    )
    return out
