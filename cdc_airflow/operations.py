"""Operations of the CDC DAGs as Airflow arguments: timeouts, retries, the table's pool, its asset,
failure notifiers, the freshness deadline, and hooks around a task's execute (the run's interval
in the context, the quarantine check, the counts on the asset event). The operator class is
left alone: all of it is keyword arguments of the operator and of the DAG.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# airflow.sdk exports the deadline names at run time (its __all__); its type stub
# (__init__.pyi, Airflow 3.3.2) does not list them yet, hence the ignore.
from airflow.sdk import (  # type: ignore[attr-defined]
    Asset,
    DeadlineAlert,
    DeadlineReference,
    SyncCallback,
)
from airflow.sdk.exceptions import AirflowFailException

from cdc_airflow.alerts import (
    Alert,
    CdcNotifier,
    CdcRunTimeoutNotifier,
    deadline_missed,
    quarantine_finding,
    quarantine_reasons,
    send_alert,
)
from cdc_pipeline.counts import OverwriteCounts, StageCounts, count
from cdc_pipeline.durations import format_duration
from cdc_pipeline.manual_runs import run_interval
from cdc_pipeline.planning import (
    DagPlan,
    TaskPlan,
    cron_of,
    table_asset_name,
    table_asset_uri,
)
from cdc_pipeline.steps import QUARANTINE_BREACH_XCOM, step_named

log = logging.getLogger(__name__)


def table_asset(table: str) -> Asset:
    """The Airflow asset of a table's final table, named by its storage URI: what a
    downstream DAG schedules on (where the DAG processor's CDC_WAREHOUSE says it is)."""
    return Asset(name=table_asset_name(table), uri=table_asset_uri(table))


TABLE_POOLS_ENV = "CDC_TABLE_POOLS"


def table_pools_enabled() -> bool:
    """Whether the deployment created one pool per table (`CDC_TABLE_POOLS=1`)."""
    return os.environ.get(TABLE_POOLS_ENV, "").strip().lower() in ("1", "true", "yes")


def task_arguments(plan: DagPlan, task: TaskPlan) -> dict[str, Any]:
    """The operator keyword arguments of a task's operations settings (none is Spark-specific)."""
    arguments: dict[str, Any] = {
        "execution_timeout": task.execution_timeout,
        # The table's pool only where the deployment created the pools (CDC_TABLE_POOLS=1): a
        # task in a pool that does not exist is never scheduled, and nothing says so but the
        # scheduler log. Without it each task still runs one at a time across the table's runs
        # (max_active_tis_per_dag=1), and a maintenance step racing another run's rewrite is
        # caught at commit (exclusive rewrites, optimize's own conflict check) and recomputed.
        "pool": task.pool if table_pools_enabled() else None,
        "outlets": [Asset(name=plan.asset_name, uri=uri) for uri in task.outlets],
        "pre_execute": FillRunInterval(cron_of(plan.schedule)),
    }
    if task.retries is not None:
        arguments["retries"] = task.retries
    if plan.notify:
        arguments["on_failure_callback"] = CdcNotifier(plan.table, plan.notify)
    if step_named(task.step).checks_quarantine and plan.max_quarantine_fraction is not None:
        arguments["post_execute"] = QuarantineCheck(
            plan.table, plan.max_quarantine_fraction, plan.quarantine_action, plan.notify
        )
    if task.outlets:
        arguments["post_execute"] = PublishCounts(
            Asset(name=plan.asset_name, uri=task.outlets[0]),
            plan.table,
            format_duration(plan.freshness) if plan.freshness else None,
            tuple(plan.notify),
        )
    return arguments


def dag_arguments(plan: DagPlan) -> dict[str, Any]:
    """The DAG keyword arguments: run timeout, the freshness deadline."""
    arguments: dict[str, Any] = {"dagrun_timeout": plan.dagrun_timeout}
    if plan.notify and plan.dagrun_timeout is not None:
        arguments["on_failure_callback"] = CdcRunTimeoutNotifier(
            plan.table, plan.notify, format_duration(plan.dagrun_timeout)
        )
    if plan.freshness is not None:
        # Queued-at, not logical date: a backfill's runs of old intervals would all be past a
        # logical-date deadline the moment they are created. A scheduled run is queued when its
        # interval ends, so this bounds how far behind the table falls without an alert.
        arguments["deadline"] = DeadlineAlert(
            reference=DeadlineReference.DAGRUN_QUEUED_AT,
            interval=plan.freshness,
            callback=SyncCallback(
                deadline_missed,
                kwargs={
                    "table": plan.table,
                    "notify": list(plan.notify),
                    "freshness": format_duration(plan.freshness),
                },
            ),
            name=f"cdc_{plan.table}_freshness",
        )
    return arguments


class QuarantineLimitExceeded(AirflowFailException):
    """A stage run quarantined more than the row's max_quarantine_fraction (no retry: a rerun
    finds the files staged and would pass)."""

    cdc_alert_sent = True  # the quarantine alert went out already: no second task_failed alert


class QuarantineBreach(AirflowFailException):
    """The run's `check` task, failed because its stage went past max_quarantine_fraction with
    quarantine_action warn: the changes were applied; the failure is the visible warning (no
    retry: a retry would fail the same)."""

    cdc_alert_sent = True  # stage sent the quarantine alert already


def quarantine_breach(context: Any, stage_task_id: str) -> str | None:
    """The quarantine alert `stage` kept for this run (quarantine_action warn), if any."""
    ti = context.get("ti")
    if ti is None:
        return None
    found = ti.xcom_pull(task_ids=stage_task_id, key=QUARANTINE_BREACH_XCOM)
    return str(found) if found else None


@dataclass(frozen=True)
class FillRunInterval:
    """pre_execute: a run without a data interval (triggered with logical_date null) gets the
    latest complete interval of the schedule as data_interval_start/end in its context."""

    cron: str

    def __call__(self, context: Any) -> None:
        """Set the context's data interval when Airflow gave the run none."""
        if context.get("data_interval_start") is None or context.get("data_interval_end") is None:
            interval = run_interval(self.cron, context["dag_run"])
            context["data_interval_start"] = interval.start
            context["data_interval_end"] = interval.end


@dataclass(frozen=True)
class QuarantineCheck:
    """post_execute of `stage`: alert when the run quarantined more than `limit` of its rows."""

    table: str
    limit: float
    action: str  # warn | fail
    notify: Sequence[str]

    def __call__(self, context: Any, result: Any = None) -> None:
        """Warn (log + notifiers) or fail the task, with the most frequent reasons. Also alerts
        when the stage found files landed outside the late-arrival window (never staged)."""
        alert_outside_window(context, self.table, result, self.notify)
        finding = quarantine_finding(result if isinstance(result, dict) else None, self.limit)
        if not finding.exceeded:
            return
        reasons = self.reasons(result)
        message = (
            f"table {self.table}: stage quarantined {finding.quarantined} of {finding.rows_read} "
            f"rows ({finding.fraction:.1%}), more than max_quarantine_fraction {self.limit:g}; "
            f"reasons: {'; '.join(reasons) or 'unknown'}"
        )
        details = {
            "rows_read": finding.rows_read,
            "quarantined": finding.quarantined,
            "fraction": finding.fraction,
            "limit": self.limit,
            "action": self.action,
            "reasons": reasons,
        }
        send_alert(
            task_alert(context, "quarantine", self.table, message, details, "stage"), self.notify
        )
        if self.action == "fail":
            raise QuarantineLimitExceeded(
                message + ". Staged rows are not applied to final until the run is repeated "
                "(clear the run's tasks) once the source is fixed or the rows accepted."
            )
        # warn: the rows go on to final; the run's check task fails with this (QuarantineBreach).
        context["ti"].xcom_push(key=QUARANTINE_BREACH_XCOM, value=message)

    def reasons(self, result: Any) -> list[str]:
        """This run's most frequent reasons, read from the quarantine version it committed."""
        from cdc_pipeline.paths import TablePaths

        version = ((result or {}).get("counts") or {}).get("quarantine_version")
        if version is None:
            return []
        try:
            return quarantine_reasons(TablePaths.for_table(self.table).quarantine, int(version))
        except Exception as error:  # the fraction alone still decides
            return [f"(reasons unreadable: {type(error).__name__}: {error})"]


def alert_if_stale(context: Any, table: str, freshness: str, notify: Sequence[str]) -> None:
    """Alert (log + notifiers) when a file has waited longer than `freshness` to be applied, or
    landed outside the late-arrival window: the deadline is on the data, not on the runs."""
    from cdc_pipeline.config import load_table_configs
    from cdc_pipeline.paths import TablePaths
    from spark_jobs.status.freshness import data_freshness, data_freshness_of

    task = getattr(context.get("ti"), "task", None)
    config = getattr(task, "config_path", None)
    try:
        row = load_table_configs(config).table(table)
        # The operator measured it after the step for its metrics (cdc_airflow.metrics).
        measured = getattr(task, "data_freshness", None)
        data = measured or data_freshness(row, TablePaths.for_table(table))
    except Exception:  # the alert must not fail a run that applied its changes
        log.exception("table %s: freshness by data unreadable", table)
        return
    verdict = data_freshness_of(row, None, data)
    if not verdict.overdue:
        return
    document = data.document()
    message = (
        f"table {table}: {data.files_waiting} file(s) landed and not applied, the oldest since "
        f"{document['oldest_waiting']} holding changes from "
        f"{document['oldest_change_waiting']} on (freshness {freshness}); "
        f"{data.files_outside_window} file(s) outside the late_arrival_window: `cdc status {table}`"
    )
    send_alert(
        task_alert(context, "stale_data", table, message, document, "overwrite_final"),
        notify,
    )


def alert_outside_window(context: Any, table: str, result: Any, notify: Sequence[str]) -> None:
    """Alert when a stage counted files landed in hour folders older than its late-arrival
    window: they are never staged by a scheduled run (the warning in the log names them and the
    `cdc run` that applies them)."""
    payload = (result or {}).get("counts") if isinstance(result, dict) else None
    outside = count(StageCounts.of_payload(payload).files_outside_window)
    if not outside:
        return
    message = (
        f"table {table}: {outside} file(s) landed in hour folders older than the "
        f"late_arrival_window, not staged: `cdc status {table}`; the stage task's log names "
        "them and the `cdc run` that applies them"
    )
    details = {"files_outside_window": outside}
    alert = task_alert(context, "files_outside_window", table, message, details, "stage")
    send_alert(alert, notify)


def task_alert(
    context: Any, kind: str, table: str, message: str, details: dict[str, Any], task: str
) -> Alert:
    """An alert raised by the running task instance of `context` (its DAG, run and task;
    `task` when the context has no task instance)."""
    ti = context.get("ti")
    return Alert(
        kind=kind,
        table=table,
        dag_id=str(getattr(ti, "dag_id", f"cdc_{table}")),
        run_id=str(getattr(ti, "run_id", "")),
        task_id=getattr(ti, "task_id", task),
        message=message,
        details=details,
    )


def final_changed(payload: dict[str, Any]) -> bool:
    """Whether an overwrite-final run (its summary's counts) changed final: it rewrote a
    partition or wrote rows."""
    counts = OverwriteCounts.of_payload(payload)
    return count(counts.partitions_rewritten) > 0 or count(counts.rows_written) > 0


@dataclass(frozen=True)
class PublishCounts:
    """post_execute of `overwrite_final`: the run's interval and counts as the asset event's extra
    (no event when final did not change), then the freshness check by the data."""

    asset: Any  # airflow.sdk.Asset
    table: str = ""
    freshness: str | None = None
    notify: Sequence[str] = ()

    def __call__(self, context: Any, result: Any = None) -> None:
        """Attach the step's counts to the event Airflow emits for the table's asset; a run that
        left final as it was emits no event (a downstream DAG scheduled on the table would run
        for nothing): Airflow emits one per outlet the task holds when it succeeds, so the task
        instance's copy of the operator drops its outlets."""
        report = result if isinstance(result, dict) else {}
        if self.freshness:
            alert_if_stale(context, self.table, self.freshness, self.notify)
        if not final_changed(report.get("counts") or {}):
            task = getattr(context.get("ti"), "task", None)
            if task is not None:
                task.outlets = []
            return
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        context["outlet_events"][self.asset].extra = {
            "table": report.get("table"),
            "data_interval_start": start.isoformat() if start is not None else None,
            "data_interval_end": end.isoformat() if end is not None else None,
            "counts": report.get("counts", {}),
        }
