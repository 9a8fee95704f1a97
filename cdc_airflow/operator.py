"""The operator of every CDC task: one step, run as the task's Spark connection says.

Imports Airflow; Spark and delta-rs only inside a running task. `cdc_airflow.dags` builds the
DAGs out of it; the steps it runs ship in `spark_jobs` (found without importing it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
from airflow.sdk import (
    BaseHook,
    BaseOperator,
    Context,
    SkipMixin,
)
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from cdc_airflow.backends import (
    OBJECT_STORE_CONN_ID,
    Backend,
    ConnectBackend,
    StepCall,
    SubmitBackend,
    environment_applied,
    kafka_environment,
    object_store_environment,
)
from cdc_airflow.lineage import StepLineage, run_lineage
from cdc_airflow.metrics import send_failure, send_step_metrics
from cdc_airflow.operations import (
    QuarantineBreach,
    quarantine_breach,
)
from cdc_pipeline.jvm import utf8_locale
from cdc_pipeline.planning import INTERVAL_END, INTERVAL_START, is_due, with_interval
from cdc_pipeline.steps import (
    ERROR_XCOM,
    QUARANTINE_BREACH_PREFIX,
    QUARANTINE_TASK_ID,
    step_named,
)


def package_dir(name: str) -> Path:
    """Where an installed package's modules are (found without importing it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the package {name} is not installed in the Python running Airflow")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


# The steps' programs spark-submit runs, and Spark's logging set-up, ship in the package.
SPARK_JOBS_DIR = package_dir("spark_jobs")
LOG4J_OPTION = f"-Dlog4j2.configurationFile=file:{SPARK_JOBS_DIR / 'log4j2.properties'}"


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


def run_interval(context: Context) -> tuple[datetime, datetime]:
    """The run's data interval (FillRunInterval gave one to a run triggered without it)."""
    start, end = context["data_interval_start"], context["data_interval_end"]
    if start is None or end is None:
        raise AirflowFailException("the run has no data interval; trigger it with a logical date")
    return start, end


# Fields of a task the dag-processor's serialization of its DAG leaves out, as Airflow does the
# on_*_callback ones (the task process runs the task from the DAG file it parses, never from
# the serialized DAG):
# - the pre_execute and post_execute hooks (operations.FillRunInterval, QuarantineCheck,
#   PublishCounts): Airflow stores a callable as its source text, found by
#   `inspect.getsource` at every parse (about 0.7 ms a task), which the scheduler never runs;
# - `params`, which the serialization sets itself afterwards (`_serialize_params_dict`): in
#   the generic pass each task's params were compared with the default and turned into text,
#   both by validating every Param's JSON schema (about 0.5 ms each), the text then replaced.
# A 65-table DAG file's parse: 1.39 -> 0.62 CPU-s in the dag-processor's child, its result
# 872 -> 501 kB, the serialized tasks otherwise the same (tests/dags/test_dags.py).
NOT_SERIALIZED = frozenset({"_pre_execute_hook", "_post_execute_hook", "params"})


class CdcStepOperator(BaseOperator, SkipMixin):
    """One CDC step, run as the task's Spark connection says; maintenance skips when not due.

    The task whose step `writes_final` (overwrite_final) also marks every maintenance task that is
    not due as skipped when it succeeds, so a run starts no task process for them (a 65-table
    cycle saves 4 task starts per table). Each maintenance task still checks its cadence
    itself, for runs cleared or triggered task by task.

    The connection's type picks the backend (cdc_airflow.backends): `spark_connect` runs the step
    in this task process as a client of the server; `spark` spark-submits the step's module.
    The object store's credentials come from the worker's environment or, when it exists, the
    connection `object_store_conn_id` (`cdc_object_store`), looked up only when the step may
    use object storage (with Spark Connect: when `CDC_LANDING` or `CDC_WAREHOUSE` is one, so a
    local deployment's task asks the API server for no connection); a Kafka table's client settings
    from the connection `kafka_conn_id` (or the worker's CDC_KAFKA_* variables without one).
    Either way the summary line is logged and the counts are returned (so, pushed to XCom). An
    interval with no landed file and no staged batch is a no-op reported without any Spark.
    Each try sends its metrics through Airflow's Stats (cdc_airflow.metrics): the counts, the
    table's freshness by data after the step that writes final, the duration, or a failure.
    """

    # No template fields: an interval step's arguments get the run's interval in `step_call`,
    # so Airflow neither renders nor stores (a request to the API server) anything per task.
    template_fields: Sequence[str] = ()

    @classmethod
    def get_serialized_fields(cls) -> frozenset[str]:
        """Airflow's serialized fields of an operator but NOT_SERIALIZED (see there)."""
        return frozenset(super().get_serialized_fields() - NOT_SERIALIZED)

    def __init__(
        self,
        *,
        cdc_step: str,
        application: str,
        application_args: Sequence[str] = (),
        table: str | None = None,
        conn_id: str = "spark_default",
        object_store_conn_id: str = OBJECT_STORE_CONN_ID,
        kafka_conn_id: str | None = None,
        name: str = "cdc",
        config_path: str | None = None,
        maintenance_schedule: str | None = None,
        is_maintenance: bool = False,
        maintenance_after: dict[str, str | None] | None = None,
        spark_binary: str | None = None,
        env_vars: dict[str, str] | None = None,
        jars: str | None = None,
        conf: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cdc_step = cdc_step
        self.application = application
        self.application_args = list(application_args)
        # The metrics' tag: the table, the steps' first argument unless given.
        self.table = table or (self.application_args[0] if self.application_args else "")
        self.conn_id = conn_id
        self.object_store_conn_id = object_store_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.config_path = config_path
        self.maintenance_after = maintenance_after or {}
        self.maintenance_schedule = maintenance_schedule
        self.is_maintenance = is_maintenance
        self.submit = SubmitBackend(
            application=application,
            name=name,
            spark_binary=spark_binary,
            env_vars=env_vars or {},
            jars=jars,
            # The driver JVM starts with the steps' quiet log settings and without PySpark's
            # per-column call-site capture (static settings: a session cannot set them).
            conf={
                "spark.driver.extraJavaOptions": LOG4J_OPTION,
                "spark.python.sql.dataFrameDebugging.enabled": "false",
                **(conf or {}),
            },
        )
        self._backend: Backend | None = None
        self._cdc_report: dict[str, Any] = {}
        # The object store's variables from the connection, applied from execute until
        # post_execute: the step and the post_execute hooks that read the tables (the
        # quarantine's reasons, data freshness) use them; then the worker's own are back.
        self._object_store_env: dict[str, str] = {}
        self._applied = ExitStack()
        # Freshness by data measured after the step that writes final (its metrics), which the
        # stale-data alert (a post_execute hook) reads instead of measuring again.
        self.data_freshness: Any = None
        self._lineage: StepLineage | None = None  # what the run read and wrote, for OpenLineage

    def execute(self, context: Context) -> dict[str, Any] | None:
        breach = None
        if step_named(self.cdc_step).fails_on_quarantine_breach:
            breach = quarantine_breach(context, QUARANTINE_TASK_ID)
        report = None
        if not self.is_maintenance or self.is_due(context):
            report = self.run_step(context)
        elif breach is None:
            start, end = run_interval(context)
            raise AirflowSkipException(
                f"{self.task_id} is not due in [{start}, {end}) (cadence {self.maintenance_schedule}); "
                "trigger with force_maintenance=true to run it now"
            )
        if breach is not None:
            failure = QuarantineBreach(f"{QUARANTINE_BREACH_PREFIX}: {breach}")
            self.record_failure(context, failure)
            raise failure
        return report

    def is_due(self, context: Context) -> bool:
        """A maintenance task's cadence has a boundary in the run's interval, or it is forced."""
        start, end = run_interval(context)
        forced = bool(context["params"].get("force_maintenance"))
        return forced or is_due(self.maintenance_schedule, start, end)

    def run_step(self, context: Context) -> dict[str, Any]:
        """Run the step through the backend: its report (the summary line and the counts)."""
        self._backend = self.backend()
        started = time.monotonic()
        try:
            self._object_store_env = (
                object_store_environment(self.object_store_conn_id)
                if self._backend.may_use_object_store()
                else {}
            )
            if self.kafka_conn_id is not None:
                self._object_store_env.update(kafka_environment(self.kafka_conn_id))
            self._applied.enter_context(environment_applied(self._object_store_env))
            report = self._backend.run(self.step_call(context))
        except Exception as error:
            self._applied.close()
            self.record_failure(context, error)
            send_failure(self.cdc_step, self.table)
            raise
        self.log.info("CDC summary: %s", report.get("line", "(none written)"))
        self._cdc_report = report
        # The object store's variables are still applied: freshness reads the table's folders.
        self.data_freshness = send_step_metrics(
            self.cdc_step, self.table, report, time.monotonic() - started, self.config_path
        )
        self._lineage = run_lineage(self.cdc_step, self.table, self.config_path, report)
        return report

    def record_failure(self, context: Context, error: BaseException) -> None:
        """Keep the failure's one line as this try's XCom `cdc_error` (the CDC tables view shows
        it next to the failed task); never hides the failure itself."""
        from spark_jobs.runtime.failures import one_line

        text = str(error).strip()
        # The backends' own errors are one line already; anything else gets its kind.
        line = text.splitlines()[0] if isinstance(error, AirflowException) and text else None
        try:
            context["ti"].xcom_push(key=ERROR_XCOM, value=line or one_line(error))
        except Exception as push_error:
            self.log.warning("could not record the failure's reason: %s", push_error)

    def backend(self) -> Backend:
        """The Connect backend for a `spark_connect` connection, else spark-submit."""
        connection = BaseHook.get_connection(self.conn_id)
        if connection.conn_type == SparkConnectHook.conn_type:
            return ConnectBackend(SparkConnectHook(self.conn_id).get_connection_url())
        return self.submit

    def step_call(self, context: Context) -> StepCall:
        """This try's step: its arguments with the run's interval, and a tag naming its Spark
        work."""
        ti = context.get("ti")
        run = getattr(ti, "run_id", None) or context.get("run_id") or "run"
        # One tag per task try: on_kill interrupts exactly this task's Spark operations.
        tag = f"cdc-{self.dag_id}-{self.task_id}-{run}-{getattr(ti, 'try_number', 0)}"
        arguments = tuple(self.application_args)
        if INTERVAL_START in arguments or INTERVAL_END in arguments:
            arguments = with_interval(arguments, *run_interval(context))
        return StepCall(
            step=step_named(self.cdc_step),
            arguments=arguments,
            config_path=Path(self.config_path) if self.config_path else None,
            conn_id=self.conn_id,
            tag=re.sub(r"[^A-Za-z0-9_.:-]", "_", tag),
            environment=self._object_store_env,
        )

    def post_execute(self, context: Context, result: Any = None) -> None:
        """After the post_execute hooks (the asset event's counts): the maintenance gate.

        Here rather than in execute: skipping ends the task (Airflow's DownstreamTasksSkipped, a
        success), and raised from execute it would also skip the post_execute hooks.
        """
        self._applied.close()  # the post_execute hooks ran before this method
        super().post_execute(context, result)
        if self.maintenance_after:
            self.skip_maintenance_not_due(context, self._cdc_report)

    def skip_maintenance_not_due(self, context: Context, report: dict[str, Any]) -> None:
        """Mark the maintenance tasks that are not due in this run's interval as skipped.

        Skipping ends the task (Airflow's DownstreamTasksSkipped, a success) before Airflow
        pushes the return value, so the report is pushed to XCom here.
        """
        if context["params"].get("force_maintenance"):
            return
        start, end = run_interval(context)
        breach = quarantine_breach(context, QUARANTINE_TASK_ID) is not None
        not_due = [
            task_id
            for task_id, schedule in self.maintenance_after.items()
            if not is_due(schedule, start, end)
            # the task that fails on a breach runs to show it (task ids are step modules)
            and not (breach and step_named(task_id).fails_on_quarantine_breach)
        ]
        if not not_due:
            return
        ti = context["ti"]
        ti.xcom_push(key="return_value", value=report)
        self.log.info("not due in [%s, %s): %s", start, end, ", ".join(not_due))
        self.skip(ti, [self.dag.get_task(task_id) for task_id in not_due])

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The run's OpenLineage inputs and outputs (cdc_airflow.lineage, read by execute), which
        the OpenLineage provider's listener sends when the task succeeds."""
        from cdc_airflow.lineage import operator_lineage

        return operator_lineage(self._lineage)

    def on_kill(self) -> None:
        """Interrupt this task's Spark work on the Connect server, or kill the spark-submit."""
        if self._backend is not None:
            self._backend.kill()
