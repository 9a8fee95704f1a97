"""The step operator under a spark_connect connection, without an Airflow scheduler: the no-op
interval, a server that is down, and on_kill interrupting the task's Spark work on a real server."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from cdc_airflow.backends import ConnectBackend, SparkConnectUnavailableError
from cdc_airflow.connect_server import free_port
from cdc_airflow.dags import CdcStepOperator
from cdc_airflow.local import connect_connection
from cdc_pipeline.jvm import connect_address
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
    assert f"connection 'spark_default' at {dead_server} is not reachable" in message


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
    assert "its log (_delta_log) is damaged; restore the damaged commit file" in message


def test_on_kill_interrupts_the_tasks_spark_work_on_the_server(
    workspace: Workspace, connect_server: Any
) -> None:
    from spark_jobs.session import build_connect_session

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
    from spark_jobs.session import build_connect_session

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

    from cdc_airflow.local import LocalAirflow, spark_connection_from_environment

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
