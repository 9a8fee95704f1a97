"""Turn planned table DAGs into Airflow DAGs (imports Airflow; never Spark or delta-rs)."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, Param
from airflow.sdk.exceptions import AirflowSkipException

from cdc_pipeline.config import ConfigLoadResult, default_config_path, load_table_configs
from cdc_pipeline.planning import DagPlan, TaskPlan, cron_of, is_due, plan_table_dag

log = logging.getLogger(__name__)
SPARK_JOBS_DIR = Path(__file__).resolve().parent.parent / "spark_jobs"
DEFAULT_ARGS = {
    "owner": "cdc",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}


def spark_environment(config_path: Path) -> dict[str, str]:
    """What spark-submit needs to run this venv's PySpark, and the config the DAG was built from."""
    python = sys.executable
    spec = importlib.util.find_spec("pyspark")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed in the Python running Airflow")
    spark_home = Path(spec.origin).parent
    return {
        "SPARK_HOME": str(spark_home),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        "CDC_CONFIG": str(config_path.resolve()),
    }


class CdcStepOperator(SparkSubmitOperator):
    """spark-submit of one CDC step; maintenance steps skip themselves when not due.

    The step writes its counts to a JSON file; they are logged and returned (so, pushed to XCom).
    """

    def __init__(
        self,
        *,
        cdc_step: str,
        maintenance_schedule: str | None = None,
        is_maintenance: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cdc_step = cdc_step
        self.maintenance_schedule = maintenance_schedule
        self.is_maintenance = is_maintenance

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]
        if self.is_maintenance:
            start, end = context["data_interval_start"], context["data_interval_end"]
            forced = bool(context["params"].get("force_maintenance"))
            if not forced and not is_due(self.maintenance_schedule, start, end):
                raise AirflowSkipException(
                    f"{self.task_id} is not due in [{start}, {end}) (cadence {self.maintenance_schedule}); "
                    "trigger with force_maintenance=true to run it now"
                )
        summary = Path(tempfile.mkdtemp(prefix="cdc-summary-")) / "summary.json"
        self.env_vars = {**(self.env_vars or {}), "CDC_SUMMARY_PATH": str(summary)}
        super().execute(context)
        report: dict[str, Any] = json.loads(summary.read_text()) if summary.exists() else {}
        self.log.info("CDC summary: %s", report.get("line", "(none written)"))
        summary.unlink(missing_ok=True)
        summary.parent.rmdir()
        return report


def build_task(plan: DagPlan, task: TaskPlan, config_path: Path) -> CdcStepOperator:
    """One planned task as an operator of the current DAG context."""
    return CdcStepOperator(
        task_id=task.task_id,
        cdc_step=task.step,
        maintenance_schedule=task.maintenance_schedule,
        is_maintenance=task.is_maintenance,
        application=str(SPARK_JOBS_DIR / f"{task.step}.py"),
        application_args=list(task.arguments),
        conn_id=plan.conn_id,
        name=f"cdc-{plan.table}-{task.task_id}",
        spark_binary=str(Path(sys.executable).parent / "spark-submit"),
        env_vars=spark_environment(config_path),
        max_active_tis_per_dag=1,
        trigger_rule="none_failed" if task.is_maintenance else "all_success",
    )


def build_dag(plan: DagPlan, config_path: Path) -> DAG:
    """The Airflow DAG of one planned table."""
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
    ) as dag:
        operators = {task.task_id: build_task(plan, task, config_path) for task in plan.tasks}
        for upstream, downstream in plan.edges:
            operators[upstream] >> operators[downstream]
    return dag


def build_dags(config_path: Path | str | None = None) -> dict[str, DAG]:
    """One DAG per valid config row; a row that fails to build is logged, the others still load."""
    path = Path(config_path) if config_path is not None else default_config_path()
    result = load_table_configs(path)
    dags: dict[str, DAG] = {}
    for name, table in sorted(result.tables.items()):
        try:
            dags[table.dag_id] = build_dag(plan_table_dag(table), path)
        except Exception:
            log.exception("table %s: its DAG could not be built", name)
    return dags


def config_problems_message(result: ConfigLoadResult) -> str | None:
    """The import error text for invalid config rows, or None when every row is valid."""
    if not result.problems:
        return None
    lines = "\n".join(str(p) for p in result.problems)
    return f"invalid rows in the CDC config table (these tables have no DAG):\n{lines}"


def raise_config_problems(config_path: Path | str | None = None) -> None:
    """Raise the invalid rows as this DAG file's import error (the valid DAGs load elsewhere)."""
    message = config_problems_message(load_table_configs(config_path))
    if message:
        raise ValueError(message)
