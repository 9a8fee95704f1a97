"""Turn planned table DAGs into Airflow DAGs (imports Airflow; Spark and delta-rs only in a task)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import socket
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import (
    DAG,
    BaseHook,
    CronDataIntervalTimetable,
    Param,
    SkipMixin,
    get_parsing_context,
)
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from cdc_airflow.connect_server import connect_address
from cdc_airflow.operations import dag_arguments, task_arguments
from cdc_pipeline.config import ConfigLoadResult, default_config_path, load_table_configs
from cdc_pipeline.errors import ConfigError, TableDamagedError, UsageError
from cdc_pipeline.jvm import utf8_locale
from cdc_pipeline.planning import DagPlan, TaskPlan, cron_of, is_due, plan_table_dag
from cdc_pipeline.steps import step_named

log = logging.getLogger(__name__)
SPARK_JOBS_DIR = Path(__file__).resolve().parent.parent / "spark_jobs"
JARS_DIR = SPARK_JOBS_DIR.parent / "jars"
LOG4J_OPTION = f"-Dlog4j2.configurationFile=file:{SPARK_JOBS_DIR / 'log4j2.properties'}"
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
        **utf8_locale(os.environ),  # the driver JVM reads file names as UTF-8
    }


class SparkConnectUnavailableError(AirflowException):
    """The Spark Connect server of the task's connection does not answer; the task retries."""


def active_connect_session() -> Any:
    """This process's Spark Connect session, if a step created one (None otherwise)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    return ConnectSession.getActiveSession()


class CdcStepOperator(SparkSubmitOperator, SkipMixin):
    """One CDC step, run as the task's Spark connection says; maintenance skips when not due.

    The task whose step `writes_final` (overwrite_final) also marks every maintenance task that is
    not due as skipped when it succeeds, so a run starts no task process for them (a 65-table
    cycle saves 4 task starts per table). Each maintenance task still checks its cadence
    itself, for runs cleared or triggered task by task.

    A `spark_connect` connection: the step runs inside this task process as a Spark Connect client
    of the server (no JVM here), through the same step functions as the `cdc` command; its Spark
    work carries a tag that `on_kill` interrupts. A `spark` connection: spark-submit of the step's
    module, which writes its counts to a JSON file. Either way the summary line is logged and the
    counts are returned (so, pushed to XCom). An interval with no landed file and no staged batch
    is a no-op reported without any Spark.
    """

    def __init__(
        self,
        *,
        cdc_step: str,
        maintenance_schedule: str | None = None,
        is_maintenance: bool = False,
        config_path: str | None = None,
        maintenance_after: dict[str, str | None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cdc_step = cdc_step
        self.maintenance_after = maintenance_after or {}
        self.maintenance_schedule = maintenance_schedule
        self.is_maintenance = is_maintenance
        self.config_path = config_path
        self._connect_session: Any = None
        self._connect_tag: str | None = None
        self._cdc_report: dict[str, Any] = {}

    def execute(self, context: Any) -> dict[str, Any]:  # type: ignore[override]
        if self.is_maintenance:
            start, end = context["data_interval_start"], context["data_interval_end"]
            forced = bool(context["params"].get("force_maintenance"))
            if not forced and not is_due(self.maintenance_schedule, start, end):
                raise AirflowSkipException(
                    f"{self.task_id} is not due in [{start}, {end}) (cadence {self.maintenance_schedule}); "
                    "trigger with force_maintenance=true to run it now"
                )
        connection = BaseHook.get_connection(self._conn_id)
        if connection.conn_type == SparkConnectHook.conn_type:
            report = self.execute_connect(context)
        else:
            report = self.execute_submit(context)
        self.log.info("CDC summary: %s", report.get("line", "(none written)"))
        self._cdc_report = report
        return report

    def post_execute(self, context: Any, result: Any = None) -> None:
        """After the post_execute hooks (the asset event's counts): the maintenance gate.

        Here rather than in execute: skipping ends the task (Airflow's DownstreamTasksSkipped, a
        success), and raised from execute it would also skip the post_execute hooks.
        """
        super().post_execute(context, result)
        if self.maintenance_after:
            self.skip_maintenance_not_due(context, self._cdc_report)

    def skip_maintenance_not_due(self, context: Any, report: dict[str, Any]) -> None:
        """Mark the maintenance tasks that are not due in this run's interval as skipped.

        Skipping ends the task (Airflow's DownstreamTasksSkipped, a success) before Airflow
        pushes the return value, so the report is pushed to XCom here.
        """
        if context["params"].get("force_maintenance"):
            return
        start, end = context["data_interval_start"], context["data_interval_end"]
        not_due = [
            task_id
            for task_id, schedule in self.maintenance_after.items()
            if not is_due(schedule, start, end)
        ]
        if not not_due:
            return
        ti = context["ti"]
        ti.xcom_push(key="return_value", value=report)
        self.log.info("not due in [%s, %s): %s", start, end, ", ".join(not_due))
        self.skip(ti, [self.dag.get_task(task_id) for task_id in not_due])

    def execute_submit(self, context: Any) -> dict[str, Any]:
        """spark-submit of the step's module; its counts come back through a JSON file."""
        summary = Path(tempfile.mkdtemp(prefix="cdc-summary-")) / "summary.json"
        self.env_vars = {**(self.env_vars or {}), "CDC_SUMMARY_PATH": str(summary)}
        # The driver JVM starts with the steps' quiet log settings (a session cannot set them).
        self.conf = {"spark.driver.extraJavaOptions": LOG4J_OPTION, **(self.conf or {})}
        super().execute(context)
        report: dict[str, Any] = json.loads(summary.read_text()) if summary.exists() else {}
        summary.unlink(missing_ok=True)
        summary.parent.rmdir()
        return report

    def execute_connect(self, context: Any) -> dict[str, Any]:
        """The step in this process, as a Spark Connect client of the connection's server."""
        from spark_jobs.common import load_body, parse_step_args, perform, summary_payload

        url = SparkConnectHook(self._conn_id).get_connection_url()
        ti = context.get("ti")
        run = getattr(ti, "run_id", None) or context.get("run_id") or "run"
        # One tag per task try: on_kill interrupts exactly this task's Spark operations.
        tag = f"cdc-{self.dag_id}-{self.task_id}-{run}-{getattr(ti, 'try_number', 0)}"
        self._connect_tag = re.sub(r"[^A-Za-z0-9_.:-]", "_", tag)
        step = step_named(self.cdc_step)
        if step.kind == "tables":  # a step with its own arguments (check): its module's entry
            return self.execute_connect_main(url)
        config = Path(self.config_path) if self.config_path else None
        args = parse_step_args(step, self.application_args or [], config)
        try:
            noop = self.noop_report(step, args)
        except TableDamagedError as error:
            raise AirflowFailException(f"{step.name} {args.table}: {error}") from error
        if noop is not None:
            return noop
        factory = self.connect_session_factory(url) if step.needs_spark else None
        try:
            report = perform(args, step.name, load_body(step), factory)
        except (ConfigError, UsageError, TableDamagedError) as error:
            # Permanent: a retry would fail the same way (AirflowFailException skips retries).
            raise AirflowFailException(f"{step.name} {args.table}: {error}") from error
        except BaseException:
            # A timeout or kill raised inside a Spark call: the server may still be running it.
            self.interrupt_connect_work()
            raise
        finally:
            self.release_connect_session()
        print(report.line(), flush=True)
        return summary_payload(report)

    def noop_report(self, step: Any, args: Any) -> dict[str, Any] | None:
        """The no-op report of an interval step with no landed file and no staged batch."""
        if step.kind != "interval":
            return None
        from cdc_pipeline.config import load_table_configs
        from cdc_pipeline.paths import TablePaths
        from spark_jobs.common import interval_has_work, noop_report, summary_payload

        try:
            table = load_table_configs(args.config).table(args.table)
            interval = args.interval()
        except (ConfigError, UsageError) as error:
            raise AirflowFailException(f"{step.name} {args.table}: {error}") from error
        if interval_has_work(TablePaths.for_table(table.name), table, interval):
            return None
        report = noop_report(step.name, table.name, interval)
        print(report.line(), flush=True)
        return summary_payload(report)

    def execute_connect_main(self, url: str) -> dict[str, Any]:
        """Run the step module's own entry (`main(argv)`) here with `CDC_SPARK_REMOTE` set."""
        import importlib

        self.check_connect_server(url)
        summary = Path(tempfile.mkdtemp(prefix="cdc-summary-")) / "summary.json"
        overrides = {
            "CDC_SPARK_REMOTE": url,
            "CDC_SPARK_TAGS": self._connect_tag or "",
            "CDC_SUMMARY_PATH": str(summary),
            "CDC_CONFIG": self.config_path or os.environ.get("CDC_CONFIG", ""),
        }
        saved = {key: os.environ.get(key) for key in overrides}
        os.environ.update(overrides)
        try:
            module = importlib.import_module(f"spark_jobs.{self.cdc_step}")
            code = module.main(list(self.application_args or []))
        except BaseException:
            self._connect_session = active_connect_session()
            self.interrupt_connect_work()
            raise
        finally:
            self._connect_session = self._connect_session or active_connect_session()
            self.release_connect_session()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        report: dict[str, Any] = json.loads(summary.read_text()) if summary.exists() else {}
        summary.unlink(missing_ok=True)
        summary.parent.rmdir()
        if code == 2:
            raise AirflowFailException(f"{self.cdc_step} exited with 2 (bad arguments or config)")
        if code != 0:
            raise AirflowException(f"{self.cdc_step} exited with {code}; its error is logged above")
        return report

    def check_connect_server(self, url: str) -> None:
        """Raise a retryable error naming the connection and URL when the server is down.

        The Connect client itself would retry a refused connection for minutes before failing.
        """
        host, port = connect_address(url)
        try:
            socket.create_connection((host, port), timeout=10).close()
        except OSError as error:
            raise SparkConnectUnavailableError(
                f"Spark Connect server of connection '{self._conn_id}' at {url} is not "
                f"reachable ({error}); start it (make airflow starts one) or fix the connection"
            ) from error

    def connect_session_factory(self, url: str) -> Any:
        """A function giving this task's tagged Connect session; refuses a server that is down."""

        def factory(app_name: str) -> Any:
            from spark_jobs.session import build_connect_session

            self.check_connect_server(url)
            session = build_connect_session(url, app_name)
            if self._connect_tag:
                session.addTag(self._connect_tag)
            self._connect_session = session
            return session

        return factory

    def release_connect_session(self) -> None:
        """Release this task's session on the server (its cached data and temporary views)."""
        session, self._connect_session = self._connect_session, None
        if session is not None:
            try:
                session.stop()
            except Exception as error:  # the step's result stands; the server drops it later
                self.log.warning("could not release the Spark Connect session: %s", error)

    def interrupt_connect_work(self) -> None:
        """Interrupt the Spark operations of this task's tag on the Connect server."""
        session, tag = self._connect_session, self._connect_tag
        if session is None or not tag:
            return
        try:
            interrupted = session.interruptTag(tag)
            self.log.info("interrupted %d Spark operation(s) tagged %s", len(interrupted), tag)
        except Exception as error:
            self.log.warning("could not interrupt the Spark work tagged %s: %s", tag, error)

    def on_kill(self) -> None:
        """Interrupt this task's Spark work on the Connect server, or kill the spark-submit."""
        if self._connect_session is not None:
            self.interrupt_connect_work()
            self.release_connect_session()
        elif self._hook is not None:
            super().on_kill()


def build_task(plan: DagPlan, task: TaskPlan, config_path: Path) -> CdcStepOperator:
    """One planned task as an operator of the current DAG context."""
    gated = {t.task_id: t.maintenance_schedule for t in plan.tasks if t.is_maintenance}
    return CdcStepOperator(
        # The step that writes final skips the maintenance tasks not due (they all run after it).
        maintenance_after=gated if step_named(task.step).writes_final else None,
        task_id=task.task_id,
        cdc_step=task.step,
        config_path=str(config_path.resolve()),
        maintenance_schedule=task.maintenance_schedule,
        is_maintenance=task.is_maintenance,
        application=str(SPARK_JOBS_DIR / f"{task.step}.py"),
        application_args=list(task.arguments),
        conn_id=plan.conn_id,
        name=f"cdc-{plan.table}-{task.task_id}",
        spark_binary=str(Path(sys.executable).parent / "spark-submit"),
        env_vars=spark_environment(config_path),
        # The jars `make install` fetched (Delta Lake's reader), on spark-submit's driver too.
        jars=",".join(str(j) for j in sorted(JARS_DIR.glob("*.jar"))) or None,
        max_active_tis_per_dag=1,
        trigger_rule="none_failed" if task.is_maintenance else "all_success",
        **task_arguments(plan, task),
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
        **dag_arguments(plan),
    ) as dag:
        operators = {task.task_id: build_task(plan, task, config_path) for task in plan.tasks}
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
    for name, table in sorted(result.tables.items()):
        if wanted is not None and table.dag_id != wanted:
            continue
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
