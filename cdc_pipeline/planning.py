"""Airflow-free plan of each table's DAG: tasks, order, schedules (plain data, no operators)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from croniter import croniter

from cdc_pipeline.config import TableConfig

PRESETS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
INTERVAL_ARGS = (
    "--start",
    "{{ data_interval_start.isoformat() }}",
    "--end",
    "{{ data_interval_end.isoformat() }}",
)


def cron_of(schedule: str) -> str:
    """A preset as its cron expression; a cron expression unchanged."""
    return PRESETS.get(schedule.strip(), schedule.strip())


def is_due(schedule: str | None, start: datetime, end: datetime) -> bool:
    """True when the cadence `schedule` fires at some time in [start, end)."""
    if schedule is None:
        return False
    first = croniter(cron_of(schedule), start - timedelta(microseconds=1)).get_next(datetime)
    return bool(start <= first < end)


@dataclass(frozen=True)
class TaskPlan:
    """One task: which step runs, with which arguments, and when a maintenance task is due."""

    task_id: str
    step: str  # module in spark_jobs
    arguments: tuple[str, ...]
    maintenance_schedule: str | None = None
    is_maintenance: bool = False


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
    params: dict[str, bool] = field(default_factory=lambda: {"force_maintenance": False})


def plan_table_dag(table: TableConfig) -> DagPlan:
    """stage -> overwrite_final -> reset_staging -> optimize -> vacuum, maintenance by cadence."""
    tasks = (
        TaskPlan("stage", "stage", (table.name, *INTERVAL_ARGS)),
        TaskPlan("overwrite_final", "overwrite_final", (table.name, *INTERVAL_ARGS)),
        TaskPlan(
            "reset_staging", "reset_staging", (table.name,), table.reset_staging_schedule, True
        ),
        TaskPlan("optimize", "optimize", (table.name,), table.optimize_schedule, True),
        TaskPlan("vacuum", "vacuum", (table.name,), table.vacuum_schedule, True),
    )
    # Maintenance runs one after another: each rewrites files the next one reads.
    edges = (
        ("stage", "overwrite_final"),
        ("overwrite_final", "reset_staging"),
        ("reset_staging", "optimize"),
        ("optimize", "vacuum"),
    )
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
    return DagPlan(
        dag_id=table.dag_id,
        table=table.name,
        schedule=table.schedule,
        start_date=datetime.combine(table.start_date, datetime.min.time(), tzinfo=UTC),
        tasks=tasks,
        edges=edges,
        tags=("cdc", table.file_format, kind),
        doc_md=doc,
        conn_id=table.spark_conn_id,
        description=table.description or f"CDC of {table.name} into Delta Lake",
    )
