"""The step operator under a spark_connect connection, without an Airflow scheduler: the no-op
interval, a server that is down, and on_kill interrupting the task's Spark work on a real server."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from cdc_airflow.backends import (
    ConnectBackend,
    SparkConnectUnavailableError,
    StepCall,
    SubmitBackend,
    object_store_environment,
)
from cdc_airflow.local.connect_server import free_port
from cdc_airflow.local.launcher import connect_connection
from cdc_airflow.operator import CdcStepOperator
from cdc_pipeline.jvm import connect_address
from cdc_pipeline.steps import step_named
from tests.helpers import Workspace

ROW = {
    "name": "t",
    "file_format": "csv",
    "columns": {"ID": "bigint", "TS": "timestamp"},
    "keys": ["ID"],
    "sequence_by": ["TS"],
}
START, END = "2024-01-01T00:00:00+00:00", "2024-01-01T01:00:00+00:00"


def operator(ws: Workspace, step: str = "stage") -> CdcStepOperator:
    return CdcStepOperator(
        task_id=step,
        cdc_step=step,
        config_path=str(ws.config_path),
        application=f"spark_jobs/{step}.py",
        application_args=["t", "--start", START, "--end", END],
        conn_id="spark_default",
    )


def context() -> dict[str, Any]:
    return {
        "params": {},
        "run_id": "manual__test",
        "data_interval_start": datetime(2024, 1, 1, tzinfo=UTC),
        "data_interval_end": datetime(2024, 1, 1, 1, tzinfo=UTC),
    }


@pytest.fixture
def dead_server(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> str:
    """spark_default is a spark_connect connection to a port nobody listens on."""
    workspace.configure(ROW)
    port = free_port()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connect_connection(port))
    return f"sc://127.0.0.1:{port}/"


def test_connect_urls_give_host_and_port() -> None:
    assert connect_address("sc://spark-connect:15002/;token=x") == ("spark-connect", 15002)
    assert connect_address("sc://10.0.0.5") == ("10.0.0.5", 15002)
    with pytest.raises(ValueError, match="not a Spark Connect URL: 'spark://h:7077'"):
        connect_address("spark://h:7077")


def test_an_interval_without_landed_or_staged_files_is_a_noop_without_spark(
    workspace: Workspace, dead_server: str
) -> None:
    for step in ("stage", "overwrite_final"):
        result = operator(workspace, step).execute(context())
        prog = step.replace("_", "-")
        window = "[2024-01-01T00:00:00Z, 2024-01-01T01:00:00Z)"
        assert result == {
            "step": prog,
            "table": "t",
            "interval": window,
            "counts": {"noop": "true", "files": 0},
            "line": f"{prog} t {window}: noop=true files=0",
        }


def test_local_roots_ask_for_no_object_store_connection(
    workspace: Workspace, dead_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Landing and warehouse in local folders: the task does not look up `cdc_object_store` (in
    a scheduler, a request to the API server that finds none), so even a connection that would
    fail the task (a key id without its secret) is not read."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_OBJECT_STORE", json.dumps({"conn_type": "aws", "login": "AKIA1"})
    )
    assert operator(workspace).execute(context())["counts"] == {"noop": "true", "files": 0}


def test_a_server_that_is_down_is_a_retryable_error_naming_connection_and_url(
    workspace: Workspace, dead_server: str
) -> None:
    workspace.land("t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    with pytest.raises(SparkConnectUnavailableError) as raised:
        operator(workspace).execute(context())
    # Retryable: an AirflowException, not AirflowFailException (which skips the retries).
    assert isinstance(raised.value, AirflowException)
    assert not isinstance(raised.value, AirflowFailException)
    message = str(raised.value)
    assert (
        f"connection 'spark_default' at {dead_server} is not reachable (Connection refused);"
        in (message)
    )


def test_object_store_credentials_come_from_the_airflow_connection(
    s3_workspace: Workspace, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no AWS variable in the worker, the connection `cdc_object_store` (the amazon
    provider's layout) gives the endpoint, keys and region: the task reads its landing in the
    bucket with them, and the worker's environment is as it was afterwards."""
    s3_workspace.configure(ROW)
    aws = s3_server.environment()
    for name in aws:
        monkeypatch.delenv(name)
    port = free_port()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connect_connection(port))
    connection = {
        "conn_type": "aws",
        "login": aws["AWS_ACCESS_KEY_ID"],
        "password": aws["AWS_SECRET_ACCESS_KEY"],
        "extra": {"endpoint_url": aws["AWS_ENDPOINT_URL"], "region_name": aws["AWS_REGION"]},
    }
    monkeypatch.setenv("AIRFLOW_CONN_CDC_OBJECT_STORE", json.dumps(connection))
    # The hour's landing folder, listed in the bucket: nothing landed, a no-op without Spark.
    task = operator(s3_workspace)
    report = task.execute(context())
    assert report["counts"] == {"noop": "true", "files": 0}
    # The variables stay for the post_execute hooks (the quarantine's reasons and data freshness
    # read the tables; Airflow's task runner calls them between execute and post_execute), and
    # the worker's own environment is back after post_execute.
    assert os.environ.get("AWS_ENDPOINT_URL") == aws["AWS_ENDPOINT_URL"]
    task.post_execute(context(), report)
    assert not [name for name in aws if name in os.environ]
    for name, value in aws.items():
        monkeypatch.setenv(name, value)  # the test's own writes to the bucket
    s3_workspace.land("t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    for name in aws:
        monkeypatch.delenv(name)
    # A file landed: seen through the connection, so the step goes on to Spark (not running).
    with pytest.raises(SparkConnectUnavailableError):
        operator(s3_workspace).execute(context())
    assert not [name for name in aws if name in os.environ]
    # A key id without its secret is a mistake a retry cannot mend: it fails once, naming it.
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_OBJECT_STORE", json.dumps({"conn_type": "aws", "login": "AKIA1"})
    )
    with pytest.raises(AirflowFailException, match="connection 'cdc_object_store': set both"):
        operator(s3_workspace).execute(context())


def test_spark_submit_gets_the_connections_object_store_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """spark-submit's child process gets the connection's variables over the worker's own."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_OBJECT_STORE",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "key",
                "password": "secret",
                "extra": {"endpoint_url": "http://minio:9000", "aws_session_token": "tok"},
            }
        ),
    )
    environment = object_store_environment()
    assert environment == {
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_ALLOW_HTTP": "true",
    }
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", '{"conn_type": "spark", "host": "local"}')
    submitted: list[dict[str, str]] = []

    def submit(hook: Any, application: str) -> None:
        submitted.append(dict(hook._env_vars))

    monkeypatch.setattr("cdc_airflow.backends.SparkSubmitHook.submit", submit)
    backend = SubmitBackend(application="stage.py", name="t", env_vars={"AWS_REGION": "eu-west-1"})
    call = StepCall(step_named("stage"), ("t",), None, "spark_default", "tag", environment)
    backend.run(call)
    (env,) = submitted
    assert {k: v for k, v in env.items() if k.startswith("AWS_")} == {
        **environment,
        "AWS_REGION": "eu-west-1",
    }
    monkeypatch.delenv("AIRFLOW_CONN_CDC_OBJECT_STORE")
    assert object_store_environment() == {}  # no connection: the environment's own apply


def test_a_spark_connection_without_spark_submit_fails_once_saying_what_to_install(
    tmp_path: Path,
) -> None:
    # The light install (pyspark-client only) has no spark-submit beside its Python.
    missing = str(tmp_path / "bin" / "spark-submit")
    backend = SubmitBackend(application="stage.py", name="t", spark_binary=missing)
    call = StepCall(step_named("stage"), ("t",), None, "spark_default", "tag", {})
    with pytest.raises(AirflowFailException) as raised:
        backend.run(call)
    assert "`cdc-lakehouse[spark]`" in str(raised.value) and "spark_connect" in str(raised.value)
    assert backend.hook is None  # nothing submitted


def test_a_damaged_delta_log_fails_once_naming_the_table_without_retries(
    workspace: Workspace, dead_server: str
) -> None:
    workspace.land("t", "2024-01-01T00", "a.csv", [{"FLAG": "I", "ID": 1, "TS": "2024-01-01"}])
    ledger = workspace.paths("t").ledger
    (ledger / "_delta_log").mkdir(parents=True)
    (ledger / "_delta_log" / "00000000000000000000.json").write_text('{"commitInfo": {')
    with pytest.raises(AirflowFailException) as raised:
        operator(workspace).execute(context())
    message = str(raised.value)
    assert message.startswith(f"stage t: the Delta table {ledger} cannot be read (")
    assert "version 0, _delta_log/00000000000000000000.json is damaged. Retrying does not help" in (
        message
    )


def test_on_kill_interrupts_the_tasks_spark_work_on_the_server(
    workspace: Workspace, connect_server: Any
) -> None:
    from spark_jobs.runtime.session import build_connect_session

    op = operator(workspace)
    session = build_connect_session(connect_server.url, "cdc-test")
    backend = ConnectBackend(connect_server.url, session=session, tag="cdc-test-kill")
    op._backend = backend  # as execute leaves it while the step runs
    outcome: dict[str, Any] = {}

    def long_query() -> None:
        session.addTag("cdc-test-kill")  # tags are per thread: the step's thread carries it
        started = time.monotonic()
        try:
            session.range(0, 10**12, 1, 4).selectExpr("sum(id % 7)").collect()
            outcome["error"] = None
        except Exception as error:
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - started

    worker = threading.Thread(target=long_query)
    worker.start()
    time.sleep(5)  # the query is running on the server
    op.on_kill()
    worker.join(timeout=120)
    assert not worker.is_alive()
    # The query (hours of work) ended at once with an error: interrupted, then its channel closed.
    assert outcome["error"] is not None and outcome["seconds"] < 60, outcome
    assert backend.session is None  # released


def test_interrupt_reaches_exactly_the_operations_of_the_tag(connect_server: Any) -> None:
    from spark_jobs.runtime.session import build_connect_session

    session = build_connect_session(connect_server.url, "cdc-test")
    errors: list[str] = []

    def long_query() -> None:
        session.addTag("cdc-tagged")
        try:
            session.range(0, 10**12, 1, 4).selectExpr("sum(id % 7)").collect()
        except Exception as error:
            errors.append(str(error))

    worker = threading.Thread(target=long_query)
    worker.start()
    time.sleep(5)
    assert session.interruptTag("cdc-other") == []
    assert len(session.interruptTag("cdc-tagged")) == 1
    worker.join(timeout=120)
    session.stop()
    assert len(errors) == 1 and "OPERATION_CANCELED" in errors[0], errors


def test_the_local_launcher_makes_spark_default_a_connect_connection_to_its_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    from cdc_airflow.local.launcher import LocalAirflow, spark_connection_from_environment

    local = LocalAirflow(tmp_path, tmp_path / "t.yaml", tmp_path, tmp_path, connect_port=15123)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", local.environment()["AIRFLOW_CONN_SPARK_DEFAULT"]
    )
    assert SparkConnectHook("spark_default").get_connection_url() == "sc://127.0.0.1:15123/"
    # An existing server instead: CDC_SPARK_REMOTE (no local server is started then).
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT")
    monkeypatch.setenv("CDC_SPARK_REMOTE", "sc://spark-connect:15002")
    remote = LocalAirflow(
        tmp_path,
        tmp_path / "t.yaml",
        tmp_path,
        tmp_path,
        spark_connection=spark_connection_from_environment(),
    )
    remote.start_spark()
    assert remote.connect_server is None
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", remote.environment()["AIRFLOW_CONN_SPARK_DEFAULT"]
    )
    assert SparkConnectHook("spark_default").get_connection_url() == "sc://spark-connect:15002/"


def test_a_kafka_tables_broker_comes_from_its_connection_and_nothing_waiting_is_a_noop(
    workspace: Workspace, dead_server: str, kafka_broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row's kafka_conn_id (the Kafka provider's connection: its extra holds the client
    properties) tells the step where the broker is; a topic with nothing unstaged is a no-op
    without Spark; a message waiting goes on to Spark (down here: retried); a broker that does
    not answer is retried; a missing topic fails once."""
    from tests.kafka import free_port as free_kafka_port

    topic = "orders-op"
    kafka_broker.create_topic(topic, 2)
    row = {**ROW, "file_format": "json", "source": "kafka", "topic": topic}
    row.update(kafka_conn_id="kafka_orders", starting_offsets="latest")
    workspace.configure(row)
    monkeypatch.delenv("CDC_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    extra = {"bootstrap.servers": kafka_broker.bootstrap_servers}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_ORDERS", json.dumps({"conn_type": "kafka", "extra": extra})
    )

    def kafka_operator(step: str = "stage") -> CdcStepOperator:
        task = operator(workspace, step)
        task.kafka_conn_id = "kafka_orders"
        return task

    # A first run with starting_offsets latest and no staging: it records where it starts.
    with pytest.raises(SparkConnectUnavailableError):
        kafka_operator().execute(context())
    assert "CDC_KAFKA_BOOTSTRAP_SERVERS" not in os.environ  # the worker's environment is back
    unreachable = {"bootstrap.servers": f"127.0.0.1:{free_kafka_port()}"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_ORDERS", json.dumps({"conn_type": "kafka", "extra": unreachable})
    )
    with pytest.raises(AirflowException) as raised:
        kafka_operator().execute(context())
    assert not isinstance(raised.value, AirflowFailException)
    assert f"Kafka topic '{topic}' at {unreachable['bootstrap.servers']} is not reachable" in str(
        raised.value
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_ORDERS", json.dumps({"conn_type": "kafka", "extra": extra})
    )
    workspace.configure({**row, "topic": "no-such-topic"})
    with pytest.raises(AirflowFailException, match=r"'no-such-topic' at .* does not exist"):
        kafka_operator().execute(context())


def test_a_kafka_connection_gives_the_steps_client_properties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cdc_airflow.backends import kafka_environment

    assert kafka_environment("kafka_absent") == {}
    connection = {
        "conn_type": "kafka",
        "host": "b1",
        "port": 9093,
        "login": "cdc",
        "password": "secret",
        "extra": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_X", json.dumps(connection))
    assert kafka_environment("kafka_x") == {
        "CDC_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "CDC_KAFKA_SASL_MECHANISM": "PLAIN",
        "CDC_KAFKA_BOOTSTRAP_SERVERS": "b1:9093",
        "CDC_KAFKA_SASL_USERNAME": "cdc",
        "CDC_KAFKA_SASL_PASSWORD": "secret",
    }


def test_a_noop_stage_still_counts_files_outside_the_window(
    workspace: Workspace, dead_server: str
) -> None:
    """Nothing to stage in the window, but a file waits in an older hour: the no-op's counts say
    so (without Spark), so the stage task's alert fires on every run while it waits."""
    workspace.configure({**ROW, "late_arrival_window": "1h"})
    workspace.land("t", "2023-12-31T20", "old.csv", [{"FLAG": "I", "ID": 1, "TS": "2023-12-31"}])
    result = operator(workspace).execute(context())
    assert result["counts"] == {"noop": "true", "files": 0, "files_outside_window": 1}
