"""Turn planned table DAGs into Airflow DAGs of `CdcStepOperator` tasks (imports Airflow only)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, CronDataIntervalTimetable, Param, get_parsing_context

from cdc_airflow.operations import dag_arguments, task_arguments
from cdc_airflow.operator import SPARK_JOBS_DIR, CdcStepOperator, spark_environment
from cdc_pipeline.config import default_config_path, load_table_configs
from cdc_pipeline.paths import spark_jars
from cdc_pipeline.planning import DagPlan, TaskPlan, cron_of, plan_table_dag
from cdc_pipeline.steps import step_named

log = logging.getLogger(__name__)

DEFAULT_ARGS = {
    "owner": "cdc",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}


@dataclass(frozen=True)
class TaskSettings:
    """What every task of one parse shares, worked out once a parse (globbing the jars folder
    and locating PySpark per task took a third of a 65-table parse's CPU): the config, and how
    a spark-submit task starts."""

    config_path: str
    spark_binary: str
    env_vars: dict[str, str]
    jars: str | None

    @classmethod
    def of(cls, config_path: Path) -> TaskSettings:
        return cls(
            config_path=str(config_path.resolve()),
            spark_binary=str(Path(sys.executable).parent / "spark-submit"),
            env_vars=spark_environment(config_path),
            # The jars of CDC_SPARK_JARS or the checkout's jars/ (Delta Lake's reader), on
            # spark-submit's driver too.
            jars=",".join(str(j) for j in spark_jars()) or None,
        )


def build_task(plan: DagPlan, task: TaskPlan, settings: TaskSettings) -> CdcStepOperator:
    """One planned task as an operator of the current DAG context."""
    gated = {t.task_id: t.maintenance_schedule for t in plan.tasks if t.is_maintenance}
    return CdcStepOperator(
        # The step that writes final skips the maintenance tasks not due (they all run after it).
        maintenance_after=gated if step_named(task.step).writes_final else None,
        task_id=task.task_id,
        cdc_step=task.step,
        table=plan.table,
        config_path=settings.config_path,
        maintenance_schedule=task.maintenance_schedule,
        is_maintenance=task.is_maintenance,
        application=str(SPARK_JOBS_DIR / f"{task.step}.py"),
        application_args=list(task.arguments),
        conn_id=plan.conn_id,
        kafka_conn_id=plan.kafka_conn_id,
        name=f"cdc-{plan.table}-{task.task_id}",
        spark_binary=settings.spark_binary,
        env_vars=dict(settings.env_vars),
        jars=settings.jars,
        max_active_tis_per_dag=1,
        trigger_rule="none_failed" if task.is_maintenance else "all_success",
        **task_arguments(plan, task),
    )


def build_dag(plan: DagPlan, settings: TaskSettings) -> DAG:
    """The Airflow DAG of one planned table, its tasks with the parse's `settings`."""
    with DAG(
        dag_id=plan.dag_id,
        schedule=CronDataIntervalTimetable(cron_of(plan.schedule), timezone="UTC"),
        start_date=plan.start_date,
        catchup=False,
        max_active_runs=1,
        tags=list(plan.tags),
        doc_md=plan.doc_md,
        description=plan.description,
        default_args=DEFAULT_ARGS,
        params={
            "force_maintenance": Param(False, type="boolean", description="run maintenance now")
        },
        **dag_arguments(plan),
    ) as dag:
        operators = {task.task_id: build_task(plan, task, settings) for task in plan.tasks}
        for upstream, downstream in plan.edges:
            operators[upstream] >> operators[downstream]
    return dag


def build_dags(config_path: Path | str | None = None) -> dict[str, DAG]:
    """One DAG per valid config row; a row that fails to build is logged, the others still load."""
    path = Path(config_path) if config_path is not None else default_config_path()
    result = load_table_configs(path)
    # A task process parses this file for its own DAG only: build just that one.
    wanted = get_parsing_context().dag_id
    dags: dict[str, DAG] = {}
    settings: TaskSettings | None = None
    for name, table in sorted(result.tables.items()):
        if wanted is not None and table.dag_id != wanted:
            continue
        try:
            settings = settings or TaskSettings.of(path)
            dags[table.dag_id] = build_dag(plan_table_dag(table), settings)
        except Exception:
            log.exception("table %s: its DAG could not be built", name)
    return dags
