"""Where a step runs for the Airflow operator, one backend per kind of Spark connection (as the
Spark provider keeps one code path per deploy mode):

- `ConnectBackend` (a `spark_connect` connection): the step in the task process, as a Spark
  Connect client of the server, through the same step functions as the `cdc` command. Its Spark
  work carries the task try's tag, which `kill` interrupts on the server.
- `SubmitBackend` (a `spark` connection): spark-submit of the step's module through the
  provider's `SparkSubmitHook`; the module writes its counts to a JSON file the backend reads.

Both return the step's summary as plain data (the task's XCom; the operator logs its line once)
and leave the worker's environment as they found it (spark-submit's child gets its own; the
Connect backend sets the object store's variables of the call only while the step runs).

Object storage credentials come from the environment, or from the Airflow connection
`cdc_object_store` when it exists (`object_store_environment`), never from the config table.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
)

from cdc_pipeline.errors import (
    PERMANENT_ERRORS,
    ConfigError,
    SourceUnavailableError,
    SparkUnavailableError,
)
from cdc_pipeline.jvm import connect_address
from cdc_pipeline.steps import Step

if TYPE_CHECKING:
    from spark_jobs.runtime.entry import StepPlan

log = logging.getLogger(__name__)
OBJECT_STORE_CONN_ID = "cdc_object_store"


class SparkConnectUnavailableError(AirflowException):
    """The Spark Connect server of the task's connection does not answer; the task retries."""


@dataclass(frozen=True)
class StepCall:
    """One task try's step: which step, its rendered arguments, the config it was built from."""

    step: Step
    arguments: tuple[str, ...]
    config_path: Path | None
    conn_id: str
    tag: str  # names this try's Spark work (Connect: what `kill` interrupts)
    # The object store's AWS variables from an Airflow connection, over the worker's own.
    environment: Mapping[str, str] = field(default_factory=dict)


class Backend(Protocol):
    """Runs a step call and returns its summary; `kill` stops what it started."""

    def run(self, call: StepCall) -> dict[str, Any]: ...

    def kill(self) -> None: ...

    def may_use_object_store(self) -> bool:
        """Whether the step may read or write object storage: else the object store's connection
        is not looked up (in a task, a request to the API server that finds none)."""
        ...


def roots_on_object_store() -> bool:
    """Whether this process's landing or warehouse root (`CDC_LANDING`, `CDC_WAREHOUSE`) is in
    object storage; True also when one cannot be read (the step then says what is wrong)."""
    from cdc_pipeline.errors import UsageError
    from cdc_pipeline.paths import landing_root, warehouse_root
    from spark_jobs.runtime.storage import is_local

    try:
        return not all(is_local(root) for root in (landing_root(), warehouse_root()))
    except (UsageError, OSError):  # a root of another scheme; no working directory
        return True


def object_store_environment(conn_id: str = OBJECT_STORE_CONN_ID) -> dict[str, str]:
    """The AWS variables the steps, delta-rs and S3A read, from the Airflow connection `conn_id`
    (type `aws`), resolved by the amazon provider's `AwsBaseHook` as any AWS operator's would be:
    a key pair (login = access key id, password = secret access key, extra `aws_session_token`),
    an extra `profile_name` (the worker's shared credentials/config files), an extra `role_arn`
    (assumed with `assume_role_method` `assume_role`, the default, `assume_role_with_saml` or
    `assume_role_with_web_identity`, from the key pair, the profile or the worker's own
    credentials) become the frozen credentials of that moment (an assumed role's session
    credentials: one step's worth); extra `region_name`, and `endpoint_url` (or the `s3` entry
    of `service_config`) for an S3-compatible server, `http://` allowing plain http.

    Empty when the connection does not exist (the environment's own variables, or the machine's
    role, apply); a connection that names no credentials (a region or an endpoint only) leaves
    them to the worker's environment or role too. A half-filled key pair, a missing profile or
    no credentials found fail the task once; STS refusing or unreachable is retried."""
    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    login, password = connection.login or "", connection.password or ""
    if bool(login) != bool(password):
        raise AirflowFailException(
            f"connection '{conn_id}': set both the access key id (login) and the secret access "
            "key (password), or neither (the environment's or the machine role's credentials)"
        )
    # Imported here: boto3 is not needed to parse the DAG files.
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    from botocore.exceptions import BotoCoreError, ClientError, ProfileNotFound

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    config = hook.conn_config
    found = {
        "AWS_REGION": config.region_name or "",
        "AWS_ENDPOINT_URL": config.get_service_endpoint_url("s3") or "",
    }
    if config.aws_access_key_id or config.role_arn or config.profile_name:
        try:
            credentials = hook.get_credentials(region_name=config.region_name)
        except ProfileNotFound as error:
            raise AirflowFailException(f"connection '{conn_id}': {error}") from error
        except (BotoCoreError, ClientError) as error:  # e.g. STS refused or did not answer
            raise AirflowException(
                f"connection '{conn_id}': no AWS credentials from it ({error})"
            ) from error
        except AttributeError as error:  # boto3 found no credentials at all (None)
            raise AirflowFailException(
                f"connection '{conn_id}': no AWS credentials found for it"
            ) from error
        found["AWS_ACCESS_KEY_ID"] = credentials.access_key or ""
        found["AWS_SECRET_ACCESS_KEY"] = credentials.secret_key or ""
        found["AWS_SESSION_TOKEN"] = credentials.token or ""
    if found["AWS_ENDPOINT_URL"].lower().startswith("http://"):
        found["AWS_ALLOW_HTTP"] = "true"
    return {name: value for name, value in found.items() if value}


def kafka_environment(conn_id: str) -> dict[str, str]:
    """A Kafka table's client settings as the step reads them (`CDC_KAFKA_<PROPERTY>`), from
    the Airflow connection `conn_id` of the Kafka provider's type: its extra holds the client
    properties (`bootstrap.servers`, `security.protocol`, `sasl.*`, ...); a host[:port] stands
    for bootstrap.servers when the extra has none. Empty when the connection does not exist
    (the worker's own CDC_KAFKA_* variables apply)."""
    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return {}
    properties = {str(k): str(v) for k, v in connection.extra_dejson.items() if v is not None}
    if "bootstrap.servers" not in properties and connection.host:
        host = connection.host + (f":{connection.port}" if connection.port else "")
        properties["bootstrap.servers"] = host
    if connection.login and "sasl.username" not in properties:
        properties["sasl.username"] = connection.login
    if connection.password and "sasl.password" not in properties:
        properties["sasl.password"] = connection.password
    return {"CDC_KAFKA_" + k.upper().replace(".", "_"): v for k, v in properties.items()}


@contextmanager
def environment_applied(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ while the block runs (the step reads its S3 settings there), then
    the worker's own values back."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def permanent(call: StepCall, error: BaseException) -> AirflowFailException:
    """A failure a retry would repeat (bad config or arguments, a damaged table): fail once."""
    table = call.arguments[0] if call.arguments else ""
    return AirflowFailException(f"{call.step.name} {table}".rstrip() + f": {error}")


@dataclass
class ConnectBackend:
    """The step in this process as a Spark Connect client of `url`."""

    url: str
    session: Any = None  # the step's session while it runs (what `kill` interrupts)
    tag: str | None = None

    def may_use_object_store(self) -> bool:
        """The step runs in this process: its roots are this environment's."""
        return roots_on_object_store()

    def run(self, call: StepCall) -> dict[str, Any]:
        self.tag = call.tag
        with environment_applied(call.environment):
            try:
                return self.run_step(call)
            except AirflowException:
                raise
            except SparkUnavailableError as error:  # down when the step's session started
                raise self.unreachable(call.conn_id, error.reason) from error
            except SourceUnavailableError as error:  # a Kafka broker: transient, retried
                table = call.arguments[0] if call.arguments else ""
                raise AirflowException(f"{call.step.name} {table}: {error}") from error
            except Exception as error:
                from spark_jobs.runtime.failures import NOTHING_PAST, connect_server_lost

                lost = connect_server_lost(error)
                if lost is None:
                    raise
                table = call.arguments[0] if call.arguments and call.step.kind != "tables" else ""
                raise SparkConnectUnavailableError(
                    f"{call.step.name} {table}".rstrip() + f": the Spark Connect server of "
                    f"connection '{call.conn_id}' at {self.url} restarted or stopped answering "
                    f"during the step ({lost}); {NOTHING_PAST}: the task retries"
                ) from error

    def unreachable(self, conn_id: str, reason: str) -> SparkConnectUnavailableError:
        return SparkConnectUnavailableError(
            f"Spark Connect server of connection '{conn_id}' at {self.url} is not reachable "
            f"({reason}); start it (make airflow starts one) or fix the connection"
        )

    def run_step(self, call: StepCall) -> dict[str, Any]:
        if call.step.kind == "tables":  # check: its own arguments, one line per table
            return self.run_check(call)
        from spark_jobs import delta
        from spark_jobs.runtime.args import parse_step_args
        from spark_jobs.runtime.entry import load_body, perform, plan_step
        from spark_jobs.runtime.report import summary_payload

        # One step's tables: the ledger and applied the no-op test read go on to the step.
        with delta.reusing_tables():
            try:  # parsed and checked once: the no-op test and the step get the same plan
                plan = plan_step(
                    parse_step_args(call.step, call.arguments, call.config_path), call.step.name
                )
                noop = self.noop_report(call, plan)
            except PERMANENT_ERRORS as error:
                raise permanent(call, error) from error
            if noop is not None:
                return noop
            factory = self.session_factory(call.conn_id) if call.step.needs_spark else None
            with self.holding_session():
                try:
                    report = perform(plan, load_body(call.step), factory)
                except PERMANENT_ERRORS as error:
                    raise permanent(call, error) from error
        return summary_payload(report)

    def noop_report(self, call: StepCall, plan: StepPlan) -> dict[str, Any] | None:
        """The no-op report of an interval step with no landed file and no staged batch."""
        interval = plan.args.interval
        if call.step.kind != "interval" or interval is None:
            return None
        from spark_jobs.runtime.report import noop_report, summary_payload
        from spark_jobs.status.pending_work import idle_outside

        # Files outside the window are counted on a no-op stage too: its alert fires on every
        # run while any remain.
        stage = call.step.name == "stage"
        outside = idle_outside(plan.paths, plan.table, interval, count_outside=stage)
        if outside is None:
            return None
        report = noop_report(call.step.name, plan.table.name, interval)
        if outside:
            report.result.files_outside_window = outside
        return summary_payload(report)

    def run_check(self, call: StepCall) -> dict[str, Any]:
        """`check [TABLE ...]`: one line per table; a breach fails the task (retried: a rerun
        after the run that repairs it passes)."""
        import argparse

        from spark_jobs.check import check_report, run_check, select_tables
        from spark_jobs.runtime.args import add_check_arguments
        from spark_jobs.runtime.report import summary_payload

        parser = argparse.ArgumentParser(prog="check")
        add_check_arguments(parser)
        namespace = parser.parse_args(list(call.arguments))
        try:
            tables = select_tables(getattr(namespace, "config", call.config_path), namespace.tables)
        except ConfigError as error:
            raise permanent(call, error) from error
        with self.holding_session():
            results = run_check(self.session_factory(call.conn_id)("cdc-check"), tables)
        for result in results:
            log.info("%s", result.line())
        report = check_report(results)
        if report.result.breached:
            raise AirflowException(f"check: {report.line()}; the breaches are logged above")
        return summary_payload(report)

    def check_server(self, conn_id: str) -> None:
        """Raise a retryable error naming the connection and URL when the server is down.

        The Connect client itself would retry a refused connection for minutes before failing.
        """
        host, port = connect_address(self.url)
        try:
            socket.create_connection((host, port), timeout=10).close()
        except OSError as error:
            raise self.unreachable(conn_id, str(error.strerror or error)) from error

    def session_factory(self, conn_id: str) -> Callable[[str], Any]:
        """A function giving this try's tagged Connect session; refuses a server that is down."""

        def factory(app_name: str) -> Any:
            from spark_jobs.runtime.session import build_connect_session

            self.check_server(conn_id)
            session = build_connect_session(self.url, app_name)
            if self.tag:
                session.addTag(self.tag)
            self.session = session
            return session

        return factory

    @contextmanager
    def holding_session(self) -> Iterator[None]:
        """Release the step's session when it ends; interrupt its work first when it did not end
        normally (a timeout or kill raised inside a Spark call: the server may still run it)."""
        try:
            yield
        except BaseException:
            self.interrupt()
            raise
        finally:
            self.release()

    def release(self) -> None:
        """Release the session on the server (its cached data and temporary views)."""
        session, self.session = self.session, None
        if session is not None:
            try:
                session.stop()
            except Exception as error:  # the step's result stands; the server drops it later
                log.warning("could not release the Spark Connect session: %s", error)

    def interrupt(self) -> None:
        """Interrupt the Spark operations of this try's tag on the server."""
        session, tag = self.session, self.tag
        if session is None or not tag:
            return
        try:
            interrupted = session.interruptTag(tag)
            log.info("interrupted %d Spark operation(s) tagged %s", len(interrupted), tag)
        except Exception as error:
            log.warning("could not interrupt the Spark work tagged %s: %s", tag, error)

    def kill(self) -> None:
        self.interrupt()
        self.release()


@dataclass
class SubmitBackend:
    """spark-submit of the step's module (`application`) through the provider's hook."""

    application: str
    name: str
    spark_binary: str | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)
    jars: str | None = None
    conf: Mapping[str, Any] = field(default_factory=dict)
    hook: SparkSubmitHook | None = None

    def may_use_object_store(self) -> bool:
        """Always: the submitted driver may get its roots from `env_vars` or the cluster."""
        return True

    def run(self, call: StepCall) -> dict[str, Any]:
        if (
            self.spark_binary
            and os.sep in self.spark_binary
            and not Path(self.spark_binary).exists()
        ):
            # The light install (pyspark-client only) has no spark-submit and no Spark jars.
            raise AirflowFailException(
                f"{call.step.name}: connection {call.conn_id!r} runs spark-submit, and "
                f"{self.spark_binary} does not exist (this install has only the Spark Connect "
                "client): install `cdc-lakehouse[spark]` on the workers, or make the connection "
                "a `spark_connect` one"
            )
        with summary_file() as summary:
            self.hook = SparkSubmitHook(
                conf=dict(self.conf),
                conn_id=call.conn_id,
                jars=self.jars,
                name=self.name,
                application_args=list(call.arguments),
                env_vars={
                    **self.env_vars,
                    **call.environment,
                    "CDC_SUMMARY_PATH": str(summary),
                },
                spark_binary=self.spark_binary,
            )
            try:
                self.hook.submit(self.application)
            except AirflowException as error:
                raise submit_failure(call, summary, error) from error
            report: dict[str, Any] = json.loads(summary.read_text()) if summary.exists() else {}
        return report

    def kill(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()


def submit_failure(call: StepCall, summary: Path, error: AirflowException) -> AirflowException:
    """The task's error for a failed spark-submit: the step's own one line (it wrote it to the
    summary file), failing once when a retry would fail the same way; else the exit code (the
    hook's own text is the whole command line)."""
    try:
        written = json.loads(summary.read_text())
    except (OSError, ValueError):
        written = {}
    if isinstance(written, dict) and written.get("error"):
        kind = AirflowFailException if written.get("permanent") else AirflowException
        return kind(str(written["error"]))
    code = re.search(r"Error code is: (-?\d+)", str(error))
    return AirflowException(
        f"{call.step.name}: spark-submit exited with {code.group(1) if code else 'an error'}; "
        "its output is in the log above"
    )


@contextmanager
def summary_file() -> Iterator[Path]:
    """A path in a fresh private folder for the step's JSON summary, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="cdc-summary-") as folder:
        yield Path(folder) / "summary.json"
