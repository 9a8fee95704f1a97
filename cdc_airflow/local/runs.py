"""DAG runs and task instances of a local Airflow, read from its metadata DB, and a progress printer.

`make demo` and `cdc bench-cycle` both wait for many runs at once: one read-only SQLite query
every few seconds tells how far they are, where an `airflow dags list-runs` per DAG would start
a Python process per table and poll.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

FINISHED = ("success", "failed")


def parse_db_time(value: str | None) -> datetime | None:
    """A timestamp as the metadata DB stores it (UTC, with or without an offset), aware UTC."""
    if not value:
        return None
    parsed = datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


@dataclass(frozen=True)
class RunRow:
    """One DAG run: its DAG, id, kind (scheduled, manual, backfill), state and data interval."""

    dag_id: str
    run_id: str
    run_type: str
    state: str | None
    interval_start: datetime | None
    start: datetime | None
    end: datetime | None


@dataclass(frozen=True)
class TaskRow:
    """One task instance with its times (aware UTC; None until it happened)."""

    dag_id: str
    run_id: str
    task_id: str
    state: str | None
    try_number: int
    queued: datetime | None
    start: datetime | None
    end: datetime | None

    @property
    def seconds(self) -> float | None:
        """Wall time of the task (None until it ended)."""
        if self.start is None or self.end is None:
            return None
        return (self.end - self.start).total_seconds()


class MetadataDB:
    """Read-only queries on an Airflow home's SQLite metadata DB (`{home}/airflow.db`)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _query(self, sql: str, parameters: Collection[Any] = ()) -> list[tuple[Any, ...]]:
        # Read-only, and a short transaction: the scheduler is the DB's one writer, and a
        # reader holding its shared lock only for a query never makes it wait for long.
        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=60)
        try:
            return list(connection.execute(sql, tuple(parameters)).fetchall())
        finally:
            connection.close()

    def runs(self, dag_ids: Collection[str]) -> list[RunRow]:
        """Every run of these DAGs."""
        rows = self._query(
            "SELECT dag_id, run_id, run_type, state, data_interval_start, start_date, end_date "
            f"FROM dag_run WHERE dag_id IN ({','.join('?' * len(dag_ids))})",
            list(dag_ids),
        )
        return [
            RunRow(d, r, t, s, parse_db_time(i), parse_db_time(a), parse_db_time(b))
            for d, r, t, s, i, a, b in rows
        ]

    def task_instances(self, dag_ids: Collection[str]) -> list[TaskRow]:
        """Every task instance of these DAGs' runs (latest try)."""
        rows = self._query(
            "SELECT dag_id, run_id, task_id, state, try_number, queued_dttm, start_date, end_date "
            f"FROM task_instance WHERE dag_id IN ({','.join('?' * len(dag_ids))})",
            list(dag_ids),
        )
        return [
            TaskRow(d, r, t, s, int(n or 0), parse_db_time(q), parse_db_time(a), parse_db_time(b))
            for d, r, t, s, n, q, a, b in rows
        ]

    def next_dagruns(self, dag_ids: Collection[str]) -> dict[str, datetime | None]:
        """Each serialized DAG's next scheduled logical date (start of its next interval)."""
        rows = self._query(
            f"SELECT dag_id, next_dagrun FROM dag WHERE dag_id IN ({','.join('?' * len(dag_ids))})",
            list(dag_ids),
        )
        return {dag_id: parse_db_time(value) for dag_id, value in rows}

    def import_errors(self) -> list[str]:
        """One line per DAG file that failed to import: its name and the error's last line."""
        rows = self._query("SELECT filename, stacktrace FROM import_error")
        return [f"{name}: {(trace or '').strip().splitlines()[-1:]}" for name, trace in rows]

    def paused(self, dag_ids: Collection[str]) -> dict[str, bool]:
        """Whether each DAG is paused."""
        rows = self._query(
            f"SELECT dag_id, is_paused FROM dag WHERE dag_id IN ({','.join('?' * len(dag_ids))})",
            list(dag_ids),
        )
        return {dag_id: bool(value) for dag_id, value in rows}


def count_states(runs: Collection[RunRow], dag_ids: Collection[str]) -> dict[str, Counter[str]]:
    """Run states per DAG (every DAG present, also one without runs yet)."""
    counts: dict[str, Counter[str]] = {dag_id: Counter() for dag_id in dag_ids}
    for run in runs:
        if run.dag_id in counts:
            counts[run.dag_id][run.state or "none"] += 1
    return counts


def progress_line(
    label: str, counts: Mapping[str, Counter[str]], expected: int, elapsed: float
) -> str:
    """`label: 12/65 runs done, 2 running, 51 queued, 0 failed, 130 s` over every DAG."""
    total: Counter[str] = Counter()
    for counter in counts.values():
        total.update(counter)
    waiting = total["queued"] + total["none"] + total["scheduled"]
    return (
        f"{label}: {total['success']}/{expected} runs done, {total['running']} running, "
        f"{waiting} queued, {total['failed']} failed, {elapsed:.0f} s"
    )


def table_progress_lines(counts: Mapping[str, Counter[str]], per_dag: int) -> list[str]:
    """One line per DAG: `  cdc_orders: 1/3 done, 1 running, 1 queued, 0 failed`."""
    return [
        f"  {dag_id}: {c['success']}/{per_dag} done, {c['running']} running, "
        f"{c['queued'] + c['none'] + c['scheduled']} queued, {c['failed']} failed"
        for dag_id, c in sorted(counts.items())
    ]


def wait_for_dag_runs(
    db: MetadataDB,
    dag_ids: Collection[str],
    per_dag: int,
    *,
    select: Callable[[RunRow], bool],
    label: str,
    timeout: float,
    every: float = 10,
    per_table: bool = False,
    out: TextIO | None = None,
    on_poll: Callable[[list[RunRow]], None] | None = None,
) -> list[RunRow]:
    """Wait until every DAG has `per_dag` finished runs that `select` picks; print progress.

    Prints a progress line (and with `per_table` one line per DAG) every `every` seconds.
    `on_poll` sees the selected runs at each poll (the bench pauses finished DAGs with it).
    Raises RuntimeError naming the unfinished DAGs after `timeout` seconds.
    """
    import sys

    stream = out or sys.stdout
    started = time.monotonic()
    last_print = -every
    while True:
        try:
            runs = [r for r in db.runs(dag_ids) if select(r)]
        except sqlite3.OperationalError:  # the DB is not there yet or briefly locked: ask again
            runs = []
        counts = count_states(runs, dag_ids)
        done = all(sum(c[s] for s in FINISHED) >= per_dag for c in counts.values())
        elapsed = time.monotonic() - started
        if on_poll is not None:
            on_poll(runs)
        if done or elapsed - last_print >= every:
            print(progress_line(label, counts, per_dag * len(counts), elapsed), file=stream)
            if per_table:
                print("\n".join(table_progress_lines(counts, per_dag)), file=stream)
            stream.flush()
            last_print = elapsed
        if done:
            return runs
        if elapsed > timeout:
            unfinished = sorted(
                d for d, c in counts.items() if sum(c[s] for s in FINISHED) < per_dag
            )
            raise RuntimeError(
                f"{label}: {len(unfinished)} DAG(s) did not finish {per_dag} run(s) within "
                f"{timeout:.0f} s: {', '.join(unfinished[:10])}"
            )
        time.sleep(min(2.0, every))
