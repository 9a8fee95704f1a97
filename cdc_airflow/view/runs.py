"""What the view reads of Airflow's metadata DB: each table's recent runs with their counts and
attempts (the task going on or failed, its try of how many), its backfills in progress, and which
DAGs are paused.

A bounded number of queries whatever the number of tables (one per kind of row, for every DAG
at once). Every function here blocks on the DB: call it from a thread, never from an event loop.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from cdc_pipeline.counts import OverwriteCounts, StageCounts
from cdc_pipeline.steps import ERROR_XCOM, count_task_ids

RECENT_RUNS = 20  # runs per table in the sparklines and the quarantine growth
COUNT_TASKS = count_task_ids()  # their XCom return_value holds the step's counts
FINISHED = ("success", "failed")
# Task instance states of a try going on or waiting for its turn (of a run not finished), in the
# order the view lists them, then `failed`: the attempts the view shows.
ACTIVE_TASK_STATES = (
    "running",
    "deferred",
    "restarting",
    "up_for_retry",
    "up_for_reschedule",
    "queued",
    "scheduled",
)
ATTEMPT_STATES = (*ACTIVE_TASK_STATES, "failed")


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """A task of a run that is going on, waits for its turn or failed, with its try: Airflow's
    try_number (counted when the try is scheduled) of `tries` (max_tries + 1)."""

    task_id: str
    state: str  # a task instance state: running, up_for_retry, queued, failed, ...
    try_number: int
    tries: int
    started: datetime | None = None  # this try's start (None while it waits)
    ended: datetime | None = None
    reason: str | None = None  # a failed try's one-line error (the step's cdc_error XCom)

    def document(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601 text."""
        return {
            "task_id": self.task_id,
            "state": self.state,
            "try_number": self.try_number,
            "tries": self.tries,
            "started": iso(self.started),
            "ended": iso(self.ended),
            "reason": self.reason,
        }


@dataclass(frozen=True, kw_only=True)
class BackfillProgress:
    """A backfill not completed yet (Airflow's `backfill` table): its runs by state."""

    backfill_id: int
    from_date: datetime
    to_date: datetime
    paused: bool = False
    states: Mapping[str, int] = field(default_factory=dict)  # run state -> runs it made
    skipped: int = 0  # dates it made no run for (a run existed, or one was going on)

    @property
    def runs(self) -> int:
        """The runs it made (not the dates it skipped)."""
        return sum(self.states.values())

    @property
    def done(self) -> int:
        """Its runs finished, successful or failed."""
        return sum(self.states.get(state, 0) for state in FINISHED)

    @property
    def summary(self) -> str:
        """`3 of 8 runs done`."""
        return f"{self.done} of {self.runs} runs done"

    def document(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601 text."""
        return {
            "backfill_id": self.backfill_id,
            "from_date": iso(self.from_date),
            "to_date": iso(self.to_date),
            "paused": self.paused,
            "runs": self.runs,
            "done": self.done,
            "states": dict(self.states),
            "skipped": self.skipped,
            "summary": self.summary,
        }


@dataclass(frozen=True)
class RunPoint:
    """One DAG run of a table (queued, running or finished), with the counts its steps reported
    (None if unknown) and, when it failed, its failed tasks and their one-line reasons."""

    run_id: str
    state: str
    interval_start: datetime | None
    interval_end: datetime | None
    seconds: float | None
    files: int | None = None  # landing files of the interval
    rows_read: int | None = None
    staged: int | None = None
    quarantined: int | None = None
    changes: int | None = None
    rows_written: int | None = None
    partitions_rewritten: int | None = None
    started: datetime | None = None  # when it started (or was queued): the order of the runs
    failures: tuple[tuple[str, str | None], ...] = ()  # (task id, its reason if it gave one)
    run_type: str | None = None  # scheduled, backfill, manual, asset_triggered, ...
    backfill_id: int | None = None  # the backfill that made (or last cleared) it
    attempts: tuple[Attempt, ...] = ()  # of a run not successful: its tasks going on or failed

    @property
    def finished(self) -> bool:
        """Success or failed (a queued or running run has no counts or duration yet)."""
        return self.state in FINISHED


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def run_document(run: RunPoint | None) -> dict[str, Any] | None:
    if run is None:
        return None
    data = dict(run.__dict__)
    data["interval_start"], data["interval_end"] = iso(run.interval_start), iso(run.interval_end)
    data["started"] = iso(run.started)
    data["failures"] = [{"task_id": task, "reason": reason} for task, reason in run.failures]
    data["attempts"] = [attempt.document() for attempt in run.attempts]
    return data


def _counts(value: Any) -> dict[str, Any]:
    """The `counts` of a step's XCom return value (stored as JSON, sometimes as JSON text)."""
    for _ in range(2):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return {}
    counts = value.get("counts") if isinstance(value, dict) else None
    return counts if isinstance(counts, dict) else {}


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def run_point(
    run_id: str,
    state: str,
    *,
    interval: tuple[datetime | None, datetime | None],
    times: tuple[datetime | None, datetime | None],
    xcoms: Mapping[str, Any],
    failures: Sequence[tuple[str, str | None]] = (),
    started: datetime | None = None,
    run_type: str | None = None,
    backfill_id: int | None = None,
    attempts: Sequence[Attempt] = (),
) -> RunPoint:
    """A run and its steps' XCom values (task_id -> return_value) as one point of the history;
    `times` its start and end (its duration), `failures` its failed tasks and reasons, `started`
    when it started or was queued (default: its start), `attempts` its tasks going on or failed."""
    stage_counts = _counts(xcoms.get("stage"))
    stage = StageCounts.of_payload(stage_counts)
    final = OverwriteCounts.of_payload(_counts(xcoms.get("overwrite_final")))
    if str(stage_counts.get("noop")).lower() == "true":
        # An interval without landing files: the step did nothing, so nothing was read or staged.
        stage = StageCounts(rows_read=0, staged=0, quarantined=0).with_reported(stage)
    begun, ended = (_utc(t) for t in times)
    return RunPoint(
        run_id=run_id,
        state=state,
        interval_start=_utc(interval[0]),
        interval_end=_utc(interval[1]),
        seconds=(ended - begun).total_seconds() if begun and ended else None,
        files=_int(stage.files),
        rows_read=_int(stage.rows_read),
        staged=_int(stage.staged),
        quarantined=_int(stage.quarantined),
        changes=_int(final.changes),
        rows_written=_int(final.rows_written),
        partitions_rewritten=_int(final.partitions_rewritten),
        started=_utc(started) or begun,
        failures=tuple(failures),
        run_type=run_type,
        backfill_id=backfill_id,
        attempts=tuple(attempts),
    )


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def recent_runs(dag_ids: Collection[str], limit: int = RECENT_RUNS) -> dict[str, list[RunPoint]]:
    """dag_id -> its last `limit` runs in any state (by start, or queue time, oldest first) with
    counts, attempts (tasks going on or failed, with their tries), failed tasks and their reasons.

    Four queries on the Airflow metadata DB whatever the number of tables: the runs (ranked per
    DAG by a window function), the XCom values of their steps (counts, failure reasons), the task
    instances going on or failed of the runs not successful, and when each run's tasks ran.
    """
    if not dag_ids:
        return {}
    from airflow.utils.session import create_session

    with create_session() as session:
        runs = _ranked_runs(session, dag_ids, limit)
        values, errors = _step_values(session, [r.id for r in runs])
        unfinished = [r.run_id for r in runs if r.state != "success"]
        tried = _task_attempts(session, dag_ids, unfinished)
        worked = _task_times(session, dag_ids, [r.run_id for r in runs])
    result: dict[str, list[RunPoint]] = {d: [] for d in dag_ids}
    for r in sorted(
        runs, key=lambda r: (r.dag_id, _utc(r.ordered) or datetime.min.replace(tzinfo=UTC))
    ):
        # When its tasks ran: `airflow dags test` records the logical date as a run's start.
        times = worked.get((r.dag_id, r.run_id), (None, None))
        attempts = [
            replace(a, reason=errors.get((r.id, a.task_id)))
            for a in tried.get((r.dag_id, r.run_id), [])
        ]
        result[r.dag_id].append(
            run_point(
                r.run_id,
                str(r.state),
                interval=(r.data_interval_start, r.data_interval_end),
                times=times,
                xcoms=values.get(r.id, {}),
                failures=[(a.task_id, a.reason) for a in attempts if a.state == "failed"],
                started=times[0] or r.started,
                run_type=None if r.run_type is None else str(r.run_type),
                backfill_id=r.backfill_id,
                attempts=attempts,
            )
        )
    return result


def _ranked_runs(session: Any, dag_ids: Collection[str], limit: int) -> list[Any]:
    """The last `limit` runs of each DAG, by start (or queue time, or interval end)."""
    from airflow.models.dagrun import DagRun
    from sqlalchemy import func, select

    # A queued run has no start yet; a run `airflow dags test` made has neither.
    started = func.coalesce(DagRun.start_date, DagRun.queued_at)
    order = func.coalesce(started, DagRun.data_interval_end)
    rank = func.row_number().over(partition_by=DagRun.dag_id, order_by=order.desc())
    ranked = (
        select(
            DagRun.id,
            DagRun.dag_id,
            DagRun.run_id,
            DagRun.state,
            DagRun.run_type,
            DagRun.backfill_id,
            DagRun.data_interval_start,
            DagRun.data_interval_end,
            started.label("started"),
            order.label("ordered"),
            DagRun.start_date,
            DagRun.end_date,
            rank.label("rank"),
        )
        .where(DagRun.dag_id.in_(sorted(dag_ids)))
        .subquery()
    )
    return list(session.execute(select(ranked).where(ranked.c.rank <= limit)).all())


def _step_values(
    session: Any, run_keys: Sequence[int]
) -> tuple[dict[int, dict[str, Any]], dict[tuple[int, str], str]]:
    """The steps' counts (run key -> task id -> return value) and failure reasons."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    values: dict[int, dict[str, Any]] = {}
    errors: dict[tuple[int, str], str] = {}
    if not run_keys:
        return values, errors
    rows = session.execute(
        select(XComModel.dag_run_id, XComModel.task_id, XComModel.key, XComModel.value).where(
            XComModel.dag_run_id.in_(list(run_keys)),
            XComModel.key.in_(("return_value", ERROR_XCOM)),
            XComModel.map_index == -1,
        )
    ).all()
    for run_key, task_id, key, value in rows:
        if key == ERROR_XCOM:
            errors[(run_key, task_id)] = _text_value(value)
        elif task_id in COUNT_TASKS:
            values.setdefault(run_key, {})[task_id] = value
    return values, errors


def _task_times(
    session: Any, dag_ids: Collection[str], run_ids: Sequence[str]
) -> dict[tuple[str, str], tuple[datetime | None, datetime | None]]:
    """(dag id, run id) -> when its first task started and its last task ended."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import func, select

    if not run_ids:
        return {}
    rows = session.execute(
        select(
            TaskInstance.dag_id,
            TaskInstance.run_id,
            func.min(TaskInstance.start_date),
            func.max(TaskInstance.end_date),
        )
        .where(TaskInstance.dag_id.in_(sorted(dag_ids)), TaskInstance.run_id.in_(list(run_ids)))
        .group_by(TaskInstance.dag_id, TaskInstance.run_id)
    ).all()
    return {(dag_id, run_id): (start, end) for dag_id, run_id, start, end in rows}


def _task_attempts(
    session: Any, dag_ids: Collection[str], run_ids: Sequence[str]
) -> dict[tuple[str, str], list[Attempt]]:
    """(dag id, run id) -> its tasks going on, waiting for their turn or failed (not the
    upstream_failed after them), with their tries: going on first, then by task id."""
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    attempts: dict[tuple[str, str], list[Attempt]] = {}
    if not run_ids:
        return attempts
    rows = session.execute(
        select(
            TaskInstance.dag_id,
            TaskInstance.run_id,
            TaskInstance.task_id,
            TaskInstance.state,
            TaskInstance.try_number,
            TaskInstance.max_tries,
            TaskInstance.start_date,
            TaskInstance.end_date,
        ).where(
            TaskInstance.dag_id.in_(sorted(dag_ids)),
            TaskInstance.run_id.in_(list(run_ids)),
            TaskInstance.state.in_(ATTEMPT_STATES),
            TaskInstance.map_index == -1,
        )
    ).all()
    for dag_id, run_id, task_id, state, try_number, max_tries, start, end in rows:
        tried = int(try_number or 0)
        attempt = Attempt(
            task_id=task_id,
            state=str(state),
            try_number=tried,
            # max_tries is -1 until the scheduler sets it from the task's retries
            tries=max(int(max_tries if max_tries is not None else -1) + 1, tried, 1),
            # A try waiting for its turn has the previous try's times, or none.
            started=_utc(start) if state not in ("queued", "scheduled") else None,
            ended=_utc(end),
        )
        attempts.setdefault((dag_id, run_id), []).append(attempt)
    for found in attempts.values():
        found.sort(key=lambda a: (ATTEMPT_STATES.index(a.state), a.task_id))
    return attempts


def active_backfills(dag_ids: Collection[str]) -> dict[str, list[BackfillProgress]]:
    """dag_id -> its backfills not completed, oldest first, with their runs counted by state (one
    query: the backfills joined to the runs they made)."""
    if not dag_ids:
        return {}
    from airflow.models.backfill import Backfill, BackfillDagRun
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    keys = (Backfill.id, Backfill.dag_id, Backfill.from_date, Backfill.to_date, Backfill.is_paused)
    query = (
        select(*keys, DagRun.state, func.count(BackfillDagRun.id))
        .select_from(Backfill)
        .outerjoin(BackfillDagRun, BackfillDagRun.backfill_id == Backfill.id)
        .outerjoin(DagRun, DagRun.id == BackfillDagRun.dag_run_id)
        .where(Backfill.dag_id.in_(sorted(dag_ids)), Backfill.completed_at.is_(None))
        .group_by(*keys, DagRun.state)
    )
    with create_session() as session:
        rows = session.execute(query).all()
    found: dict[int, BackfillProgress] = {}
    owner: dict[int, str] = {}
    for ident, dag_id, first, last, paused, state, count in rows:
        known = found.get(ident) or BackfillProgress(
            backfill_id=ident,
            from_date=_utc(first) or first,
            to_date=_utc(last) or last,
            paused=bool(paused),
        )
        if state is None:  # a date it made no run for (its run existed or was going on)
            known = replace(known, skipped=known.skipped + int(count))
        else:
            known = replace(known, states={**known.states, str(state): int(count)})
        found[ident], owner[ident] = known, dag_id
    result: dict[str, list[BackfillProgress]] = {d: [] for d in dag_ids}
    for ident in sorted(found):
        result[owner[ident]].append(found[ident])
    return result


def _text_value(value: Any) -> str:
    """An XCom value stored as JSON text, or as the text itself."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return decoded if isinstance(decoded, str) else str(decoded)
    return str(value)


def paused_dags(dag_ids: Collection[str]) -> set[str]:
    """The DAG ids among `dag_ids` that are paused (one query)."""
    if not dag_ids:
        return set()
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(DagModel.dag_id).where(
                DagModel.dag_id.in_(sorted(dag_ids)), DagModel.is_paused.is_(True)
            )
        ).all()
    return {row.dag_id for row in rows}
