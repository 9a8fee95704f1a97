"""Airflow-free plan of each table's DAG: tasks, order, schedules (plain data, no operators)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from cdc_pipeline.config import TableConfig
from cdc_pipeline.paths import location_uri, warehouse_root

# One preset table and one cron check for validation, DAGs and cadences (re-exported here).
from cdc_pipeline.schedules import PRESETS, cron_of, is_due  # noqa: F401
from cdc_pipeline.steps import dag_steps, step_named

# An interval step's bounds: the task puts the run's data interval in place of the marks (or
# for a run triggered without a logical date the latest complete interval,
# cdc_pipeline.manual_runs.run_interval), as ISO text. Not Jinja: a task with template fields
# renders them and stores them through the API server, a request of each task (33 ms on average
# in a 65-table cycle's api-server log) before its step starts.
INTERVAL_START, INTERVAL_END = "<interval start>", "<interval end>"
INTERVAL_ARGS = ("--start", INTERVAL_START, "--end", INTERVAL_END)


def with_interval(arguments: Iterable[str], start: datetime, end: datetime) -> tuple[str, ...]:
    """`arguments` with the interval marks replaced by `start` and `end` as ISO text."""
    bounds = {INTERVAL_START: start.isoformat(), INTERVAL_END: end.isoformat()}
    return tuple(bounds.get(argument, argument) for argument in arguments)


@dataclass(frozen=True)
class TaskPlan:
    """One task: which step runs, with which arguments, and when a maintenance task is due."""

    task_id: str
    step: str  # the step's module in spark_jobs (cdc_pipeline.steps)
    arguments: tuple[str, ...]
    maintenance_schedule: str | None = None
    is_maintenance: bool = False
    execution_timeout: timedelta | None = None
    retries: int | None = None
    pool: str | None = None  # the table's pool: a rewrite or maintenance of the table
    outlets: tuple[str, ...] = ()  # URIs of the assets this task updates (the plan names them)


@dataclass(frozen=True)
class DagPlan:
    """One table's DAG as plain data."""

    dag_id: str
    table: str
    schedule: str
    start_date: datetime
    tasks: tuple[TaskPlan, ...]
    edges: tuple[tuple[str, str], ...]
    tags: tuple[str, ...]
    doc_md: str
    conn_id: str
    description: str = ""
    dagrun_timeout: timedelta | None = None
    freshness: timedelta | None = None  # deadline after a run is queued; None: no deadline
    notify: tuple[str, ...] = ()
    max_quarantine_fraction: float | None = None
    quarantine_action: str = "warn"
    asset_uri: str = ""
    asset_name: str = ""
    # A Kafka table: the Airflow connection of its broker (None: the table reads files).
    kafka_conn_id: str | None = None


# The pool `cdc_<name>` (1 slot) serializes the tasks whose step is `pooled` (they rewrite a
# table's files), so maintenance never runs beside another run's rewrite (and two rewrites, which
# would conflict at commit and recompute, take turns). Overlapping runs stage in parallel.


def table_asset_name(table: str) -> str:
    """The Airflow asset name of a table's final table: its URI, as Airflow names an Asset given
    only one. Airflow keeps one active asset per name: a name like `cdc.orders` made the asset
    inactive (its tasks fail) as soon as the same table was parsed at another URI (a warehouse
    moved, a second environment on one metadata DB)."""
    return table_asset_uri(table)


def table_asset_uri(table: str) -> str:
    """The Airflow asset URI of a table's final table: where it is (`s3://bucket/warehouse/orders/
    final`, `file:///.../warehouse/orders/final`), the dataset lineage tools know it by."""
    return location_uri(warehouse_root() / table / "final")


def plan_table_dag(table: TableConfig) -> DagPlan:
    """The registry's DAG steps in order (stage -> overwrite_final -> reset_staging -> optimize
    -> vacuum -> check); maintenance tasks by their cadence."""
    tasks = tuple(
        TaskPlan(
            step.task_id,
            step.module,
            (table.name, *INTERVAL_ARGS) if step.kind == "interval" else (table.name,),
            getattr(table, f"{step.module}_schedule") if step.maintenance else None,
            step.maintenance,
        )
        for step in dag_steps()
    )
    # One after another: each maintenance task rewrites files the next one reads.
    edges = tuple((a.task_id, b.task_id) for a, b in itertools.pairwise(tasks))
    kind = "insert-only" if table.insert_only else "upsert"
    row = json.dumps(
        table.model_dump(mode="json", exclude_none=True), indent=2
    )  # C-fast, unlike YAML
    doc = (
        f"### CDC table `{table.name}`\n\n{table.description or ''}\n\n"
        "Each run stages the change files of its data interval and rewrites the final partitions "
        "they touch. Maintenance tasks run when their cadence falls in the run's interval (or when "
        "triggered with `force_maintenance`), and are skipped otherwise.\n\n"
        f"Config row:\n\n```json\n{row}\n```\n"
    )
    asset_uri = table_asset_uri(table.name)
    timeout = table.execution_timeout.delta
    with_operations = tuple(
        replace(
            task,
            execution_timeout=timeout,
            retries=table.retries,
            pool=table.dag_id if step_named(task.step).pooled else None,
            outlets=(asset_uri,) if step_named(task.step).writes_final else (),
        )
        for task in tasks
    )
    return DagPlan(
        dag_id=table.dag_id,
        table=table.name,
        schedule=table.schedule,
        start_date=datetime.combine(table.start_date, datetime.min.time(), tzinfo=UTC),
        tasks=with_operations,
        edges=edges,
        tags=("cdc", "kafka" if table.source == "kafka" else table.file_format, kind),
        doc_md=doc,
        conn_id=table.spark_conn_id,
        description=table.description or f"CDC of {table.name} into Delta Lake",
        dagrun_timeout=table.dagrun_timeout.delta,
        freshness=table.freshness.delta if table.freshness else None,
        notify=tuple(table.notify),
        max_quarantine_fraction=table.max_quarantine_fraction,
        quarantine_action=table.quarantine_action,
        asset_uri=asset_uri,
        asset_name=table_asset_name(table.name),
        kafka_conn_id=table.kafka_conn_id if table.source == "kafka" else None,
    )
