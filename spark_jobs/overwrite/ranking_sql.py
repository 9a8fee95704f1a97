"""Overwrite-final's projections as SQL expression text (`selectExpr`, `where`).

A classic session sends every `F.col`, `F.lit`, alias and list of columns to the JVM as
requests of their own (three for each `F.col`): built from Column objects, a run's rewrite
made about 1,400 of them. An expression text is one string; Spark Connect sends either form in
the plan, with no request.
"""

from __future__ import annotations

from collections.abc import Sequence

from spark_jobs.rules.transforms import FLAG, quoted, ranking_columns


def names(columns: Sequence[str]) -> list[str]:
    """The columns as quoted identifiers, each one expression."""
    return [quoted(c) for c in columns]


def flags(marks: tuple[str, str], *, remembered: bool, from_change: bool) -> list[str]:
    """The two marks of a ranked row (`marks`: their column names) as constants."""
    return [f"{remembered} AS {quoted(marks[0])}", f"{from_change} AS {quoted(marks[1])}"]


def as_changes(
    columns: Sequence[str], flag: str, present: Sequence[str], marks: Sequence[str] = ()
) -> list[str]:
    """Rows of final (flag U) or tombstones (D) shaped like staged changes: staging's `columns`
    (null where the frame has none, `present`: its columns), then the `marks` expressions."""
    have = set(present)
    return [
        f"'{flag}' AS {quoted(c)}"
        if c == FLAG
        else quoted(c)
        if c in have
        else f"NULL AS {quoted(c)}"
        for c in columns
    ] + list(marks)


def ranking(
    columns: Sequence[str],
    keys: Sequence[str],
    sequence_by: Sequence[str],
    marks: tuple[str, str, str],
    rank: str,
    tiebreak: Sequence[tuple[str, bool]] = (),
) -> list[str]:
    """How many rows of final a ranked row's key has (named `marks[2]`; `marks[0]`: remembered,
    `marks[1]`: from the changes), and its rank among its key's rows (named `rank`, 1: the
    latest), in `ranking_columns` order, then `tiebreak` ((column, descending) pairs). One
    window partitioning: one shuffle."""
    remembered, from_change, current_rows = (quoted(m) for m in marks)
    order = [f"{quoted(c)} DESC" for c in ranking_columns(columns, sequence_by)]
    order += [f"{quoted(c)} {'DESC' if descending else 'ASC'}" for c, descending in tiebreak]
    by_key = f"PARTITION BY {', '.join(names(keys))}"
    is_current = f"NOT {remembered} AND NOT {from_change}"
    return [
        f"SUM(CASE WHEN {is_current} THEN 1 ELSE 0 END) OVER ({by_key}) AS {current_rows}",
        f"ROW_NUMBER() OVER ({by_key} ORDER BY {', '.join(order)}) AS {quoted(rank)}",
    ]


def is_delete() -> str:
    """A change that deletes its key."""
    return f"{quoted(FLAG)} = 'D'"


def routed(output_columns: Sequence[str], keep: Sequence[str], route: str) -> list[str]:
    """A winning row for final (an upsert) or for tombstones (a delete: only its `keep` columns,
    the others null), told apart by the `route` column."""
    kept = set(keep)
    values = [
        quoted(c)
        if c in kept
        else f"CASE WHEN NOT ({is_delete()}) THEN {quoted(c)} END AS {quoted(c)}"
        for c in output_columns
    ]
    return [
        *values,
        f"CASE WHEN {is_delete()} THEN 'tombstones' ELSE 'final' END AS {quoted(route)}",
    ]
