"""What the "CDC tables" view shows per table: freshness, recent runs, Delta metadata, the last check.

Reads Delta logs (delta-rs, and final's newest commit files), the `cdc check` result file, the
Airflow metadata DB (runs and their XCom counts) and of table data only the quarantine's reason
column (of its newest files): no Spark. Every function here blocks (files, DB): call
it from a thread, never from an event loop.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from cdc_airflow.view.runs import (
    BackfillProgress,
    RunPoint,
    active_backfills,
    iso,
    paused_dags,
    recent_runs,
    run_document,
)
from cdc_pipeline.columns import CHECK_FILE, REASON
from cdc_pipeline.config import TableConfig, load_table_configs
from cdc_pipeline.health import Health, table_health
from cdc_pipeline.paths import Location, TablePaths
from cdc_pipeline.steps import QUARANTINE_BREACH_PREFIX, STEPS
from spark_jobs.runtime.storage import arrow_files, store_for
from spark_jobs.status.freshness import DataFreshness, Freshness, data_freshness, data_freshness_of
from spark_jobs.status.table_health import health_facts, unreadable_table

log = logging.getLogger(__name__)

TIME_FORMAT = "%Y-%m-%d %H:%MZ"  # the one date format of the view
RECENT_COMMITS = 5  # final's commits in the timeline
TOP_REASONS = 3
REASON_ROWS = 100_000  # the quarantine's newest rows whose reasons are counted
# The tasks that fail only to show a quarantine breach (quarantine_action warn): the run applied
# its changes, so such a failure is the quarantine warning, not a failed run.
BREACH_TASK_IDS = frozenset(step.task_id for step in STEPS if step.fails_on_quarantine_breach)


@dataclass(frozen=True)
class CheckResult:
    """The latest `cdc check` of a table ({warehouse}/{table}/_cdc_check.json)."""

    checked_at: str
    ok: bool
    breaches: list[str]

    @property
    def first_breach(self) -> str | None:
        """The breach the view shows (the file lists them all)."""
        return self.breaches[0] if self.breaches else None


@dataclass(frozen=True)
class Commit:
    """One commit of a table's log, as the timeline shows it."""

    version: int
    at: datetime
    operation: str  # the cdc step that committed it, else Delta's operation name
    files_added: int | None = None  # None: the commit's file is gone (log retention)
    files_removed: int | None = None
    rows_added: int | None = None
    seconds: float | None = None  # from the step attempt's start (its run id) to the commit

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "at": iso(self.at),
            "operation": self.operation,
            "files_added": self.files_added,
            "files_removed": self.files_removed,
            "rows_added": self.rows_added,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class TableStatus:
    """One row of the view."""

    name: str
    dag_id: str
    freshness_limit: str | None
    freshness: Freshness
    last_success_interval: str | None
    last_run: RunPoint | None  # the latest run whatever its state (running, failed, ...)
    runs: list[RunPoint] = field(default_factory=list)  # the last runs, oldest start first
    final_version: int | None = None
    final_rows: int | None = None
    staging_rows: int | None = None
    quarantined_rows: int | None = None
    last_optimize: str | None = None
    last_vacuum: str | None = None
    last_reset: str | None = None
    check: CheckResult | None = None
    problem: str | None = None  # what of the table could not be read (its row still shows)
    paused: bool = False  # its DAG is paused: no run starts
    backfills: list[BackfillProgress] = field(default_factory=list)  # not completed, oldest first
    max_quarantine_fraction: float | None = None
    top_reasons: list[tuple[str, int]] = field(default_factory=list)  # of the newest rows held
    commits: list[Commit] = field(default_factory=list)  # final's newest commits, newest first
    health: Health = field(default_factory=lambda: Health("unknown", ["not measured"]))

    @property
    def quarantine_growth(self) -> int | None:
        """Rows quarantined over the recent runs (None when no run reported a count)."""
        counts = [r.quarantined for r in self.runs if r.quarantined is not None]
        return sum(counts) if counts else None

    @property
    def quarantine_rate(self) -> float | None:
        """Rows quarantined per row read over the recent runs (None when nothing was read)."""
        pairs = [
            (r.quarantined, r.rows_read)
            for r in self.runs
            if r.quarantined is not None and r.rows_read
        ]
        read = sum(p[1] or 0 for p in pairs)
        return sum(p[0] or 0 for p in pairs) / read if read else None

    @property
    def quarantine_over_limit(self) -> bool:
        """The recent rate is past the row's max_quarantine_fraction."""
        rate, limit = self.quarantine_rate, self.max_quarantine_fraction
        return rate is not None and limit is not None and rate > limit

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: datetimes as ISO 8601 text."""
        return {
            "name": self.name,
            "dag_id": self.dag_id,
            "health": self.health.state,
            "reasons": list(self.health.reasons),
            "freshness_limit": self.freshness_limit,
            "last_success_end": iso(self.freshness.last_success_end),
            "hours_behind": self.freshness.hours_behind,
            "deadline": iso(self.freshness.deadline),
            "overdue": self.freshness.overdue,
            "data": None if self.freshness.data is None else self.freshness.data.document(),
            "last_success_interval": self.last_success_interval,
            "last_run": run_document(self.last_run),
            "runs": [run_document(r) for r in self.runs],
            "paused": self.paused,
            "backfills": [b.document() for b in self.backfills],
            "quarantine_growth": self.quarantine_growth,
            "quarantine_rate": self.quarantine_rate,
            "max_quarantine_fraction": self.max_quarantine_fraction,
            "quarantine_over_limit": self.quarantine_over_limit,
            "top_reasons": [{"reason": r, "rows": n} for r, n in self.top_reasons],
            "commits": [c.as_dict() for c in self.commits],
            "final_version": self.final_version,
            "final_rows": self.final_rows,
            "staging_rows": self.staging_rows,
            "quarantined_rows": self.quarantined_rows,
            "last_optimize": self.last_optimize,
            "last_vacuum": self.last_vacuum,
            "last_reset": self.last_reset,
            "problem": self.problem,
            "check": None
            if self.check is None
            else {
                "checked_at": self.check.checked_at,
                "ok": self.check.ok,
                "breaches": self.check.breaches,
            },
        }


def next_interval_end(cron: str, after: datetime) -> datetime:
    """The end of the data interval that follows one ending at `after` (the next cron firing)."""
    from croniter import croniter

    return croniter(cron, after.astimezone(UTC)).get_next(datetime).astimezone(UTC)


def freshness_of(table: TableConfig, last_success_end: datetime | None, now: datetime) -> Freshness:
    """Hours behind (now - last successful data_interval_end) and the deadline check.

    As the `freshness` field means it: the next interval (the one after the last success) must
    have succeeded within `freshness` of its end. Before any success, the first interval after
    the table's start date must have.
    """
    behind = None if last_success_end is None else (now - last_success_end).total_seconds() / 3600
    limit = table.freshness
    if not limit:
        return Freshness(last_success_end, behind, None, False)
    start = last_success_end or datetime.combine(
        getattr(table, "start_date", now.date()), datetime.min.time(), UTC
    )
    deadline = next_interval_end(table.schedule.cron, start) + limit.delta
    return Freshness(last_success_end, behind, deadline, now > deadline)


def read_check(table_root: Location) -> CheckResult | None:
    """The table's latest `cdc check` result, or None when there is none (or it is unreadable)."""
    path = table_root / CHECK_FILE
    try:
        text = store_for(path).read_text(path)
        if text is None:
            return None
        data = json.loads(text)
        return CheckResult(
            checked_at=str(data["checked_at"]),
            ok=bool(data["ok"]),
            breaches=[str(b) for b in data.get("breaches") or []],
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        # A half-written or foreign file: say so in the view rather than hide the table.
        return CheckResult(checked_at="?", ok=False, breaches=[f"unreadable {path}: {error}"])


def _table(path: Location) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None


def _rows(table: Any) -> int | None:
    if table is None:
        return None
    import pyarrow as pa

    counts = pa.table(table.get_add_actions(flatten=True)).column("num_records").to_pylist()
    return int(sum(c or 0 for c in counts))


def _last(table: Any, match: Any) -> str | None:
    """Time of the newest commit (of the last 500) that `match` accepts."""
    if table is None:
        return None
    for entry in table.history(limit=500):
        if match(entry):
            return datetime.fromtimestamp(int(entry["timestamp"]) / 1000, UTC).strftime(TIME_FORMAT)
    return None


# A reason quotes the refused value (`unparsable value in AMOUNT: 'x1' is not a valid ...`):
# reasons are counted with the quoted text left out, so one cause is one line.
_QUOTED = re.compile(r"'.*'")


def reason_kind(reason: str) -> str:
    """`reason` with its quoted value replaced by `'…'`."""
    return _QUOTED.sub("'…'", reason, count=1)


def top_reasons(
    table: Any, root: Location, limit: int = TOP_REASONS, max_rows: int = REASON_ROWS
) -> list[tuple[str, int]]:
    """The most frequent reasons among the quarantine's newest rows (files newest first, until
    `max_rows`), most frequent first: only the reason column is read."""
    if table is None:
        return []
    import pyarrow as pa
    import pyarrow.dataset as ds

    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    actions.sort(key=lambda a: a.get("modification_time") or 0, reverse=True)
    chosen, rows = [], 0
    for action in actions:
        if rows >= max_rows:
            break
        chosen.append(root / unquote(action["path"]))
        rows += int(action.get("num_records") or 0)
    if not chosen:
        return []
    filesystem, files = arrow_files(chosen)
    dataset = ds.dataset(files, format="parquet", filesystem=filesystem)
    column = dataset.to_table(columns=[REASON]).column(REASON)
    counts: dict[str, int] = {}
    for value in column.to_pylist():
        if value is not None:
            kind = reason_kind(str(value))
            counts[kind] = counts.get(kind, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:limit]


def recent_commits(table: Any, root: Location, limit: int = RECENT_COMMITS) -> list[Commit]:
    """The table's newest commits, newest first: who committed, when, files and rows added,
    files removed (from each commit's own log file, when it is still there)."""
    if table is None:
        return []
    commits = []
    for entry in table.history(limit=limit):
        version = int(entry["version"])
        at = datetime.fromtimestamp(int(entry["timestamp"]) / 1000, UTC)
        added = removed = rows = None
        log = root / "_delta_log" / f"{version:020d}.json"
        try:
            text = store_for(log).read_text(log)
        except OSError:
            text = None
        if text is not None:
            added = removed = rows = 0
            for line in text.splitlines():
                action = json.loads(line) if line.strip() else {}
                if "add" in action:
                    added += 1
                    stats = json.loads(action["add"].get("stats") or "{}")
                    rows += int(stats.get("numRecords") or 0)
                elif "remove" in action:
                    removed += 1
        commits.append(
            Commit(
                version=version,
                at=at,
                operation=str(entry.get("cdc_step") or entry.get("operation") or "?"),
                files_added=added,
                files_removed=removed,
                rows_added=rows,
                seconds=_attempt_seconds(entry.get("cdc_run_id"), at),
            )
        )
    return commits


def _attempt_seconds(run_id: Any, at: datetime) -> float | None:
    """Seconds from the step attempt's start (its run id begins with it) to its commit."""
    try:
        started = datetime.strptime(str(run_id)[:15], "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None
    seconds = (at - started).total_seconds()
    return seconds if seconds >= 0 else None


def table_status(
    table: TableConfig,
    runs: Sequence[RunPoint],
    now: datetime | None = None,
    paths: TablePaths | None = None,
    *,
    paused: bool = False,
    backfills: Sequence[BackfillProgress] = (),
) -> TableStatus:
    """The view's row of one table from its recent runs (oldest start first), its backfills in
    progress and its Delta logs."""
    now = now or datetime.now(UTC)
    paths = paths or TablePaths.for_table(table.name)
    successes = [r for r in runs if r.state == "success" and r.interval_end is not None]
    last = max(successes, key=lambda r: r.interval_end or now) if successes else None
    last_end = last.interval_end if last else None
    unreadable = unreadable_table(paths)
    data = None
    try:
        properties = _kafka_properties(table)
        if unreadable is None:
            data = data_freshness(table, paths, now, kafka_properties=properties)
    except Exception as error:  # a broken table still gets its row, measured by its runs
        log.exception("table %s: freshness by data unreadable", table.name)
        unreadable = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    if data is not None:
        freshness = data_freshness_of(table, last_end, data)
    else:
        freshness = freshness_of(table, last_end, now)
    problems: list[str] = []
    return TableStatus(
        health=_health(table, paths, data, unreadable, runs, paused=paused),
        name=table.name,
        dag_id=table.dag_id,
        freshness_limit=getattr(table, "freshness", None),
        freshness=freshness,
        last_success_interval=None
        if last is None or last.interval_start is None or last.interval_end is None
        else f"[{last.interval_start:%Y-%m-%d %H:%M}, {last.interval_end:%Y-%m-%d %H:%M})",
        last_run=runs[-1] if runs else None,
        runs=list(runs),
        paused=paused,
        backfills=list(backfills),
        max_quarantine_fraction=table.max_quarantine_fraction,
        check=read_check(paths.table_root),
        **_delta_facts(paths, problems),
        problem="; ".join(problems) or None,
    )


def _kafka_properties(table: TableConfig) -> dict[str, str] | None:
    """A Kafka table's client properties from its Airflow connection (None: the process's own
    CDC_KAFKA_* variables, or not a Kafka table)."""
    if table.source != "kafka":
        return None
    from cdc_airflow.backends import kafka_environment
    from cdc_pipeline.kafka_settings import properties_from_environment

    try:
        found = kafka_environment(table.kafka_conn_id)
    except Exception:  # the process cannot read connections: its own variables apply
        log.warning("table %s: connection %s unreadable here", table.name, table.kafka_conn_id)
        return None
    return properties_from_environment(found) if found else None


def _health(
    table: TableConfig,
    paths: TablePaths,
    data: DataFreshness | None,
    unreadable: str | None,
    runs: Sequence[RunPoint],
    *,
    paused: bool,
) -> Health:
    """The table's health (`cdc_pipeline.health`) with what Airflow adds: the last finished
    run failed, the DAG paused while changes wait."""
    facts = health_facts(table, paths, data, unreadable)
    finished = [r for r in runs if r.finished]
    failed = None
    if finished and finished[-1].state == "failed":
        run = finished[-1]
        # A check task failed only to show a quarantine breach (quarantine_action warn): the
        # run applied its changes, and the breach is the quarantine warning, read from staging.
        failures = [
            (task, reason)
            for task, reason in run.failures
            if not (task in BREACH_TASK_IDS and (reason or "").startswith(QUARANTINE_BREACH_PREFIX))
        ]
        named = [f"{task}: {reason}" if reason else task for task, reason in failures]
        if failures or not run.failures:  # no failed task known: the run's id says which
            failed = "; ".join(named) or run.run_id
    waiting = data is not None and bool(data.files_waiting or data.messages_waiting)
    return table_health(
        replace(facts, last_run_failed=failed, paused_with_waiting=paused and waiting)
    )


def _delta_facts(paths: TablePaths, problems: list[str]) -> dict[str, Any]:
    """What the row shows of the table's Delta tables; what cannot be read goes to `problems`
    (one damaged table is this row's problem, never the page's)."""

    def opened(path: Location) -> Any:
        return _or_problem(lambda: _table(path), f"{path.name}", problems)

    final, staging, quarantine = (
        opened(paths.final),
        opened(paths.staging),
        opened(paths.quarantine),
    )
    return {
        "final_version": final.version() if final is not None else None,
        "final_rows": _rows(final),
        "staging_rows": _rows(staging),
        "quarantined_rows": _rows(quarantine),
        "last_optimize": _last(final, lambda e: e.get("operation") == "OPTIMIZE"),
        "last_vacuum": _last(final, lambda e: e.get("operation") == "VACUUM END"),
        "last_reset": _last(staging, lambda e: e.get("cdc_step") == "reset_staging"),
        "top_reasons": _or_problem(
            lambda: top_reasons(quarantine, paths.quarantine), "quarantine reasons", problems
        )
        or [],
        "commits": _or_problem(
            lambda: recent_commits(final, paths.final), "final's commits", problems
        )
        or [],
    }


def _or_problem(read: Any, what: str, problems: list[str]) -> Any:
    """`read()`, or None with the reason in `problems` (the row shows it; the page lives)."""
    try:
        return read()
    except Exception as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        problems.append(f"{what} unreadable: {type(error).__name__}: {text}")
        return None


def all_table_status(
    readable: Collection[str] | None = None,
    *,
    with_airflow: bool = True,
    now: datetime | None = None,
) -> list[TableStatus]:
    """One row per valid config row whose DAG id is in `readable` (None: every row), by name.

    Tables the caller may not read are dropped before their Delta logs or runs are read.
    """
    tables = [
        t
        for _, t in sorted(load_table_configs().tables.items())
        if readable is None or t.dag_id in readable
    ]
    dag_ids = [t.dag_id for t in tables]
    runs = recent_runs(dag_ids) if with_airflow else {}
    paused = paused_dags(dag_ids) if with_airflow else set()
    backfills = active_backfills(dag_ids) if with_airflow else {}
    return [
        _table_status_or_problem(
            t,
            runs.get(t.dag_id, []),
            now,
            paused=t.dag_id in paused,
            backfills=backfills.get(t.dag_id, []),
        )
        for t in tables
    ]


def _table_status_or_problem(
    table: TableConfig,
    runs: Sequence[RunPoint],
    now: datetime | None,
    *,
    paused: bool,
    backfills: Sequence[BackfillProgress],
) -> TableStatus:
    """The table's row; when reading it fails, a row that says why (the others still show)."""
    try:
        return table_status(table, runs, now, paused=paused, backfills=backfills)
    except Exception as error:
        log.exception("table %s: status unreadable", table.name)
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return TableStatus(
            name=table.name,
            dag_id=table.dag_id,
            freshness_limit=getattr(table, "freshness", None),
            freshness=Freshness(None, None, None, False),
            last_success_interval=None,
            last_run=runs[-1] if runs else None,
            runs=list(runs),
            problem=f"unreadable: {type(error).__name__}: {text}",
            paused=paused,
            backfills=list(backfills),
        )
